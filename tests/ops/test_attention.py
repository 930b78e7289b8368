"""attention: forward and backward against a float64 materialised-softmax reference, gradcheck, opcheck,
torch.compile and bad inputs."""
import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import pytransformer
from pytransformer.ops import attention, reference
from pytransformer.ops.visibility import visible_keys
from tests.helpers import CPU_ISA_LEVELS, TRACING_ERROR, WHERE, compiled, factory_device, run_under_isa, tolerance
from pytransformer import check as kc
from pytransformer.check import deterministic_algorithms

# (B, Hq, Hkv, Lq, Lk, D, Dv): L = 1, Lq != Lk both ways, D in {16, 40, 64, 80, 128}, Dv != D, Hkv in {1, 2, Hq}.
SHAPES = [
    (2, 4, 4, 1, 37, 64, 64),
    (1, 2, 2, 1, 1, 16, 16),
    (2, 4, 2, 50, 90, 40, 24),
    (1, 6, 1, 90, 50, 80, 80),
    (2, 2, 2, 70, 70, 16, 48),
    (1, 4, 2, 65, 130, 128, 64),
]


def _mask_kwargs(kind, b, hq, lq, lk, device):
    """Keyword arguments of attention for one mask kind (or combination) at [B, Hq, Lq, Lk], freshly random."""
    rand_bool = lambda *shape, p=0.7: torch.rand(*shape, device=device) < p  # noqa: E731
    rand_float = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
    lengths = torch.randint(1, lk + 1, (b,), device=device)
    if b > 1:
        lengths[0] = 0  # a batch row that sees no key at all
    kinds = {
        "none": lambda: {},
        "causal": lambda: {"causal": True},
        "window": lambda: {"window": 5},
        "key_lengths": lambda: {"key_lengths": lengths},
        "bool_mask_4d": lambda: {"mask": rand_bool(b, 1, lq, lk)},
        "bool_mask_keys": lambda: {"mask": rand_bool(lk, p=0.6)},
        "float_mask_3d": lambda: {"mask": rand_float(hq, lq, lk)},
        "float_mask_neg_inf": lambda: {"mask": rand_float(b, hq, lq, lk).masked_fill(rand_bool(b, hq, lq, lk, p=0.3),
                                                                                     float("-inf"))},
        "bool_rows_empty": lambda: {"mask": rand_bool(1, 1, lq, 1, p=0.5) & rand_bool(lk)},
        "causal_key_lengths": lambda: {"causal": True, "key_lengths": lengths.to(torch.int32)},
        "window_bool_lengths": lambda: {"window": 7, "mask": rand_bool(b, hq, lq, lk, p=0.8), "key_lengths": lengths},
        "causal_float_mask": lambda: {"causal": True, "mask": rand_float(b, 1, 1, lk).masked_fill(
            rand_bool(b, 1, 1, lk, p=0.3), float("-inf"))},  # a padding mask: -inf at hidden keys
    }
    return kinds[kind]()


MASK_KINDS = ["none", "causal", "window", "key_lengths", "bool_mask_4d", "bool_mask_keys", "float_mask_3d",
              "float_mask_neg_inf", "bool_rows_empty", "causal_key_lengths", "window_bool_lengths",
              "causal_float_mask"]


def _inputs(shape, dtype, device, requires_grad=True):
    b, hq, hkv, lq, lk, d, dv = shape
    q = torch.randn(b, hq, lq, d, device=device, dtype=dtype)
    k = torch.randn(b, hkv, lk, d, device=device, dtype=dtype)
    v = torch.randn(b, hkv, lk, dv, device=device, dtype=dtype)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def _reference(q, k, v, grad, **kwargs):
    """float64 output and gradients of q, k, v (float masks are promoted too)."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    kw = {n: (a.double() if torch.is_tensor(a) and a.is_floating_point() else a) for n, a in kwargs.items()}
    out = reference.attention(q64, k64, v64, **kw)
    return (out, *torch.autograd.grad(out, (q64, k64, v64), grad.double()))


def _assert_close(actual, expected, name):
    """Max error within atol + rtol * (largest reference value) of the dtype's tolerance."""
    assert torch.isfinite(actual).all(), f"{name}: non-finite values"
    atol, rtol = tolerance(actual.dtype)
    err = (actual.double() - expected).abs().max().item() if actual.numel() else 0.0
    bound = atol + rtol * (expected.abs().max().item() if expected.numel() else 0.0)
    assert err <= bound, f"{name}: max error {err:.3g} > {bound:.3g}"


def _check_against_reference(shape, kind, dtype, device):
    q, k, v = _inputs(shape, dtype, device)
    b, hq, _, lq, lk, _, _ = shape
    kwargs = _mask_kwargs(kind, b, hq, lq, lk, device)
    out = attention(q, k, v, **kwargs)
    grad = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    expected = _reference(q, k, v, grad, **kwargs)
    assert out.shape == (b, hq, lq, shape[-1]) and out.dtype == dtype
    for name, actual, exp in zip(("out", "grad_q", "grad_k", "grad_v"), (out, *grads), expected):
        _assert_close(actual, exp, name)


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_reference_float32(shape, kind, device):
    _check_against_reference(shape, kind, torch.float32, device)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("kind", ["none", "causal_key_lengths", "window_bool_lengths", "causal_float_mask"])
