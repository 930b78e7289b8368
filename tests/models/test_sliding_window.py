"""Sliding-window models with a rolling KV cache (a cache of W rows per layer is one, position i in row i % W): cached
generation equals uncached generation with the same window for prompts shorter and longer than W, chunks of any size
equal the full windowed forward, the cache's memory stays fixed, torch.compile, errors."""
import pytest
import torch

from pytransformer.models import DecoderLM, gpt2_small
from pytransformer.nn import KVCache, MultiHeadAttention, RotaryEmbedding
from pytransformer.nn.kv_cache import is_rolling
from tests.helpers import varied

V = 64


def tiny(window, **overrides):
    torch.manual_seed(0)
    model = DecoderLM(gpt2_small(**{"vocab_size": V, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64,
                                    "max_len": 64, "dropout": 0.0, "window": window, **overrides}))
    return varied(model.double().eval())


@pytest.mark.parametrize("window", [1, 3, 5])
@pytest.mark.parametrize("overrides", [{}, {"positional": "rotary", "n_kv_heads": 2}, {"norm": "post"}])
def test_generation_equals_uncached(window, overrides):
    model = tiny(window, **overrides)
    cache = model.new_cache(2, 40)
    assert cache.capacity == window
    for length in sorted({1, window, 3 * window + 2}):  # shorter than, equal to and longer than W
        prompt = torch.randint(0, V, (2, length))
        out = model.generate(prompt, 12)
        assert out.shape == (2, length + 12)
        assert torch.equal(out, model.generate(prompt, 12, use_cache=False))


def test_padded_prompts_longer_than_window():
    model = tiny(4, positional="rotary")
    lengths = torch.tensor([11, 2, 5, 9])
    prompt = torch.randint(0, V, (4, 11))
    out = model.generate(prompt, 10, key_lengths=lengths)
    for b, n in enumerate(lengths.tolist()):
        assert torch.equal(out[b, 11:], model.generate(prompt[b:b + 1, :n], 10, use_cache=False)[0, n:])


def test_beam_search_and_sampling():
    model = tiny(3)
    prompt = torch.randint(0, V, (2, 7))
    assert torch.equal(model.generate(prompt, 8, beam_size=3), model.generate(prompt, 8, beam_size=3, use_cache=False))
    sample = lambda **kw: model.generate(prompt, 8, do_sample=True, generator=torch.Generator().manual_seed(5), **kw)  # noqa: E731
    assert torch.equal(sample(), sample(use_cache=False))


@torch.no_grad()
def test_memory_stays_fixed_and_logits_match():
    window = 4
    model = tiny(window)
    ids = torch.randint(0, V, (3, 30))
    full = model(ids)  # [3, 30, V]: uncached, windowed
    cache = model.new_cache(3, 1000)
    tensors = cache.k + cache.v
    layout = [(t.data_ptr(), t.shape) for t in tensors]
    assert all(t.shape == (3, 4, window, 8) for t in tensors)
    steps = [model.lm_head(model.prefill(ids[:, :10], cache))]  # chunks of W tokens
    steps += [model(ids[:, t:t + 1], cache=cache) for t in range(10, 30)]
    assert [(t.data_ptr(), t.shape) for t in cache.k + cache.v] == layout
    assert cache.lengths.tolist() == [30, 30, 30]
    torch.testing.assert_close(torch.cat(steps, 1), full)


@pytest.mark.parametrize("n_kv_heads", [None, 1])
@torch.no_grad()
def test_chunks_of_any_size(n_kv_heads):
    """MultiHeadAttention over a rolling cache fed in chunks shorter and longer than W equals full windowed attention."""
    window, d = 5, 32
    attn = MultiHeadAttention(d, 4, n_kv_heads, window=window, rotary=RotaryEmbedding(8, 64)).double().eval()
    x = torch.randn(2, 40, d, dtype=torch.float64)
    full = attn(x)
    kv = KVCache(1, 2, n_kv_heads or 4, 8, window, dtype=torch.float64)
    out, start = [], 0
    for size in [1, 3, 1, 7, 5, 2, 12, 1, 8]:
        out.append(attn(x[:, start:start + size], cache=kv.layers(size)[0].self_attn))
        kv.advance(size)
        start += size
    torch.testing.assert_close(torch.cat(out, 1), full)


def test_compile():
    model = tiny(3)
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        want = model(ids)
        cache = model.new_cache(2, 20)
        step = torch.compile(lambda t: model(t, cache=cache), fullgraph=True, backend="aot_eager")
        got = [step(ids[:, :3]), step(ids[:, 3:6])] + [step(ids[:, t:t + 1]) for t in range(6, 9)]
    torch.testing.assert_close(torch.cat(got, 1), want)


def test_errors():
    for window in (0, -2):
        with pytest.raises(ValueError, match="window: expected a positive number of keys"):
            MultiHeadAttention(16, 2, window=window)
        with pytest.raises(ValueError, match="window"):
            tiny(window)


@pytest.mark.parametrize("capacity,rolling", [(4, True), (5, False), (3, False)])
@torch.no_grad()
def test_the_window_is_the_attentions(capacity, rolling):
    """A cache of exactly W rows is a rolling buffer for attention of window W (it wraps); one of other rows is a
    plain cache for it (up to its capacity) and for attention without a window."""
    attn = MultiHeadAttention(16, 2, window=4).double().eval()
    x = torch.randn(1, 7, 16, dtype=torch.float64)
    assert is_rolling(capacity, attn.window) == rolling and not is_rolling(capacity, None)
    cache = KVCache(1, 1, 2, 8, capacity, dtype=torch.float64)
    steps = 7 if rolling else capacity
    out = []
    for t in range(steps):
        out.append(attn(x[:, t:t + 1], cache=cache.layers(1)[0].self_attn))
        cache.advance(1)
    torch.testing.assert_close(torch.cat(out, 1), attn(x[:, :steps]))


def test_short_generation_keeps_a_plain_cache():
    model = tiny(8)
    cache = model.new_cache(1, 7)
    assert not is_rolling(cache.capacity, model.config.window) and cache.capacity == 7
    prompt = torch.randint(0, V, (1, 3))
    assert torch.equal(model.generate(prompt, 5), model.generate(prompt, 5, use_cache=False))
