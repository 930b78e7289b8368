"""decode_attention: against float64 references, with kv_cache_append in decode loops and steps (eager, compiled,
CUDA graphs), opcheck, errors."""
import sys

import pytest
import torch

import pytransformer as pt
from pytransformer.ops import reference as ref
from tests.helpers import (CPU_ISA_LEVELS, WHERE, caches, captured_in_cuda_graph, cuda_only, randn, run_under_isa,
                           skip_unsupported, to_meta, tolerance, varied)
from pytransformer import check as kc

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
ops = torch.ops.pytransformer


def _check_decode(q, k, v, lengths, window=None, scale=None):
    out = pt.ops.decode_attention(q, k, v, lengths, window=window, scale=scale)
    expected = ref.decode_attention(q.double(), k.double(), v.double(), lengths.cpu(), window=window, scale=scale)
    atol, rtol = tolerance(q.dtype)
    assert out.shape == expected.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), expected, atol=atol * 10, rtol=rtol)


# (B, Hq, Hkv, T, D, Dv, capacity, window): MHA/GQA/MQA, T = 1 and T > 1, Dv != D, windows, long caches that are
# split into several chunks, partial blocks of keys (random lengths).
CASES = [
    (3, 4, 4, 1, 64, 64, 300, None),
    (2, 8, 2, 1, 128, 128, 700, None),
    (2, 6, 1, 3, 40, 24, 200, None),
    (3, 4, 2, 2, 16, 48, 90, 7),
    (1, 4, 1, 1, 128, 128, 3000, None),
    (2, 8, 4, 4, 64, 32, 2500, 300),
    (1, 2, 2, 5, 40, 40, 9, 1),
    (2, 8, 1, 2, 17, 72, 150, None),  # 16 query rows a cache head, a head dim of one vector and 1, Dv of 4.5 vectors
    (2, 4, 4, 9, 160, 96, 120, 50),  # a head dim over 128 (the CPU's AVX-512 kernel takes it by its generic blocks)
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}-Hq{}-Hkv{}-T{}-D{}-Dv{}-cap{}-w{}".format(*c))
def test_decode_attention_matches_reference(device, dtype, case):
    skip_unsupported(dtype, device)
    b, hq, hkv, t, d, dv, cap, window = case
    q = randn(b, hq, t, d, dtype=dtype, device=device)
    k, v = caches(b, hkv, cap, d, dv, dtype, device)
    lengths = torch.randint(t, cap + 1, (b,), device=device)
    lengths[0] = cap  # a full row
    _check_decode(q, k, v, lengths, window)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_decode_attention_equals_attention_over_each_prefix(device, dtype):
    skip_unsupported(dtype, device)
    q = randn(3, 6, 2, 32, dtype=dtype, device=device)
    k, v = caches(3, 3, 50, 32, 20, dtype, device)
    lengths = torch.tensor([50, 2, 31], device=device)
    out = pt.ops.decode_attention(q, k, v, lengths, scale=0.3)
    for b, n in enumerate(lengths.tolist()):
        expected = ref.attention(q[b:b + 1].double(), k[b:b + 1, :, :n].double(), v[b:b + 1, :, :n].double(),
                                 causal=True, scale=0.3)
        atol, rtol = tolerance(dtype)
        torch.testing.assert_close(out[b:b + 1].double(), expected, atol=atol * 10, rtol=rtol)


@pytest.mark.parametrize("d, dv", [(0, 8), (8, 0), (0, 0)])
def test_empty_head_dims(device, d, dv):
    """D = 0 (every score 0: the mean of the visible values) and Dv = 0 (an empty output) are shapes like any other."""
    q = randn(2, 4, 2, d, device=device)
    k, v = caches(2, 2, 40, d, dv, torch.float32, device)
    _check_decode(q, k, v, torch.tensor([40, 7], device=device), scale=0.5)