@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[2], SHAPES[5]], ids=str)
def test_matches_reference_other_dtypes(shape, kind, dtype, device):
    if dtype == torch.float64 and device == "cuda":
        pytest.skip("float64 is CPU-only")
    _check_against_reference(shape, kind, dtype, device)


def test_long_sequence_many_tiles(device):
    """Several query and key tiles, every skip/partial-tile path of causal + window + lengths."""
    _check_against_reference((2, 2, 1, 300, 333, 64, 64), "window_bool_lengths", torch.float32, device)
    _check_against_reference((1, 2, 2, 257, 257, 64, 64), "causal", torch.float32, device)


def test_empty_rows_give_zeros_and_zero_gradients(device):
    q, k, v = _inputs((2, 2, 1, 6, 4, 16, 16), torch.float32, device)
    # causal with Lq > Lk: the first two queries sit before every key; batch row 1 has no keys at all.
    out = attention(q, k, v, causal=True, key_lengths=torch.tensor([4, 0], device=device))
    assert torch.isfinite(out).all()
    assert (out[:, :, :2] == 0).all() and (out[1] == 0).all() and (out[0, :, 2:] != 0).any()
    gq, gk, gv = torch.autograd.grad(out.sum(), (q, k, v))
    assert (gq[:, :, :2] == 0).all() and (gq[1] == 0).all() and (gk[1] == 0).all() and (gv[1] == 0).all()
    # a float mask of -inf everywhere
    out = attention(q, k, v, mask=torch.full((6, 4), float("-inf"), device=device))
    assert (out == 0).all()


# ---- A NaN or inf at a hidden key changes no visible result ----

POISONS = [("v", float("nan")), ("v", float("inf")), ("k", float("nan")), ("k", float("-inf"))]
POISON_SHAPES = [(2, 4, 2, 50, 90, 40, 24), (1, 2, 1, 70, 130, 32, 16)]
POISON_KINDS = [k for k in MASK_KINDS if k not in ("none", "float_mask_3d")]  # those that hide keys


def _visible(kwargs, b, hq, lq, lk, device):
    """Bool [B, Hq, Lq, Lk]: which keys each query sees under `kwargs` (a float mask hides with -inf)."""
    vis = torch.ones(b, hq, lq, lk, dtype=torch.bool, device=device)
    mask = kwargs.get("mask")
    if mask is not None:
        vis = vis & (mask if mask.dtype == torch.bool else mask != float("-inf"))
    keep = visible_keys(lq, lk, causal=kwargs.get("causal", False), window=kwargs.get("window"),
                        key_lengths=kwargs.get("key_lengths"), device=device)
    return vis if keep is None else vis & keep


def _run_op(ops, q, k, v, grad, kwargs):
    """Output and gradients of q, k, v of the attention op of namespace `ops` (no autograd: the ops themselves)."""
    args = (kwargs.get("mask"), kwargs.get("causal", False), kwargs.get("window"), kwargs.get("key_lengths"),
            q.shape[-1] ** -0.5)
    out, lse = ops.attention(q, k, v, *args)
    return (out, *ops.attention_backward(grad, q, k, v, out, lse, *args))


