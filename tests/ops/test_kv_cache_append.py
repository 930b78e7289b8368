"""kv_cache_append: rows written in place, overflow refused before any write, strided operands, opcheck, errors."""
import pytest
import torch

import pytransformer as pt
from tests.helpers import (CPU_ISA_LEVELS, TRACING_ERROR, WHERE, caches, compiled, randn, run_under_isa,
                           skip_unsupported, to_meta)
from pytransformer import check as kc

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
ops = torch.ops.pytransformer


@pytest.mark.parametrize("dtype", DTYPES)
def test_kv_cache_append_writes_rows(device, dtype):
    skip_unsupported(dtype, device)
    k_cache, v_cache = caches(3, 2, 20, 8, 5, dtype, device)
    k_new, v_new = randn(3, 2, 4, 8, dtype=dtype, device=device), randn(3, 2, 4, 5, dtype=dtype, device=device)
    positions = torch.tensor([0, 16, 7], device=device)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for b, p in enumerate(positions.tolist()):
        expected_k[b, :, p:p + 4], expected_v[b, :, p:p + 4] = k_new[b], v_new[b]
    assert pt.ops.kv_cache_append(k_cache, v_cache, k_new, v_new, positions) is None
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)
    pt.ops.kv_cache_append(k_cache, v_cache, k_new[:, :, :0], v_new[:, :, :0], torch.full((3,), 20, device=device))
    assert torch.equal(k_cache, expected_k)  # T = 0 writes nothing, even at the end of the cache


@pytest.mark.parametrize("positions", [[0, 17], [-1, 0], [30, 0]])
def test_append_overflow_raises_and_leaves_cache_unchanged(device, positions):
    k_cache, v_cache = caches(2, 2, 20, 8, 8, torch.float32, device)
    before = k_cache.clone(), v_cache.clone()
    k_new, v_new = randn(2, 2, 4, 8, device=device), randn(2, 2, 4, 8, device=device)
    with pytest.raises(ValueError, match="positions"):
        pt.ops.kv_cache_append(k_cache, v_cache, k_new, v_new, torch.tensor(positions, device=device))
    assert torch.equal(k_cache.view(torch.int32), before[0].view(torch.int32))
    assert torch.equal(v_cache.view(torch.int32), before[1].view(torch.int32))


@pytest.mark.parametrize("meta", [False, True])
def test_max_position_bound(device, meta):
    # A host-side bound of the positions: checked against the capacity before anything is written (the CUDA glue then
    # reads nothing back); a bad type is a TypeError naming it.
    k_cache, v_cache = caches(2, 2, 20, 8, 8, torch.float32, device)
    k_new, v_new = randn(2, 2, 4, 8, device=device), randn(2, 2, 4, 8, device=device)
    positions = torch.tensor([3, 16], device=device)
    args = [k_cache, v_cache, k_new, v_new, positions]
    if meta:
        args = list(to_meta(args))
    else:
        expected = k_cache.clone()
        expected[0, :, 3:7], expected[1, :, 16:20] = k_new[0], k_new[1]
    pt.ops.kv_cache_append(*args, max_position=16)
    if not meta:
        assert torch.equal(k_cache, expected)
    before = args[0].clone()
    for bad in (17, -1):
        with pytest.raises(ValueError, match="max_position"):
            pt.ops.kv_cache_append(*args, max_position=bad)
    if not meta:
        assert torch.equal(k_cache, before)
    with pytest.raises(TypeError, match="max_position"):
        pt.ops.kv_cache_append(*args, max_position=16.0)


def test_strided_operands(device):
    # Caches laid out [B, capacity, Hkv, D] and viewed as [B, Hkv, capacity, D]; values with a strided last dim.
    b, hkv, cap, d = 2, 2, 40, 16
    k_cache = randn(b, cap, hkv, d, device=device).transpose(1, 2)
    v_cache = randn(b, hkv, cap, 2 * d, device=device)[..., ::2]
    k_new = randn(b, 3, hkv, d, device=device).transpose(1, 2)  # [B, Hkv, 3, D], strided
    v_new = randn(b, hkv, d, 3, device=device).transpose(2, 3)  # last dim strided
    positions = torch.tensor([[5, 0], [30, 0]], device=device)[:, 0]  # strided index vector
    k_ref, v_ref = k_cache.contiguous(), v_cache.contiguous()
    pt.ops.kv_cache_append(k_cache, v_cache, k_new, v_new, positions)
    pt.ops.kv_cache_append(k_ref, v_ref, k_new.contiguous(), v_new.contiguous(), positions.contiguous())
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("isa", CPU_ISA_LEVELS)
def test_each_cpu_isa_level_writes_rows(isa):
    """The kernel is compiled per ISA level: at the levels below this processor's, rows of 2-, 4- and 8-byte elements
    (one block copy) and strided operands (a copy per row, and per element)."""
    run_under_isa(isa, "from tests.ops import test_kv_cache_append as t\n"
                       "for dtype in t.DTYPES: t.test_kv_cache_append_writes_rows('cpu', dtype)\n"
                       "t.test_strided_operands('cpu')")


def test_opcheck(device):
    k, v = caches(2, 2, 12, 16, 8, torch.float32, device)
    k_new, v_new = randn(2, 2, 3, 16, device=device), randn(2, 2, 3, 8, device=device)
    torch.library.opcheck(ops.kv_cache_append, (k, v, k_new, v_new, torch.tensor([0, 9], device=device)))


