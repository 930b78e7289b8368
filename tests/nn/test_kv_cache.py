"""KVCache: cached decoding through the decoder stack equals full causal decoding (every norm, GQA, padded rows)."""
import pytest
import torch

from pytransformer.nn import KVCache, RotaryEmbedding, TransformerDecoder

D, H = 32, 4


def _decoder(norm="pre", n_kv_heads=None, cross=True, rotary=False):
    return TransformerDecoder(2, D, H, 64, norm=norm, n_kv_heads=n_kv_heads, dropout=0.0, cross_attention=cross,
                              rotary=RotaryEmbedding(D // H) if rotary else None).double().eval()


@pytest.mark.parametrize("norm", ["post", "pre", "sandwich"])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
@torch.no_grad()
def test_cached_equals_full(norm, n_kv_heads):
    dec = _decoder(norm, n_kv_heads)
    x, mem = torch.randn(2, 8, D, dtype=torch.float64), torch.randn(2, 5, D, dtype=torch.float64)
    mem_len = torch.tensor([5, 3])
    full = dec(x, mem, memory_key_lengths=mem_len)
    cache = KVCache(2, 2, n_kv_heads or H, D // H, 10, memory_length=5, dtype=torch.float64)
    dec.cache_memory(cache, mem, mem_len)
    steps = [dec(x[:, :3], cache=cache)] + [dec(x[:, t:t + 1], cache=cache) for t in range(3, 8)]
    torch.testing.assert_close(torch.cat(steps, 1), full)
    assert cache.lengths.tolist() == [8, 8] and cache.memory_lengths.tolist() == [5, 3]


@torch.no_grad()
def test_padded_prompts_batch_together():
    dec = _decoder(cross=False, rotary=True)
    lengths = torch.tensor([5, 2, 4])
    prompt, nxt = torch.randn(3, 5, D, dtype=torch.float64), torch.randn(3, 1, D, dtype=torch.float64)
    cache = KVCache(2, 3, H, D // H, 8, dtype=torch.float64)
    dec(prompt, key_lengths=lengths, cache=cache)
    assert cache.lengths.tolist() == [5, 2, 4]
    batched = dec(nxt, cache=cache)
    for b, n in enumerate(lengths.tolist()):
        alone = dec(torch.cat([prompt[b:b + 1, :n], nxt[b:b + 1]], 1))[:, -1:]
        torch.testing.assert_close(batched[b:b + 1], alone)


@torch.no_grad()
def test_cache_over_existing_tensors():
    """KVCache.over: a view of another cache's tensors (not copies) without a host-side bound; steps through it write
    into those tensors and equal the steps through the cache itself."""
    dec = _decoder(cross=False, rotary=True)
    x = torch.randn(2, 6, D, dtype=torch.float64)
    cache = KVCache(2, 2, H, D // H, 8, dtype=torch.float64)
    dec(x[:, :4], cache=cache)
    view = KVCache.over(cache.k, cache.v, cache.lengths)
    assert view.max_length is None and view.cross_k is None
    assert all(a is b for a, b in zip(view.k + view.v, cache.k + cache.v)) and view.lengths is cache.lengths
    steps = [dec(x[:, t:t + 1], cache=view) for t in (4, 5)]
    torch.testing.assert_close(torch.cat(steps, 1), dec(x)[:, 4:])
    assert cache.lengths.tolist() == [6, 6]


def test_reorder_and_reset():
    """reorder copies the rows' positions written so far (max_length of them; the whole capacity when unknown)."""
    cache = KVCache(2, 3, 1, 2, 4)
    for i, t in enumerate(cache.k):
        t.copy_(torch.arange(3.0)[:, None, None, None] + 10 * i)
    cache.lengths.copy_(torch.tensor([1, 2, 3]))
    cache.max_length = 3
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.lengths.tolist() == [3, 3, 1] and cache.k[1][:, 0, :3, 0].tolist() == [[12.0] * 3, [12.0] * 3,
                                                                                        [10.0] * 3]
    assert cache.k[1][:, 0, 3, 0].tolist() == [10.0, 11.0, 12.0]  # not written yet: not copied
    cache.max_length = None
    cache.reorder(torch.tensor([2, 0, 1]))
    assert cache.k[1][:, 0, :, 0].tolist() == [[10.0] * 3 + [12.0], [12.0] * 3 + [10.0], [12.0] * 3 + [11.0]]
    address = cache.k[0].data_ptr()
    cache.reset()
    assert cache.lengths.tolist() == [0, 0, 0] and cache.k[0].data_ptr() == address


def test_capacity_per_layer():
    """One capacity per layer (a windowed layer's rolling buffer beside a full one): each layer's tensors have their
    own rows; capacity is the largest; reorder copies each layer's written rows, at most its capacity."""
    cache = KVCache(2, 3, 1, 2, [2, 4])
    assert [t.shape[2] for t in cache.k + cache.v] == [2, 4, 2, 4] and cache.capacities == [2, 4]
    assert cache.capacity == 4
    for t in cache.k:
        t.copy_(torch.arange(3.0)[:, None, None, None])
    cache.max_length = 3
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.k[0][:, 0, :, 0].tolist() == [[2.0] * 2, [2.0] * 2, [0.0] * 2]
    assert cache.k[1][:, 0, :, 0].tolist() == [[2.0] * 3 + [0.0], [2.0] * 3 + [1.0], [0.0] * 3 + [2.0]]
    with pytest.raises(ValueError, match=r"capacity: expected one count or 2 \(one per layer\), got 3"):
        KVCache(2, 1, 1, 2, [2, 4, 8])


@torch.no_grad()
def test_decode_step_compiles_without_graph_breaks():
    dec = _decoder(n_kv_heads=2, cross=True).float()
    mem = torch.randn(2, 5, D)
    cache = KVCache(2, 2, 2, D // H, 6, memory_length=5)
    dec.cache_memory(cache, mem)
    step = torch.compile(lambda x: dec(x, cache=cache), fullgraph=True, backend="aot_eager")
    xs = torch.randn(2, 6, D)
    got = torch.cat([step(xs[:, t:t + 1]) for t in range(6)], 1)
    torch.testing.assert_close(got, dec(xs, mem), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_cache_is_one_mapping_of_zeros(dtype):
    """On the CPU the K/V tensors (self- and cross-attention) are zero, contiguous, separate views of one anonymous
    memory mapping each (page-aligned, outside malloc's heap), which lives as long as any of them."""
    import mmap
    cache = KVCache(3, 2, 2, 5, 7, memory_length=4, dtype=dtype)
    for group in (cache.k + cache.v, cache.cross_k + cache.cross_v):
        storage = group[0].untyped_storage()
        assert storage.data_ptr() % mmap.PAGESIZE == 0
        assert all(t.untyped_storage().data_ptr() == storage.data_ptr() for t in group)
        assert all(t.shape == group[0].shape and t.dtype == dtype and t.is_contiguous() for t in group)
        assert all(not t.any() for t in group)
    cache.k[1].fill_(1)
    assert cache.k[1].all() and not any(t.any() for t in cache.k[:1] + cache.k[2:] + cache.v)
    k = cache.k[2]
    del cache
    k.add_(2)  # the mapping outlives the cache
    assert k.eq(2).all()
    empty = KVCache(2, 0, 2, 5, 7)
    assert [t.shape for t in empty.k] == [(0, 2, 7, 5)] * 2