def check_hidden_poison(ops, shape, kind, dtype, device, name, value):
    """Plants `value` in row `name` (k or v) of the key hidden from the most query rows of each K/V head. The rows that
    do not see that key (clean rows) give the float64 reference of the clean inputs (output and dQ), and so do dK and
    dV of the keys that only clean rows see (the poisoned key's too, zero, when no row sees it); the rows that see it
    are not finite."""
    b, hq, hkv, lq, lk, _, dv = shape
    q, k, v = _inputs(shape, dtype, device, requires_grad=False)
    for _ in range(20):  # random key lengths may all be full (1 in lk a batch row): draw again until a key is hidden
        kwargs = _mask_kwargs(kind, b, hq, lq, lk, device)
        hidden = ~_visible(kwargs, b, hq, lq, lk, device).reshape(b, hkv, hq // hkv * lq, lk)  # rows of a K/V head
        if hidden.any():
            break
    key = hidden.sum(2).argmax(-1)  # [B, Hkv]
    poisoned = hidden.sum(2).gather(-1, key[..., None])[..., 0] > 0  # [B, Hkv]: a row that does not see it exists
    bad = {"k": k.clone(), "v": v.clone()}
    for bb, hh in poisoned.nonzero().tolist():
        bad[name][bb, hh, key[bb, hh]] = value
    sees = ~hidden.gather(-1, key[:, :, None, None].expand(b, hkv, hidden.shape[2], 1))[..., 0]
    sees = (sees & poisoned[..., None]).reshape(b, hq, lq).cpu()
    grad = torch.randn(b, hq, lq, dv, device=device, dtype=dtype)
    out, gq, gk, gv = (t.cpu() for t in _run_op(ops, q, bad["k"], bad["v"], grad, kwargs))
    cpu = {n: (a.cpu() if torch.is_tensor(a) else a) for n, a in kwargs.items()}
    expected = _reference(q.cpu(), k.cpu(), v.cpu(), grad.cpu(), **cpu)
    assert poisoned.any(), "nothing hidden: no key poisoned"
    _assert_close(out[~sees], expected[0][~sees], "out of the rows that do not see the poisoned key")
    _assert_close(gq[~sees], expected[1][~sees], "grad_q of the rows that do not see the poisoned key")
    assert not torch.isfinite(out[sees]).any(), "a row that sees the poisoned key must not hide it"
    seen = _visible(kwargs, b, hq, lq, lk, device).cpu() & sees[..., None]  # [B, Hq, Lq, Lk]: seen by a dirty row
    dirty = seen.reshape(b, hkv, hq // hkv * lq, lk).any(2)  # [B, Hkv, Lk]
    _assert_close(gk[~dirty], expected[2][~dirty], "grad_k of the keys that only clean rows see")
    _assert_close(gv[~dirty], expected[3][~dirty], "grad_v of the keys that only clean rows see")


@pytest.mark.parametrize("name, value", POISONS, ids=lambda x: str(x))
@pytest.mark.parametrize("kind", POISON_KINDS)
@pytest.mark.parametrize("shape", POISON_SHAPES, ids=str)
def test_nan_behind_a_mask_does_not_leak(shape, kind, name, value, device):
    check_hidden_poison(torch.ops.pytransformer, shape, kind, torch.float32, device, name, value)


@pytest.mark.parametrize("isa", CPU_ISA_LEVELS)
def test_nan_behind_a_mask_does_not_leak_at_each_cpu_isa_level(isa):
    """The same in the CPU kernels of the levels below this processor's (their tiles of other widths), for every kind
    and poison in float32 and, with NaN in V, float64."""
    run_under_isa(isa, (
        "from tests.ops.test_attention import check_hidden_poison, POISONS, POISON_KINDS, POISON_SHAPES\n"
        "for kind in POISON_KINDS:\n"
        "  for dtype, poisons in ((torch.float32, POISONS), (torch.float64, POISONS[:1])):\n"
        "    for name, value in poisons:\n"
        "      check_hidden_poison(torch.ops.pytransformer, POISON_SHAPES[0], kind, dtype, 'cpu', name, value)"))


def test_nan_behind_a_mask_does_not_leak_on_the_dropout_path():
    """The unfused dropout path (dropout_p > 0, here too small to drop anything) keeps hidden keys out too: NaN and inf
    at a key that a -inf float mask hides from every query, and at the last key, which causal hides from all but the
    last query; that query's output is NaN."""
    q, k, v = _inputs((2, 4, 2, 20, 30, 16, 16), torch.float32, "cpu", requires_grad=False)
    mask = torch.randn(20, 30).masked_fill(torch.rand(20, 30) < 0.3, float("-inf"))
    mask[:, 5], mask[:, 29] = float("-inf"), 0.0
    bad_k, bad_v = k.clone(), v.clone()
    bad_k[:, :, 5], bad_v[:, :, 5], bad_k[:, :, 29], bad_v[:, :, 29] = float("nan"), float("inf"), 1.0, float("nan")
    out = attention(q, bad_k, bad_v, mask=mask, causal=True, dropout_p=1e-12)
    expected = reference.attention(q.double(), k.double(), v.double(), mask=mask.double(), causal=True)
    _assert_close(out[:, :, :-1], expected[:, :, :-1], "out of the queries before the last")
    assert out[:, :, -1].isnan().all()


def test_zero_sizes(device):
    for shape in [(0, 2, 1, 5, 5, 8, 8), (1, 2, 1, 0, 5, 8, 8), (1, 2, 1, 5, 0, 8, 8)]:
        q, k, v = _inputs(shape, torch.float32, device)
        out = attention(q, k, v)
        assert out.shape == (shape[0], shape[1], shape[3], shape[6]) and (out == 0).all()
        grads = torch.autograd.grad(out.sum(), (q, k, v), allow_unused=True)
        assert [g.shape for g in grads] == [q.shape, k.shape, v.shape]


def test_non_contiguous_inputs_match_contiguous(device):
    b, h, lq, lk, d = 2, 4, 33, 45, 64
    q = torch.randn(b, lq, h, d, device=device).transpose(1, 2)  # [B, H, L, D] view of [B, L, H, D]
    k = torch.randn(1, 2, lk, d, device=device).expand(b, 2, lk, d)  # stride 0 over the batch
    v = torch.randn(b, 2, 40, lk, device=device).transpose(-1, -2)  # non-contiguous last dim
    mask = (torch.rand(1, 1, lq, lk, device=device) < 0.8).expand(b, h, lq, lk)
    kwargs = dict(mask=mask, causal=True, key_lengths=torch.tensor([40, 30], device=device))
    ins = [t.requires_grad_() for t in (q, k, v)]
    out = attention(*ins, **kwargs)
    grads = torch.autograd.grad(out, ins, torch.ones_like(out))
    ins_c = [t.detach().contiguous().requires_grad_() for t in (q, k, v)]
    out_c = attention(*ins_c, mask=mask.contiguous(), causal=True, key_lengths=kwargs["key_lengths"])
    grads_c = torch.autograd.grad(out_c, ins_c, torch.ones_like(out_c))
    torch.testing.assert_close(out, out_c, atol=1e-6, rtol=1e-6)
    for g, gc in zip(grads, grads_c):
        torch.testing.assert_close(g, gc, atol=1e-5, rtol=1e-5)


def test_scale_and_sdpa_agreement(device):
    q, k, v = _inputs((2, 4, 4, 40, 40, 64, 64), torch.float32, device, requires_grad=False)
    torch.testing.assert_close(attention(q, k, v, causal=True), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(attention(q, k, v, scale=0.3), F.scaled_dot_product_attention(q, k, v, scale=0.3),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["none", "causal_key_lengths", "window_bool_lengths", "float_mask_neg_inf",
                                  "bool_rows_empty"])
def test_gradcheck(kind):
    shape = (2, 2, 1, 5, 7, 3, 4)
    q, k, v = _inputs(shape, torch.float64, "cpu")
    kwargs = _mask_kwargs(kind, 2, 2, 5, 7, "cpu")
    kwargs = {n: (a.double() if torch.is_tensor(a) and a.is_floating_point() else a) for n, a in kwargs.items()}
    assert torch.autograd.gradcheck(lambda q, k, v: attention(q, k, v, **kwargs), (q, k, v))


def test_opcheck():
    q, k, v = _inputs((2, 4, 2, 9, 11, 16, 8), torch.float32, "cpu")
    mask = torch.rand(2, 1, 9, 11) < 0.8
    lengths = torch.tensor([11, 6])
    args = (q, k, v, mask, True, 4, lengths, 0.25)
    torch.library.opcheck(torch.ops.pytransformer.attention.default, args)
    torch.library.opcheck(torch.ops.pytransformer.attention.default, (q, k, v, torch.randn(9, 11), False, None, None,
                                                                       0.25))
    out, lse = torch.ops.pytransformer.attention(*args)
    grad = torch.randn_like(out)
    torch.library.opcheck(torch.ops.pytransformer.attention_backward.default,
                          (grad, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), mask, True, 4, lengths,
                           0.25))


def _assert_compiled_matches(f, inputs, **compile_kwargs):
    """f (a scalar loss of `inputs`) compiled with fullgraph=True gives the eager loss and gradients."""
    loss = torch.compile(f, fullgraph=True, **compile_kwargs)(*inputs)
    grads = torch.autograd.grad(loss, inputs)
    loss_eager = f(*inputs)
    grads_eager = torch.autograd.grad(loss_eager, inputs)
    torch.testing.assert_close(loss, loss_eager)
    for g, ge in zip(grads, grads_eager):
        torch.testing.assert_close(g, ge)


def test_compile_fullgraph_forward_backward():
    q, k, v = _inputs((2, 4, 2, 20, 24, 16, 16), torch.float32, "cpu")
    mask = torch.rand(2, 1, 20, 24) < 0.9
    lengths = torch.tensor([24, 13])

    def f(q, k, v):
        out = attention(q, k, v, mask=mask, causal=True, window=9, key_lengths=lengths)
        return out.square().sum()

    _assert_compiled_matches(f, (q, k, v), backend="aot_eager")


def test_compile_fullgraph_dropout_path():
    q, k, v = _inputs((2, 4, 2, 10, 12, 8, 8), torch.float32, "cpu")
    f = lambda q, k, v: attention(q, k, v, causal=True, dropout_p=0.2).sum()  # noqa: E731
    loss = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    assert all(torch.isfinite(g).all() for g in torch.autograd.grad(loss, (q, k, v)))


def test_dropout_unfused_path():
    q, k, v = _inputs((2, 4, 2, 12, 16, 8, 8), torch.float64, "cpu")
    lengths = torch.tensor([16, 5])
    torch.manual_seed(1)
    out = attention(q, k, v, causal=True, key_lengths=lengths, dropout_p=0.3)
    # the same random mask on the reference probabilities
    torch.manual_seed(1)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = (q @ kk.transpose(-1, -2)) / 8 ** 0.5
    keep = visible_keys(12, 16, causal=True, key_lengths=lengths)
    p = F.dropout(reference.softmax_rows(s.masked_fill(~keep, float("-inf"))), 0.3)
    torch.testing.assert_close(out, p @ vv)
    assert not torch.allclose(out, attention(q, k, v, causal=True, key_lengths=lengths))
    assert all(g is not None and torch.isfinite(g).all() for g in torch.autograd.grad(out.sum(), (q, k, v)))
    assert (attention(q, k, v, dropout_p=1.0) == 0).all()


    def same_dropout(q, k, v):
        torch.manual_seed(2)
        return attention(q, k, v, dropout_p=0.5)

    assert torch.autograd.gradcheck(same_dropout, (q[:1, :2, :3, :2], k[:1, :1, :4, :2], v[:1, :1, :4, :2]))


def test_dropout_path_computes_in_float32():
    """bf16 q with a float32 mask runs (it raised), and scores and softmax are float32: with dropout_p so small that
    nothing is dropped, the output is as close to float64 as the fused kernel's (bf16 softmax was 4x worse)."""
    q, k, v = _inputs((2, 4, 2, 64, 64, 32, 32), torch.bfloat16, "cpu", requires_grad=False)
    q = q * 4  # large scores: rounding them to bf16 is what the float32 path avoids
    mask = torch.randn(64, 64)
    expected = reference.attention(q.double(), k.double(), v.double(), mask=mask.double())
    fused = attention(q, k, v, mask=mask)
    unfused = attention(q, k, v, mask=mask, dropout_p=1e-12)
    assert unfused.dtype == torch.bfloat16
    fused_err = (fused.double() - expected).abs().amax().item()
    assert (unfused.double() - expected).abs().amax().item() <= 1.5 * fused_err


def test_non_tensor_arguments_raise_type_error():
    q, k, v = _inputs((1, 2, 2, 3, 4, 8, 8), torch.float32, "cpu", requires_grad=False)
    for name, call in [("q", lambda: attention([[1.0]], k, v)), ("k", lambda: attention(q, 3, v)),
                       ("v", lambda: attention(q, k, None)), ("mask", lambda: attention(q, k, v, mask=[[True]])),
                       ("key_lengths", lambda: attention(q, k, v, key_lengths=[4]))]:
        with pytest.raises(TypeError, match=f"^{name}: expected a tensor"):
            call()


@pytest.mark.parametrize("where", WHERE)
def test_bad_inputs_raise(where):
    with factory_device(where):
        _bad_inputs_raise()


def test_bad_call_under_compile_names_the_argument():
    with pytest.raises(TRACING_ERROR, match="k: the number of query heads"):
        compiled(attention)(torch.randn(2, 4, 5, 8), torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8))


def test_tensors_on_different_devices_raise():
    q, k, v = _inputs((1, 2, 2, 3, 4, 8, 8), torch.float32, "cpu", requires_grad=False)
    with pytest.raises(ValueError, match="v: expected a tensor on"):
        attention(q, k, v.to("meta"))


def _bad_inputs_raise():
    q, k, v = _inputs((2, 4, 2, 5, 6, 8, 8), torch.float32, None, requires_grad=False)
    cases = [
        ("q", lambda: attention(q[0], k, v)),
        ("q", lambda: attention(torch.tensor(1.0), k, v)),
        ("q", lambda: attention(q[0, 0, 0], k, v, dropout_p=0.5)),
        ("k", lambda: attention(q, k[0], v)),
        ("v", lambda: attention(q, k, v[0])),
        ("k", lambda: attention(q, k[:1], v)),  # batch mismatch
        ("k", lambda: attention(q, k[..., :4], v)),  # head dim mismatch
        ("k", lambda: attention(q, torch.randn(2, 3, 6, 8), torch.randn(2, 3, 6, 8))),  # 4 % 3
        ("v", lambda: attention(q, k, v[:, :, :5])),  # Lk mismatch
        ("v", lambda: attention(q, k, v[:, :1])),  # Hkv mismatch
        ("k", lambda: attention(q, k.double(), v)),
        ("q", lambda: attention(q.int(), k.int(), v.int())),
        ("mask", lambda: attention(q, k, v, mask=torch.ones(5, 7, dtype=torch.bool))),
        ("mask", lambda: attention(q, k, v, mask=torch.ones(3, 4, 5, 6, dtype=torch.bool))),
        ("mask", lambda: attention(q, k, v, mask=torch.ones(1, 2, 4, 5, 6, dtype=torch.bool))),
        ("mask", lambda: attention(q, k, v, mask=torch.ones(5, 6, dtype=torch.int64))),
        ("key_lengths", lambda: attention(q, k, v, key_lengths=torch.tensor([1.0, 2.0]))),
        ("key_lengths", lambda: attention(q, k, v, key_lengths=torch.tensor([1, 2, 3]))),
        ("window", lambda: attention(q, k, v, window=0)),
        ("scale", lambda: attention(q, k, v, scale=float("nan"))),
        ("scale", lambda: attention(q, k, v, scale=float("inf"))),
        ("scale", lambda: attention(q, k, v, scale=float("nan"), dropout_p=0.1)),
        ("dropout_p", lambda: attention(q, k, v, dropout_p=1.5)),
        ("mask", lambda: attention(q, k, v, mask=torch.ones(5, 7, dtype=torch.bool), dropout_p=0.1)),
    ]
    for name, call in cases:
        with pytest.raises(ValueError, match=name):
            call()


def test_backward_bad_inputs_raise():
    q, k, v = _inputs((1, 2, 2, 5, 6, 8, 8), torch.float32, "cpu", requires_grad=False)
    out, lse = torch.ops.pytransformer.attention(q, k, v, None, False, None, None, 0.5)
    bwd = torch.ops.pytransformer.attention_backward
    with pytest.raises(ValueError, match="grad_out"):
        bwd(out[..., :4], q, k, v, out, lse, None, False, None, None, 0.5)
    with pytest.raises(ValueError, match="lse"):
        bwd(out, q, k, v, out, lse[..., :4], None, False, None, None, 0.5)
    with pytest.raises(ValueError, match="out"):
        bwd(out, q, k, v, out.double(), lse, None, False, None, None, 0.5)


def test_exported():
    assert pytransformer.ops.attention is attention


# ---- CUDA only (skipped without a GPU and a CUDA build) ----
cuda = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not (torch.cuda.is_available() and pytransformer.with_cuda()),
                                reason="needs a GPU and a CUDA build")


