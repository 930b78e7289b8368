"""MultiHeadAttention against plain-PyTorch attention (float64): self/cross, GQA/MQA, masks, rotary, window, cache,
heads of their own width with q/k norms."""
import pytest
import torch
import torch.nn.functional as F

from pytransformer.nn import KVCache, MultiHeadAttention, RotaryEmbedding


def reference_mha(m, x, context=None, *, mask=None, causal=False, key_lengths=None, positions=None):
    """The same projections and attention with F.scaled_dot_product_attention and explicit masks."""
    ctx = x if context is None else context
    w, b = m.qkv_proj.weight, m.qkv_proj.bias
    b = torch.zeros(w.shape[0], dtype=w.dtype) if b is None else b
    dq, dkv, d = m.q_dim, m.kv_dim, m.head_dim
    q = F.linear(x, w[:dq], b[:dq]).unflatten(-1, (m.n_heads, d)).transpose(1, 2)
    k = F.linear(ctx, w[dq:dq + dkv], b[dq:dq + dkv]).unflatten(-1, (m.n_kv_heads, d)).transpose(1, 2)
    v = F.linear(ctx, w[dq + dkv:], b[dq + dkv:]).unflatten(-1, (m.n_kv_heads, d)).transpose(1, 2)
    if m.q_norm is not None:
        q, k = F.rms_norm(q, (d,), m.q_norm.weight, m.q_norm.eps), F.rms_norm(k, (d,), m.k_norm.weight, m.k_norm.eps)
    if m.rotary is not None and context is None:
        q, k = m.rotary(q, positions), m.rotary(k, positions)
    k = k.repeat_interleave(m.n_heads // m.n_kv_heads, 1)
    v = v.repeat_interleave(m.n_heads // m.n_kv_heads, 1)
    lq, lk = q.shape[2], k.shape[2]
    keep = torch.ones(x.shape[0], 1, lq, lk, dtype=torch.bool)
    i, j = torch.arange(lq)[:, None] + lk - lq, torch.arange(lk)
    if causal or m.window is not None:
        keep = keep & (j <= i)
    if m.window is not None:
        keep = keep & (j > i - m.window)
    if key_lengths is not None:
        keep = keep & (j < key_lengths[:, None, None, None])
    bias = torch.zeros(keep.shape, dtype=x.dtype).masked_fill(~keep, float("-inf"))
    if mask is not None:
        bias = bias + (torch.zeros(mask.shape, dtype=x.dtype).masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else mask)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return m.out_proj(y.transpose(1, 2).flatten(2))


@pytest.mark.parametrize("n_heads,n_kv_heads", [(4, None), (4, 2), (4, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_self_attention(n_heads, n_kv_heads, causal, bias):
    m = MultiHeadAttention(32, n_heads, n_kv_heads, bias=bias).double()
    x = torch.randn(3, 7, 32, dtype=torch.float64)
    lengths = torch.tensor([7, 3, 5])
    torch.testing.assert_close(m(x, causal=causal, key_lengths=lengths),
                               reference_mha(m, x, causal=causal, key_lengths=lengths))


@pytest.mark.parametrize("n_kv_heads", [None, 1])
def test_cross_attention_with_masks(n_kv_heads):
    m = MultiHeadAttention(32, 4, n_kv_heads).double()
    x, mem = torch.randn(2, 5, 32, dtype=torch.float64), torch.randn(2, 9, 32, dtype=torch.float64)
    bool_mask = torch.rand(2, 1, 5, 9) > 0.3
    bool_mask[..., 0] = True
    float_mask = torch.randn(1, 4, 5, 9, dtype=torch.float64)
    for mask in (bool_mask, float_mask):
        torch.testing.assert_close(m(x, mem, mask=mask), reference_mha(m, x, mem, mask=mask))
    lengths = torch.tensor([9, 4])
    torch.testing.assert_close(m(x, mem, key_lengths=lengths), reference_mha(m, x, mem, key_lengths=lengths))


def _head_width_module(rotary=True, window=None, n_kv_heads=2):
    """Heads of 12 at d_model 32 (q: 48 wide, out_proj 48 -> 32), with q/k RMSNorms of random weights."""
    m = MultiHeadAttention(32, 4, n_kv_heads, rotary=RotaryEmbedding(12) if rotary else None, window=window, d_head=12,
                           qk_norm=True, qk_norm_eps=1e-5).double()
    with torch.no_grad():
        m.q_norm.weight.uniform_(0.5, 1.5)
        m.k_norm.weight.uniform_(0.5, 1.5)
    return m


@pytest.mark.parametrize("rotary", [False, True])
def test_head_width_and_qk_norm(rotary):
    m = _head_width_module(rotary)
    assert m.q_dim == 48 and m.qkv_proj.weight.shape == (96, 32) and m.out_proj.weight.shape == (32, 48)
    assert m.q_norm.eps == 1e-5
    x, mem = torch.randn(2, 7, 32, dtype=torch.float64), torch.randn(2, 5, 32, dtype=torch.float64)
    lengths = torch.tensor([7, 3])
    torch.testing.assert_close(m(x, causal=True, key_lengths=lengths),
                               reference_mha(m, x, causal=True, key_lengths=lengths, positions=torch.arange(7)))
    torch.testing.assert_close(m(x, mem), reference_mha(m, x, mem))
    x.requires_grad_()
    m(x, causal=True).sum().backward()
    assert m.q_norm.weight.grad.abs().sum() > 0 and m.k_norm.weight.grad.abs().sum() > 0


def test_rotary_and_window():
    m = MultiHeadAttention(32, 4, 2, rotary=RotaryEmbedding(8), window=3).double()
    x = torch.randn(2, 10, 32, dtype=torch.float64)
    torch.testing.assert_close(m(x, causal=True), reference_mha(m, x, causal=True, positions=torch.arange(10)))


@pytest.mark.parametrize("rotary,window,head_width", [(False, None, False), (True, None, False), (True, 4, False),
                                                      (True, None, True), (True, 4, True)])
def test_cached_steps_equal_full_causal(rotary, window, head_width):
    if head_width:  # heads of 12 with q/k norms
        m = _head_width_module(rotary, window).eval()
    else:
        m = MultiHeadAttention(32, 4, 2, rotary=RotaryEmbedding(8) if rotary else None, window=window).double().eval()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    full = m(x, causal=True)
    cache = KVCache(1, 2, 2, m.head_dim, 12, dtype=torch.float64)
    with torch.no_grad():
        outs = []
        for lo, hi in [(0, 4), (4, 5), (5, 6), (6, 9)]:
            outs.append(m(x[:, lo:hi], cache=cache.layers(hi - lo)[0].self_attn))
            cache.advance(hi - lo)
    torch.testing.assert_close(torch.cat(outs, 1), full.detach())


@pytest.mark.parametrize("n_kv_heads,window", [(2, None), (1, 3), (4, 8)])
@torch.no_grad()
def test_prompt_into_empty_cache_equals_cached_rows_path(n_kv_heads, window):
    """A prompt into an empty cache (host bound 0) takes ops.attention over its own rows; with the bound unknown the
    same prompt goes through decode_attention over the cache: both equal the float64 reference and store the same
    K/V."""
    m = MultiHeadAttention(32, 4, n_kv_heads, rotary=RotaryEmbedding(8), window=window).double().eval()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    outs, caches = [], []
    for bound in (0, None):
        cache = KVCache(1, 2, n_kv_heads, 8, 9, dtype=torch.float64)
        cache.max_length = bound
        outs.append(m(x, cache=cache.layers(7)[0].self_attn))
        caches.append(cache)
    reference = reference_mha(m, x, causal=True, positions=torch.arange(7))
    for out in outs:
        torch.testing.assert_close(out, reference)
    torch.testing.assert_close(caches[0].k[0], caches[1].k[0], rtol=0, atol=0)
    torch.testing.assert_close(caches[0].v[0], caches[1].v[0], rtol=0, atol=0)


@pytest.mark.parametrize("cache_dtype,tol", [(torch.float32, {"rtol": 1e-5, "atol": 1e-5}),
                                             (torch.bfloat16, {"rtol": 2e-2, "atol": 2e-2})])
@pytest.mark.parametrize("capacity,window", [(12, None), (12, 3), (4, 4)])
@torch.no_grad()
def test_cache_of_another_dtype(cache_dtype, tol, capacity, window):
    """A float64 module over a cache of a narrower dtype: a prompt (tiled attention, or a rolling buffer), then single
    tokens, then a chunk whose rows are not known to be uniform (decode_attention) give x's dtype and equal the float64
    reference to the cache dtype's precision; the cache holds the keys rounded to its dtype; cross-attention too (no
    window)."""
    m = MultiHeadAttention(32, 4, 2, rotary=RotaryEmbedding(8), window=window).double().eval()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    cache = KVCache(1, 2, 2, 8, capacity, dtype=cache_dtype)
    outs = []
    for lo, hi in [(0, 5), (5, 6), (6, 7), (7, 9)]:
        if hi == 9:
            cache.max_length = None  # lengths unknown on the host: decode_attention
        outs.append(m(x[:, lo:hi], cache=cache.layers(hi - lo)[0].self_attn))
        cache.advance(hi - lo)
    out = torch.cat(outs, 1)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, reference_mha(m, x, causal=True, positions=torch.arange(9)), **tol)
    if capacity == 12:
        k = m.project_kv(x)[0]
        k = m.rotary(k, torch.arange(9))
        torch.testing.assert_close(cache.k[0][:, :, :9], k.to(cache_dtype), rtol=0, atol=0)
    if window is not None:
        return
    mem = torch.randn(2, 6, 32, dtype=torch.float64)
    cross = KVCache(1, 2, 2, 8, 1, memory_length=6, dtype=cache_dtype)
    for t, new in zip(cross.cross_k + cross.cross_v, m.project_kv(mem)):
        t.copy_(new)
    y = m(x, cache=cross.layers(9)[0].cross_attn)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, reference_mha(m, x, mem), **tol)


@pytest.mark.parametrize("cross,n_kv_heads,causal,window", [(True, 1, False, None), (False, 2, True, None),
                                                          (False, 4, False, 3)])
def test_attention_weights_reproduce_forward(cross, n_kv_heads, causal, window):
    m = MultiHeadAttention(32, 4, n_kv_heads, window=window).double()
    x, mem = torch.randn(2, 6, 32, dtype=torch.float64), torch.randn(2, 9, 32, dtype=torch.float64)
    context = mem if cross else None
    lengths = torch.tensor([9, 4]) if cross else torch.tensor([6, 3])
    probs = m.attention_weights(x, context, key_lengths=lengths, causal=causal)  # [B, H, Lq, Lk]
    assert probs.shape == (2, 4, 6, 9 if cross else 6)
    _, v = m.project_kv(x if context is None else context)
    y = probs @ v.repeat_interleave(4 // n_kv_heads, 1)  # [B, H, Lq, D]
    torch.testing.assert_close(m.out_proj(y.transpose(1, 2).flatten(2)),
                               m(x, context, key_lengths=lengths, causal=causal))


def test_gradients_flow():
    m = MultiHeadAttention(16, 2).double()
    x = torch.randn(2, 4, 16, dtype=torch.float64, requires_grad=True)
    m(x, causal=True).sum().backward()
    assert x.grad.abs().sum() > 0 and m.qkv_proj.weight.grad.abs().sum() > 0


def test_bad_arguments():
    with pytest.raises(ValueError, match="n_heads"):
        MultiHeadAttention(30, 4)
    for d_head in (0, 2.5):
        with pytest.raises(ValueError, match="d_head"):
            MultiHeadAttention(32, 4, d_head=d_head)
    with pytest.raises(ValueError, match="n_kv_heads"):
        MultiHeadAttention(32, 4, 3)
    m = MultiHeadAttention(16, 2)
    cache = KVCache(1, 1, 2, 8, 4)
    with pytest.raises(ValueError, match="mask"):
        m(torch.randn(1, 1, 16), mask=torch.ones(1, 1, 1, 1, dtype=torch.bool), cache=cache.layers(1)[0].self_attn)