def test_zero_length_rows_give_zeros(device):
    q = randn(3, 4, 2, 16, device=device)
    k, v = caches(3, 2, 10, 16, 16, torch.float32, device)
    v[1] = float("nan")  # an unused row is never read
    lengths = torch.tensor([5, 0, 10], device=device)
    out = pt.ops.decode_attention(q, k, v, lengths)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    _check_decode(q[[0, 2]], k[[0, 2]], v[[0, 2]], lengths[[0, 2]])
    assert torch.equal(pt.ops.decode_attention(q, k, v, torch.zeros(3, dtype=torch.long, device=device)),
                       torch.zeros_like(out))


def test_keys_past_the_length_are_never_read(device):
    q = randn(2, 4, 1, 32, device=device)
    k, v = caches(2, 2, 64, 32, 32, torch.float32, device)
    lengths = torch.tensor([40, 1], device=device)
    expected = pt.ops.decode_attention(q, k, v, lengths)
    k[0, :, 40:], v[0, :, 40:], k[1, :, 1:], v[1, :, 1:] = float("nan"), float("nan"), float("inf"), float("nan")
    torch.testing.assert_close(pt.ops.decode_attention(q, k, v, lengths), expected)


@pytest.mark.parametrize("cap", [10, 3000])  # 3000: several chunks per row, merged
def test_nan_propagates_as_in_attention(device, cap):
    """NaN in a query or in a visible key gives a NaN output row (it gave zeros), as attention and float64 math do; a
    NaN key past the length changes nothing."""
    q = randn(2, 4, 1, 16, device=device)
    k, v = caches(2, 2, cap, 16, 16, torch.float32, device)
    lengths = torch.tensor([cap - 3, cap], device=device)
    clean = pt.ops.decode_attention(q, k, v, lengths)
    q[0, 1, 0, 5] = float("nan")  # query head 1 of row 0
    k[1, 1, cap // 2, 0] = float("nan")  # a visible key of kv head 1 (query heads 2, 3) of row 1
    k[0, 0, cap - 1] = float("nan")  # past row 0's length
    out = pt.ops.decode_attention(q, k, v, lengths)
    nan_rows = torch.zeros(2, 4, 1, dtype=torch.bool, device=device)
    nan_rows[0, 1], nan_rows[1, 2:] = True, True
    assert torch.equal(out.isnan().all(-1), nan_rows) and torch.equal(out.isnan().any(-1), nan_rows)
    torch.testing.assert_close(out[~nan_rows], clean[~nan_rows])
    expected = pt.ops.attention(q[:1, :, :, :], k[:1, :, :cap - 3], v[:1, :, :cap - 3])
    assert torch.equal(expected.isnan().all(-1), nan_rows[:1])


# (B, Hq, Hkv, T, D, Dv, capacity, window): T > 1, so that some keys of a row are hidden from some of its queries;
# D 64 takes the AVX-512 blocks of float32 caches, D 40 the generic ones; 700: several chunks a row.
POISON_CASES = [(2, 8, 2, 4, 64, 64, 90, None), (2, 4, 2, 3, 40, 24, 90, 6), (1, 4, 1, 5, 64, 32, 700, 300),
                (2, 6, 3, 3, 16, 48, 70, 1)]


def check_decode_hidden_poison(decode, case, dtype, device, value):
    """`value` planted in K and V at the keys of each row hidden from its first query (the last T - 1, causal) and from
    its last (those before its window), and past its length: the output rows of the queries that see none of them give
    the float64 reference of the clean caches; the others are not finite. decode(q, k, v, lengths, window) -> out."""
    b, hq, hkv, t, d, dv, cap, window = case
    q = randn(b, hq, t, d, dtype=dtype, device=device)
    k, v = caches(b, hkv, cap, d, dv, dtype, device)
    lengths = torch.randint(max(t, cap // 2), cap, (b,))
    bad_k, bad_v = k.clone(), v.clone()
    sees = torch.zeros(b, hq, t, dtype=torch.bool)
    for row, n in enumerate(lengths.tolist()):
        poisoned = [n - 1, n]  # hidden from queries 0 .. T - 2, and past the length
        if window is not None:
            poisoned += [n - t - window + 1, n - t - window]  # the first query's first key, and the one before it
        for j in poisoned:
            bad_k[row, :, j], bad_v[row, :, j] = value, value
        pos = n - t + torch.arange(t)  # [T]
        seen = torch.tensor(poisoned)[:, None]
        visible = (seen <= pos) & (seen < n) & ((seen > pos - window) if window is not None else True)
        sees[row] = visible.any(0)
    out = decode(q, bad_k, bad_v, lengths.to(device), window).cpu()
    expected = ref.decode_attention(q.double().cpu(), k.double().cpu(), v.double().cpu(), lengths, window=window)
    atol, rtol = tolerance(dtype)
    assert sees.any() and (~sees).any()
    torch.testing.assert_close(out[~sees].double(), expected[~sees], atol=atol * 10, rtol=rtol)
    assert not torch.isfinite(out[sees]).any(), "a query that sees a poisoned key must not hide it"


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", POISON_CASES, ids=lambda c: "B{}-Hq{}-Hkv{}-T{}-D{}-Dv{}-cap{}-w{}".format(*c))
def test_nan_behind_causal_or_window_does_not_leak(device, dtype, case, value):
    skip_unsupported(dtype, device)
    check_decode_hidden_poison(lambda q, k, v, n, w: pt.ops.decode_attention(q, k, v, n, window=w), case, dtype,
                               device, value)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("window", [None, 16])
def test_append_and_decode_loop_equals_causal_attention(device, dtype, window):
    """A 4-token ragged prefill then 100 decode steps reproduce one causal attention over the whole sequences."""
    skip_unsupported(dtype, device)
    b, hq, hkv, d, dv, cap, steps = 2, 4, 2, 16, 24, 128, 100
    n = 4 + steps
    q, k, v = (randn(b, h, n, e, dtype=dtype, device=device) for h, e in ((hq, d), (hkv, d), (hkv, dv)))
    expected = torch.cat([ref.attention(q[i:i + 1].double(), k[i:i + 1].double(), v[i:i + 1].double(), causal=True,
                                        window=window) for i in range(b)])  # [B, Hq, N, Dv]
    atol, rtol = tolerance(dtype)
    k_cache, v_cache = torch.zeros(b, hkv, cap, d, dtype=dtype, device=device), torch.zeros(b, hkv, cap, dv,
                                                                                              dtype=dtype, device=device)
    # Prompts of lengths 2 and 4 in one T=4 prefill: row 0's last two tokens are padding, overwritten later.
    prompt_k, prompt_v = k[:, :, :4].clone(), v[:, :, :4].clone()
    prompt_k[0, :, 2:], prompt_v[0, :, 2:] = randn(hkv, 2, d, dtype=dtype), randn(hkv, 2, dv, dtype=dtype)
    pt.ops.kv_cache_append(k_cache, v_cache, prompt_k, prompt_v, torch.zeros(b, dtype=torch.int32, device=device))
    out = pt.ops.decode_attention(q[1:, :, :4], k_cache[1:], v_cache[1:], torch.tensor([4], device=device),
                                  window=window)
    torch.testing.assert_close(out.double(), expected[1:, :, :4], atol=atol * 10, rtol=rtol)
    lengths = torch.tensor([2, 4], device=device)
    rows = torch.arange(b, device=device)
    for _ in range(steps):
        take = lambda t: t[rows, :, lengths].unsqueeze(2)  # noqa: E731  token lengths[b] of each row b: [B, H, 1, E]
        pt.ops.kv_cache_append(k_cache, v_cache, take(k), take(v), lengths)
        out = pt.ops.decode_attention(take(q), k_cache, v_cache, lengths + 1, window=window)
        torch.testing.assert_close(out.double(), take(expected), atol=atol * 10, rtol=rtol)
        lengths = lengths + 1


def test_non_contiguous_inputs(device):
    b, hq, hkv, cap, d = 2, 4, 2, 40, 16
    # Caches laid out [B, capacity, Hkv, D] and viewed as [B, Hkv, capacity, D]; values with a strided last dim (the
    # same layouts that test_kv_cache_append's test_strided_operands appends into).
    k_cache = randn(b, cap, hkv, d, device=device).transpose(1, 2)
    v_cache = randn(b, hkv, cap, 2 * d, device=device)[..., ::2]
    k_ref, v_ref = k_cache.contiguous(), v_cache.contiguous()
    q = randn(b, 3, hq, d, device=device).transpose(1, 2)  # [B, Hq, 3, D]
    lengths = torch.tensor([8, 33], device=device)
    torch.testing.assert_close(pt.ops.decode_attention(q, k_cache, v_cache, lengths),
                               pt.ops.decode_attention(q.contiguous(), k_ref, v_ref, lengths))
    q1 = randn(1, hq, 1, d, device=device).expand(b, hq, 1, d)  # expanded
    torch.testing.assert_close(pt.ops.decode_attention(q1, k_cache, v_cache, lengths),
                               pt.ops.decode_attention(q1.contiguous(), k_ref, v_ref, lengths))


@pytest.mark.parametrize("isa", CPU_ISA_LEVELS)
def test_each_cpu_isa_level_agrees(isa):
    """The decode kernel is compiled per ISA level; the lower levels must agree with the reference too."""
    run_under_isa(isa, (
        "q=torch.randn(2,4,2,40); k=torch.randn(2,2,600,40); v=torch.randn(2,2,600,24); n=torch.tensor([600,77]);"
        "torch.testing.assert_close(pt.ops.decode_attention(q,k,v,n,window=300).double(),"
        " ref.decode_attention(q.double(),k.double(),v.double(),n,window=300), atol=2e-5, rtol=2e-5);"
        "qb,kb,vb=q.bfloat16(),k.bfloat16(),v.bfloat16(); torch.testing.assert_close("
        "pt.ops.decode_attention(qb,kb,vb,n).double(), ref.decode_attention(qb.double(),kb.double(),vb.double(),n),"
        " atol=2e-2, rtol=2e-2);"))


def test_opcheck(device):
    q = randn(2, 4, 2, 16, device=device)
    k, v = caches(2, 2, 12, 16, 8, torch.float32, device)
    lengths = torch.tensor([12, 3], device=device)
    torch.library.opcheck(ops.decode_attention, (q, k, v, lengths, 0.25, None))
    torch.library.opcheck(ops.decode_attention, (q, k, v, lengths, 0.25, 2))


def test_schema_mutates_nothing():
    assert not any(a.alias_info is not None and a.alias_info.is_write for a in ops.decode_attention.default._schema.arguments)


def test_compiled_decode_step_on_a_static_cache(device):
    """append + decode_attention compile into one graph (no breaks, no recompiles as positions advance) that
    updates the caches in place like the eager ops."""
    from torch._dynamo.testing import CompileCounterWithBackend

    def step(q, k_new, v_new, k_cache, v_cache, lengths):
        pt.ops.kv_cache_append(k_cache, v_cache, k_new, v_new, lengths)
        lengths = lengths + k_new.shape[2]
        return pt.ops.decode_attention(q, k_cache, v_cache, lengths, window=24), lengths

    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(step, fullgraph=True, backend=counter)
    k_cache, v_cache = torch.zeros(2, 2, 64, 16, device=device), torch.zeros(2, 2, 64, 16, device=device)
    k_eager, v_eager = k_cache.clone(), v_cache.clone()
    lengths = lengths_eager = torch.tensor([0, 5], device=device)
    data_ptr = k_cache.data_ptr()
    for _ in range(4):
        q, k_new, v_new = (randn(2, h, 1, 16, device=device) for h in (4, 2, 2))
        out, lengths = compiled(q, k_new, v_new, k_cache, v_cache, lengths)
        out_eager, lengths_eager = step(q, k_new, v_new, k_eager, v_eager, lengths_eager)
        torch.testing.assert_close(out, out_eager)
    assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager) and lengths.tolist() == [4, 9]
    assert k_cache.data_ptr() == data_ptr  # the same storage: no reallocation
    assert counter.frame_count == 1


def test_requires_grad_inputs():
    """An inference op: it runs on a query that requires grad, and a backward through it raises a clear error."""
    q = randn(1, 2, 1, 8).requires_grad_(True)
    k_cache, v_cache = caches(1, 2, 10, 8, 8, torch.float32, "cpu")
    out = pt.ops.decode_attention(q, k_cache, v_cache, torch.tensor([4]))
    with torch.no_grad():
        torch.testing.assert_close(out, pt.ops.decode_attention(q, k_cache, v_cache, torch.tensor([4])))
    with pytest.raises(RuntimeError, match="decode_attention is an inference op"):
        out.sum().backward()


def _bad_decode_cases():
    q, k, v, n = randn(2, 4, 1, 16), randn(2, 2, 10, 16), randn(2, 2, 10, 8), torch.tensor([5, 10])
    return [
        ("q: expected a 4-d", (q[0], k, v, n), {}),
        ("q: expected a float", (q.int(), k, v, n), {}),
        (r"q: expected \[B, Hq, T, D\] with T >= 1", (q[:, :, :0], k, v, n), {}),
        (r"k_cache: expected \[B, Hkv, capacity, D\] = \[2, \*, \*, 16\]", (q, k[..., :8], v, n), {}),
        (r"k_cache: expected \[B, Hkv, capacity, D\] = \[2, \*, \*, 16\]", (q, k[:1], v, n), {}),
        ("k_cache: expected a 4-d", (q, k[0], v, n), {}),
        ("k_cache: expected dtype", (q, k.double(), v, n), {}),
        (r"v_cache: expected \[B, Hkv, capacity, Dv\] = \[2, 2, 10, \*\]", (q, k, v[:, :, :9], n), {}),
        ("v_cache: expected dtype", (q, k, v.half(), n), {}),
        ("Hq = 4 must be a multiple of the number of cache heads Hkv = 3", (q, randn(2, 3, 10, 16),
                                                                            randn(2, 3, 10, 8), n), {}),
        ("cache_lengths: expected an integer", (q, k, v, n.float()), {}),
        (r"cache_lengths: expected \[B\] = \[2\]", (q, k, v, n[:1]), {}),
        ("cache_lengths: row 1 has length 11", (q, k, v, torch.tensor([5, 11])), {}),
        ("cache_lengths: row 0 has length -1", (q, k, v, torch.tensor([-1, 3])), {}),
        ("cache_lengths: row 0 has length 1", (randn(2, 4, 2, 16), k, v, torch.tensor([1, 3])), {}),
        ("window: expected a positive number of keys", (q, k, v, n), {"window": 0}),
        ("scale: expected a finite", (q, k, v, n), {"scale": float("nan")}),
    ]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("match,args,kwargs", _bad_decode_cases())
def test_decode_attention_bad_inputs_raise(match, args, kwargs, where):
    if where == "meta":
        if "row " in match:
            pytest.skip("a check of the lengths' values: eager only")
        args = to_meta(args)
    with pytest.raises(ValueError, match=match):
        pt.ops.decode_attention(*args, **kwargs)


# ---- CUDA only: CUDA graphs (positions / cache_lengths are then checked on the device), Inductor, limits ----


@cuda_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_step_replayed_in_a_cuda_graph(dtype):
    """A decode step (append + decode_attention, GQA, long enough to split) captured once and replayed with new
    inputs and advancing positions matches the CPU ops run step by step."""
    b, hq, hkv, d, cap = 2, 8, 2, 64, 1500
    k_cache, v_cache = caches(b, hkv, cap, d, d, dtype, "cuda")
    q, k_new, v_new = (randn(b, h, 1, d, dtype=dtype, device="cuda") for h in (hq, hkv, hkv))
    positions = torch.tensor([1000, 3], device="cuda")

    def step():
        pt.ops.kv_cache_append(k_cache, v_cache, k_new, v_new, positions)
        return pt.ops.decode_attention(q, k_cache, v_cache, positions + 1)

    graph, out = captured_in_cuda_graph(step)
    k_ref, v_ref = k_cache.cpu(), v_cache.cpu()
    for _ in range(3):
        for t in (q, k_new, v_new):
            t.copy_(randn(*t.shape, dtype=dtype))
        positions += 7
        graph.replay()
        pt.ops.kv_cache_append(k_ref, v_ref, k_new.cpu(), v_new.cpu(), positions.cpu())
        expected = pt.ops.decode_attention(q.cpu(), k_ref, v_ref, positions.cpu() + 1)
        torch.cuda.synchronize()
        assert torch.equal(k_cache.cpu(), k_ref) and torch.equal(v_cache.cpu(), v_ref)
        atol, rtol = tolerance(dtype)
        torch.testing.assert_close(out.cpu(), expected, atol=atol * 10, rtol=rtol)


@cuda_only
def test_values_are_checked_on_the_device_under_capture():
    """Captured, bad positions / lengths cannot raise: an append row that does not fit writes nothing, a decode row
    with a length out of range gives zeros; the other rows are right."""
    k_cache, v_cache = caches(2, 2, 10, 8, 8, torch.float32, "cuda")
    k_new, v_new = randn(2, 2, 4, 8, device="cuda"), randn(2, 2, 4, 8, device="cuda")
    q = randn(2, 4, 1, 8, device="cuda")
    positions, lengths = torch.tensor([0, 0], device="cuda"), torch.tensor([1, 1], device="cuda")
    graph, _ = captured_in_cuda_graph(lambda: pt.ops.kv_cache_append(k_cache, v_cache, k_new, v_new, positions))
    decode_graph, out = captured_in_cuda_graph(lambda: pt.ops.decode_attention(q, k_cache, v_cache, lengths))
    before_k, before_v = k_cache.clone(), v_cache.clone()
    positions.copy_(torch.tensor([7, 6]))  # row 0 would write 7..10, past the capacity 10
    graph.replay()
    assert torch.equal(k_cache[0], before_k[0]) and torch.equal(v_cache[0], before_v[0])
    assert torch.equal(k_cache[1, :, 6:], k_new[1]) and torch.equal(v_cache[1, :, 6:], v_new[1])
    lengths.copy_(torch.tensor([11, 10]))  # row 0 over the capacity
    decode_graph.replay()
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    torch.testing.assert_close(out[1:], pt.ops.decode_attention(q[1:], k_cache[1:], v_cache[1:], lengths[1:]))


@cuda_only
def test_compiled_decode_step_with_inductor_on_cuda():
    """The decode step under torch.compile(fullgraph=True) with the default backend (Inductor) on CUDA."""
    def step(q, k_new, v_new, k_cache, v_cache, lengths):
        pt.ops.kv_cache_append(k_cache, v_cache, k_new, v_new, lengths)
        return pt.ops.decode_attention(q, k_cache, v_cache, lengths + 1, window=100)

    compiled = torch.compile(step, fullgraph=True)
    k_cache, v_cache = caches(2, 2, 600, 64, 64, torch.bfloat16, "cuda")
    k_eager, v_eager = k_cache.clone(), v_cache.clone()
    lengths = torch.tensor([500, 9], device="cuda")
    for _ in range(3):
        q, k_new, v_new = (randn(2, h, 1, 64, dtype=torch.bfloat16, device="cuda") for h in (8, 2, 2))
        out = compiled(q, k_new, v_new, k_cache, v_cache, lengths)
        torch.testing.assert_close(out, step(q, k_new, v_new, k_eager, v_eager, lengths))
        lengths = lengths + 1
    assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager)


@pytest.mark.parametrize("meta", [False, True])
def test_max_length_bound(device, meta):
    # A host-side bound of cache_lengths: same output; a bound past the capacity raises; a bad type is a TypeError.
    q, k, v = randn(2, 4, 1, 8, device=device), randn(2, 2, 10, 8, device=device), randn(2, 2, 10, 8, device=device)
    lengths = torch.tensor([10, 3], device=device)
    args = to_meta((q, k, v, lengths)) if meta else (q, k, v, lengths)
    out = pt.ops.decode_attention(*args, max_length=10)
    if not meta:
        torch.testing.assert_close(out, pt.ops.decode_attention(*args), rtol=0, atol=0)
    for bad in (11, -1):
        with pytest.raises(ValueError, match="max_length"):
            pt.ops.decode_attention(*args, max_length=bad)
    with pytest.raises(TypeError, match="max_length"):
        pt.ops.decode_attention(*args, max_length="10")


@cuda_only
def test_cuda_head_dim_limit_raises():
    q, k, v = randn(1, 2, 1, 300, device="cuda"), randn(1, 2, 5, 300, device="cuda"), randn(1, 2, 5, 8, device="cuda")
    with pytest.raises(ValueError, match="q: the CUDA decode_attention supports head dims"):
        pt.ops.decode_attention(q, k, v, torch.tensor([5], device="cuda"))


# ---- The CUDA kernels on every path: on a GPU, or through the host emulator (--cuda-emulator) ----

@pytest.mark.cuda
def test_cuda_kernels(kernel_target):
    """The CUDA kernels of decode_attention (one split a row, several splits and the combine) against float64
    references (pytransformer/check.py)."""
    assert kernel_target.run(lambda c: c.check_decode(kernel_target.shapes(kc.DECODE_SHAPES_QUICK, kc.DECODE_SHAPES)),
                             each_device_size=True) == []


@pytest.mark.cuda
def test_cuda_kernels_check_values_under_cuda_graph_capture(kernel_target):
    """Captured, the kernels check positions / cache_lengths themselves (pytransformer/check.py)."""
    assert kernel_target.run(lambda c: c.check_kv_device_checks(kernel_target.captured)) == []


@pytest.mark.cuda
def test_cuda_host_bounds(kernel_target):
    """max_position / max_length (pytransformer/check.py); emulated, also that they spare the device-to-host copy and its
    stream synchronisation that reading positions / cache_lengths back costs."""
    assert kernel_target.run(lambda c: c.check_kv_host_bounds()) == []
    if not kernel_target.emulated:
        return
    ops, k, v = kernel_target.ops, torch.zeros(2, 2, 8, 4), torch.zeros(2, 2, 8, 4)
    new, positions, q = torch.randn(2, 2, 1, 4), torch.tensor([3, 5]), torch.randn(2, 2, 1, 4)
    ops.synchronizations()
    ops.kv_cache_append(k, v, new, new, positions, 5)
    ops.decode_attention(q, k, v, positions + 1, 0.5, None, 6)
    assert ops.synchronizations() == 0
    ops.kv_cache_append(k, v, new, new, positions)
    ops.decode_attention(q, k, v, positions + 1, 0.5, None)
    assert ops.synchronizations() == 2


@pytest.mark.cuda
@pytest.mark.parametrize("window", [None, 4])
def test_cuda_generate_reads_no_lengths_back(emu, monkeypatch, window):
    """The KVCache module passes its host-side bound of the lengths (max_position / max_length), so a whole greedy
    generate, prefill and every token, runs the CUDA KV-cache glue (emulated) without a stream synchronisation, with
    the same tokens as the CPU kernels; without the bound (max_length None) every layer's append and decode reads the
    lengths back (the counter sees it). window=4: the rolling cache (bounds W - 1 and W)."""
    model = varied(pt.models.DecoderLM(pt.models.gpt2_small(n_layers=2, d_model=32, n_heads=4, vocab_size=50,
                                                            window=window, dropout=0.0)).eval())
    prompt = torch.randint(0, 50, (2, 5))
    expected = model.generate(prompt, 6)
    for op in ("kv_cache_append", "decode_attention"):
        monkeypatch.setattr(sys.modules[f"pytransformer.ops.{op}"], "_ops", emu)
    emu.synchronizations()
    assert torch.equal(model.generate(prompt, 6), expected)
    assert emu.synchronizations() == 0
    if window is None:
        cache = model.new_cache(2, 12)
        model(prompt, cache=cache)
        cache.max_length = None
        model(prompt[:, :1], cache=cache)
        assert emu.synchronizations() == 2 * 2  # two layers, append and decode each


@pytest.mark.cuda
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", POISON_CASES, ids=lambda c: "B{}-Hq{}-Hkv{}-T{}-D{}-Dv{}-cap{}-w{}".format(*c))
def test_cuda_nan_behind_causal_or_window_does_not_leak(kernel_target, dtype, case, value):
    """The CUDA kernels (one split a row and several) keep hidden keys out, as the CPU's do."""
    d = case[4]
    check_decode_hidden_poison(lambda q, k, v, n, w: kernel_target.ops.decode_attention(q, k, v, n, d ** -0.5, w, None),
                               case, dtype, kernel_target.device, value)