def _rel_err(actual, expected):
    return ((actual.double() - expected).norm() / expected.norm().clamp_min(1e-30)).item()


def _assert_within_twice_sdpa(ours, theirs, expected):
    """(out, grad_q, grad_k, grad_v) of ours and of SDPA against the float64 ones: our error at most twice SDPA's."""
    for name, a, t, e in zip(("out", "grad_q", "grad_k", "grad_v"), ours, theirs, expected):
        ours_err, sdpa_err = _rel_err(a, e), _rel_err(t, e)
        assert ours_err <= 2 * sdpa_err + 1e-6, f"{name}: error {ours_err:.3g} vs SDPA's {sdpa_err:.3g}"


def _sdpa_with_grads(q, k, v, grad, **kwargs):
    """SDPA's (out, grad_q, grad_k, grad_v) from its default backends, or from its math backend where those are not
    finite: on an H200 with torch 2.11 they return NaN for a zero or negative scale."""
    for backends in ([], [SDPBackend.MATH]):
        with sdpa_kernel(backends) if backends else contextlib.nullcontext():
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
            result = (out, *torch.autograd.grad(out, (q, k, v), grad))
        if all(t.isfinite().all() for t in result):
            break
    return result


def _sdpa_mask(kind, b, lq, lk, dtype, device):
    """(our keyword arguments, the same mask as an SDPA attn_mask [B, 1, Lq, Lk] or None); every row sees a key. A
    float mask is rounded to dtype for both."""
    if kind == "none":
        return {}, None
    if kind == "causal":
        return {"causal": True}, visible_keys(lq, lk, causal=True, device=device)
    if kind == "bool":
        keep = torch.rand(b, 1, lq, lk, device=device) < 0.7
        keep[..., 0] = True
        return {"mask": keep}, keep
    if kind == "float":
        bias = torch.randn(b, 1, lq, lk, device=device).to(dtype)
        return {"mask": bias}, bias
    assert kind == "key_lengths"
    lengths = torch.randint(1, lk + 1, (b,), device=device)
    return {"key_lengths": lengths}, (torch.arange(lk, device=device) < lengths[:, None])[:, None, None, :]


@cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 128, 256])
@pytest.mark.parametrize("kind", ["none", "causal", "bool", "float", "key_lengths"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (4, 1)], ids=lambda h: f"Hq{h[0]}-Hkv{h[1]}")
def test_cuda_low_precision_error_within_twice_sdpa(dtype, head_dim, kind, heads):
    """Forward and gradients in bf16/fp16: error vs float64 at most 2x that of F.scaled_dot_product_attention."""
    hq, hkv = heads
    b, lq, lk = 2, 200, 200 if kind == "causal" else 173
    q, k, v = (torch.randn(b, h, n, head_dim, device="cuda", dtype=dtype, requires_grad=True)
               for h, n in ((hq, lq), (hkv, lk), (hkv, lk)))
    kwargs, sdpa_mask = _sdpa_mask(kind, b, lq, lk, dtype, "cuda")
    grad = torch.randn(b, hq, lq, head_dim, device="cuda", dtype=dtype)
    out = attention(q, k, v, **kwargs)
    ours = (out, *torch.autograd.grad(out, (q, k, v), grad))
    theirs = _sdpa_with_grads(q, k, v, grad, attn_mask=sdpa_mask, enable_gqa=hkv != hq)
    expected = _reference(q, k, v, grad, **kwargs)
    _assert_within_twice_sdpa(ours, theirs, expected)