def test_schema_declares_the_cache_mutation():
    args = ops.kv_cache_append.default._schema.arguments
    assert [a.name for a in args if a.alias_info is not None and a.alias_info.is_write] == ["k_cache", "v_cache"]


def test_requires_grad_inputs_record_no_graph():
    """An inference op: it runs on new keys that require grad and the cache records no graph."""
    k_cache, v_cache = caches(1, 2, 10, 8, 8, torch.float32, "cpu")
    k_new, v_new = randn(1, 2, 1, 8).requires_grad_(True), randn(1, 2, 1, 8).requires_grad_(True)
    pt.ops.kv_cache_append(k_cache, v_cache, k_new, v_new, torch.tensor([3]))
    assert not k_cache.requires_grad and k_cache.grad_fn is None


def test_append_bumps_the_version_counters():
    """A backward through a graph that saved a cache before an append raises instead of using the new values."""
    k_cache, v_cache = caches(1, 1, 4, 2, 2, torch.float32, "cpu")
    w = torch.ones(1, 1, 4, 2, requires_grad=True)
    y = (k_cache * w).sum() + (v_cache * w).sum()
    versions = k_cache._version, v_cache._version
    pt.ops.kv_cache_append(k_cache, v_cache, randn(1, 1, 1, 2), randn(1, 1, 1, 2), torch.tensor([0]))
    assert k_cache._version > versions[0] and v_cache._version > versions[1]
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()


def test_append_refuses_a_leaf_that_requires_grad():
    """As torch's in-place ops: an error with grad mode on (nothing written), allowed under torch.no_grad()."""
    k_cache, v_cache = caches(1, 1, 4, 2, 2, torch.float32, "cpu")
    leaf = k_cache.clone().requires_grad_()
    k_new, v_new, positions = randn(1, 1, 1, 2), randn(1, 1, 1, 2), torch.tensor([1])
    for k, v in ((leaf, v_cache), (k_cache, leaf), (k_cache, leaf[:, :, :])):
        before = k.detach().clone(), v.detach().clone()
        with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
            pt.ops.kv_cache_append(k, v, k_new, v_new, positions)
        assert torch.equal(k.detach(), before[0]) and torch.equal(v.detach(), before[1])
    with torch.no_grad():
        pt.ops.kv_cache_append(leaf, v_cache, k_new, v_new, positions)
    assert torch.equal(leaf.detach()[:, :, 1:2], k_new)


def _bad_append_cases():
    k, v, kn, vn, p = randn(2, 4, 10, 64), randn(2, 4, 10, 32), randn(2, 4, 3, 64), randn(2, 4, 3, 32), torch.tensor([0, 7])
    return [
        ("k_cache: expected a float", (k.int(), v, kn, vn, p)),
        (r"k_cache: expected a 4-d tensor \[B, Hkv, capacity, D\]", (k[0], v, kn, vn, p)),
        (r"v_cache: expected \[B, Hkv, capacity, Dv\] = \[2, 4, 10, \*\]", (k, v[:, :2], kn, vn, p)),
        ("v_cache: expected dtype", (k, v.double(), kn, vn, p)),
        (r"k_new: expected \[B, Hkv, T, D\] = \[2, 4, \*, 64\]", (k, v, kn[..., :32], vn, p)),
        ("k_new: expected dtype", (k, v, kn.half(), vn, p)),
        (r"v_new: expected \[B, Hkv, T, Dv\] = \[2, 4, 3, 32\]", (k, v, kn, vn[:, :, :2], p)),
        ("positions: expected an integer", (k, v, kn, vn, p.float())),
        (r"positions: expected a 1-d tensor \[B\]", (k, v, kn, vn, p[None])),
        (r"positions: expected \[B\] = \[2\]", (k, v, kn, vn, p[:1])),
        ("positions: row 1 would write cache positions 8..10", (k, v, kn, vn, torch.tensor([0, 8]))),
        ("k_cache: expected a tensor whose elements do not overlap", (k[:1].expand(2, 4, 10, 64), v, kn, vn, p)),
        ("v_cache: expected memory separate from k_cache", (k, k, kn, kn, p)),
        ("k_new: expected memory separate from the caches", (k[:1, :1], v[:1, :1], k[:1, :1, :3], vn[:1, :1], p[:1])),
    ]


# Checks of values (positions in range) and of memory overlap need real tensors: eager only.
EAGER_ONLY = ("row ", "overlap", "memory separate")


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("match,args", _bad_append_cases())
def test_kv_cache_append_bad_inputs_raise(match, args, where):
    if where == "meta":
        if any(s in match for s in EAGER_ONLY):
            pytest.skip("a check of values or memory: eager only")
        args = to_meta(args)
    with pytest.raises(ValueError, match=match):
        pt.ops.kv_cache_append(*args)


def test_bad_call_under_compile_names_the_argument():
    k, v = caches(2, 4, 10, 64, 32, torch.float32, "cpu")
    with pytest.raises(TRACING_ERROR, match="k_new: expected"):
        compiled(pt.ops.kv_cache_append)(k, v, randn(2, 4, 3, 32), randn(2, 4, 3, 32), torch.tensor([0, 7]))



# ---- The CUDA kernels on every path: on a GPU, or through the host emulator (--cuda-emulator) ----

@pytest.mark.cuda
def test_cuda_kernels(kernel_target):
    """The CUDA kernel of kv_cache_append (pytransformer/check.py): bit-exact, for every layout."""
    assert kernel_target.run(lambda c: c.check_kv_cache(kernel_target.shapes(kc.APPEND_SHAPES_QUICK, kc.APPEND_SHAPES)),
                             each_device_size=True) == []