@cuda
@needs_cuda
@pytest.mark.parametrize("scale", [0.3, -0.3, 0.0, 30.0])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_low_precision_any_scale_sign(scale, causal):
    """The tensor-core kernels keep clean tiles' scores unscaled for a positive scale (the scale goes into the
    exponent and the row max); a negative or zero scale takes the other path; 30 gives logits in the hundreds, which
    overflow exp2 unless the row max is in the same units as the exponent. Against float64, within 2x of SDPA's
    error."""
    q, k, v = _inputs((2, 4, 2, 150, 150, 64, 64), torch.bfloat16, "cuda")
    grad = torch.randn(2, 4, 150, 64, device="cuda", dtype=torch.bfloat16)
    out = attention(q, k, v, causal=causal, scale=scale)
    ours = (out, *torch.autograd.grad(out, (q, k, v), grad))
    theirs = _sdpa_with_grads(q, k, v, grad, is_causal=causal, scale=scale, enable_gqa=True)
    expected = _reference(q, k, v, grad, causal=causal, scale=scale)
    _assert_within_twice_sdpa(ours, theirs, expected)


@cuda
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_deterministic_backward_is_bitwise_reproducible(dtype):
    q, k, v = _inputs((2, 8, 2, 300, 300, 64, 64), dtype, "cuda")
    grad = torch.randn(2, 8, 300, 64, device="cuda", dtype=dtype)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        runs = [torch.autograd.grad(attention(q, k, v, causal=True), (q, k, v), grad) for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(previous)
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@cuda
@needs_cuda
def test_cuda_compile_fullgraph_forward_backward():
    q, k, v = _inputs((2, 4, 2, 40, 48, 64, 64), torch.bfloat16, "cuda")
    lengths = torch.tensor([48, 13], device="cuda")

    def f(q, k, v):
        return attention(q, k, v, causal=True, key_lengths=lengths).float().square().sum()

    _assert_compiled_matches(f, (q, k, v))


@cuda
@needs_cuda
def test_cuda_head_dim_limit_raises():
    q = torch.randn(1, 1, 4, 520, device="cuda")
    with pytest.raises(ValueError, match="q"):
        attention(q, q, q)
    with pytest.raises(ValueError, match="float64"):
        attention(q.double(), q.double(), q.double())


# ---- The CUDA kernels on every path: on a GPU, or through the host emulator (--cuda-emulator) ----

@pytest.mark.cuda
def test_cuda_kernels(kernel_target):
    """The CUDA attention kernels (tensor-core and SIMT, forward and backward) on every mask and layout
    (pytransformer/check.py) against float64 references; the emulator runs the quick list even with --cuda-full."""
    full = kernel_target.full and not kernel_target.emulated
    shapes = kc.ATTENTION_SHAPES if full else kc.ATTENTION_SHAPES_QUICK
    assert kernel_target.run(lambda c: c.check_attention(shapes)) == []


@pytest.mark.cuda
def test_cuda_kernels_across_tiles(kernel_target):
    """Every tensor-core head-dim family over 2 query tiles and 3 key tiles (online-softmax rescaling, prefetch of the
    next tiles, stage barriers, clean tiles), masked and unmasked, GQA, both dQ modes (pytransformer/check.py)."""
    assert kernel_target.run(lambda c: c.check_attention_cases(kc.ATTENTION_TILE_CASES)) == []


@pytest.mark.cuda
def test_cuda_deterministic_backward_of_every_head_dim(kernel_target):
    """The deterministic backward's kernels (dQ without atomics) of every head-dim family, float16 and bfloat16."""
    assert kernel_target.run(lambda c: c.check_attention_cases(kc.ATTENTION_DETERMINISTIC_CASES)) == []


@pytest.mark.cuda
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_attention_probabilities_through_identity_values(kernel_target, dtype, head_dim):
    """With v the identity (Dv = Lk), attention's output is its probability matrix P, so the CUDA kernels' P is
    compared with float64's row by row; a failure says how it differs: row sums, how sharp the rows are, whether the
    argmax agrees, and which scale (if any) the rows match. (The half-precision kernels gave wrong results on an
    H100 where the emulator passes: this shows what they computed.)"""
    ops, device = kernel_target.ops, kernel_target.device
    lq, lk, scale = 40, 64, head_dim ** -0.5
    q, k = torch.randn(1, 1, lq, head_dim, dtype=dtype), torch.randn(1, 1, lk, head_dim, dtype=dtype)
    v = torch.eye(lk, dtype=dtype)[None, None]
    p = ops.attention(q.to(device), k.to(device), v.to(device), None, False, None, None, scale)[0][0, 0].double().cpu()
    scores = (q.double() @ k.double().transpose(-1, -2))[0, 0]
    ref = torch.softmax(scores * scale, dim=-1)
    err = (p - ref).abs().max().item()
    if err <= 2 * tolerance(dtype)[0] + kc.TOL[dtype]:
        return
    fits = {f: (p - torch.softmax(scores * scale * f, dim=-1)).abs().max().item() for f in (0, 0.5, 2, 8, 64, 1e4)}
    assert False, (f"P differs by {err:.3g}: row sums {p.sum(-1).min():.3g}..{p.sum(-1).max():.3g}, largest entry "
                   f"per row {p.max(-1).values.mean():.3g} (float64 {ref.max(-1).values.mean():.3g}), argmax agrees "
                   f"in {(p.argmax(-1) == ref.argmax(-1)).double().mean():.0%} of rows, P^T error "
                   f"{(p[:, :lq] - ref[:, :lq].T).abs().max():.3g}, error against other scales (x factor): "
                   + ", ".join(f"x{f:g} {e:.3g}" for f, e in fits.items()))


@pytest.mark.cuda
def test_cuda_tensor_cores_only_from_compute_capability_8(kernel_target):
    """float16 attention takes the tensor-core kernels on a device of compute capability 8.0 or later and the SIMT
    kernels before (their tensor-core kernels are empty in code built for 7.x); the same results either way. Emulated:
    the pretend device's capability and the kernels it launched."""
    if not kernel_target.emulated:
        pytest.skip("the emulator pretends to be devices of other compute capabilities")
    ops = kernel_target.ops
    q, k, v = (torch.randn(1, 2, 20, 64, dtype=torch.float16) for _ in range(3))
    ref = reference.attention(q.double(), k.double(), v.double(), causal=True, scale=0.125)
    try:
        for cc, family in ((75, "attention_simt_fwd_kernel"), (80, "attention_mma_fwd_kernel")):
            ops.set_device(2, 2, cc)
            ops.launched_kernels()
            out = ops.attention(q, k, v, None, True, None, None, 0.125)[0]
            launched = ops.launched_kernels()
            assert any(family in name for name in launched), (cc, launched)
            assert not any("attention_mma" in name for name in launched) or cc >= 80
            torch.testing.assert_close(out.double(), ref, atol=2e-3, rtol=2e-3)
    finally:
        ops.set_device(2, 2, 90)


@pytest.mark.cuda
@pytest.mark.parametrize("name, value", POISONS, ids=str)
@pytest.mark.parametrize("kind", POISON_KINDS)
def test_cuda_nan_behind_a_mask_does_not_leak(kernel_target, kind, name, value):
    """The SIMT kernels (float32) keep every hidden key out, as the CPU's do."""
    check_hidden_poison(kernel_target.ops, POISON_SHAPES[0], kind, torch.float32, kernel_target.device, name, value)


@pytest.mark.cuda
@pytest.mark.parametrize("name, value, dtype, deterministic", [
    *[(name, value, torch.bfloat16, False) for name, value in POISONS],
    ("v", float("nan"), torch.float16, True), ("k", float("-inf"), torch.float16, True)], ids=str)
@pytest.mark.parametrize("kind", POISON_KINDS)
def test_cuda_tensor_cores_keep_hidden_keys_out(kernel_target, kind, name, value, dtype, deterministic):
    """The tensor-core kernels (the head-dim-64 family) keep every hidden key out too, where a hidden key shares a key
    tile with keys its query's block sees (the products run inside mma.sync, where 0 x NaN is NaN), in both backward
    modes: the dQ of atomics and, in float16, the deterministic dQ kernel."""
    with deterministic_algorithms(deterministic):
        check_hidden_poison(kernel_target.ops, POISON_SHAPES[0], kind, dtype, kernel_target.device, name, value)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_tensor_cores_keep_key_padding_and_masked_scores_out(kernel_target, dtype):
    """The tensor-core kernels load key padding as zeros: NaN and inf in K and V past key_lengths leave the output and
    the gradients as they were (bit for bit, but for dQ's atomic sums). A NaN K row at a key that a mask hides scores
    -inf: the output stays bit for bit too."""
    ops, device = kernel_target.ops, kernel_target.device
    b, hq, hkv, lq, lk, d = 2, 4, 2, 40, 150, 64
    q, k, v = _inputs((b, hq, hkv, lq, lk, d, d), dtype, device, requires_grad=False)
    grad = torch.randn(b, hq, lq, d, dtype=dtype, device=device)
    lengths = torch.tensor([100, 70], device=device)
    mask = torch.rand(1, 1, lq, lk, device=device) < 0.8
    mask[..., 30] = False
    clean = _run_op(ops, q, k, v, grad, {"key_lengths": lengths})
    masked = _run_op(ops, q, k, v, grad, {"mask": mask, "causal": True})[0]
    bad_k, bad_v = k.clone(), v.clone()
    bad_k[0, :, 100:], bad_v[0, :, 100:] = float("nan"), float("inf")
    bad_k[1, :, 70:], bad_v[1, :, 70:] = float("-inf"), float("nan")
    for name, actual, expected in zip(("out", "grad_q", "grad_k", "grad_v"),
                                      _run_op(ops, q, bad_k, bad_v, grad, {"key_lengths": lengths}), clean):
        if name == "grad_q":  # float32 atomics: the order of the sums may differ from run to run
            torch.testing.assert_close(actual, expected)
        else:
            assert torch.equal(actual, expected), name
    bad_k = k.clone()
    bad_k[:, :, 30] = float("nan")
    assert torch.equal(_run_op(ops, q, bad_k, v, grad, {"mask": mask, "causal": True})[0], masked)
