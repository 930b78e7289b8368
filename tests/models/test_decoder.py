"""DecoderLM: cached generation equals uncached (every norm, GQA, rotary/window), padded prompts, sampling, beam
search, GPT-2 import, torch.compile of a training step and of a cached decode step."""

import sys

import pytest
import torch
import torch.nn.functional as F

from pytransformer import quantize
from pytransformer.models import DecoderLM, decoder, gpt2_small
from tests.helpers import assert_compiled_training_step_matches, cuda_only, emulated_capturing, varied

V = 64


def tiny(**overrides):
    torch.manual_seed(0)
    return varied(DecoderLM(gpt2_small(**{"vocab_size": V, "d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64,
                                          "max_len": 64, "dropout": 0.0, **overrides})).eval())


LLAMA_SHAPE = {"positional": "rotary", "activation": "swiglu", "norm_type": "rmsnorm", "norm": "pre", "n_kv_heads": 2}
# Gemma 3's: windowed layers and a full one (each its rotary base), sandwich norms, GeGLU, q/k norms, heads of 12
GEMMA_SHAPE = {"positional": "rotary", "activation": "geglu", "norm_type": "rmsnorm", "norm": "sandwich",
               "n_kv_heads": 2, "window": 4, "global_layers": (1,), "local_rope_theta": 100.0, "qk_norm": True,
               "d_head": 12, "scale_embeddings": True}


@pytest.mark.parametrize("norm", ["post", "pre", "sandwich"])
@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])
def test_cached_generation_equals_uncached(norm, n_kv_heads):
    model = tiny(norm=norm, n_kv_heads=n_kv_heads)
    prompt = torch.randint(0, V, (3, 6))
    out = model.generate(prompt, 12)
    assert out.shape == (3, 18) and torch.equal(out[:, :6], prompt)
    assert torch.equal(out, model.generate(prompt, 12, use_cache=False))


@pytest.mark.parametrize("overrides", [{"positional": "rotary"}, {"positional": "sinusoidal", "window": 4},
                                       {"activation": "swiglu", "positional": "rotary", "n_kv_heads": 2},
                                       GEMMA_SHAPE, {**GEMMA_SHAPE, "n_layers": 3, "global_layers": (0, 2)}])
def test_cached_generation_other_variants(overrides):
    model = tiny(**overrides)
    prompt = torch.randint(0, V, (2, 5))
    assert torch.equal(model.generate(prompt, 10), model.generate(prompt, 10, use_cache=False))


def test_per_layer_windows_and_rotary():
    model = tiny(**GEMMA_SHAPE)
    attn = [layer.self_attn for layer in model.decoder.layers]
    assert [a.window for a in attn] == [4, None] and [a.rotary.base for a in attn] == [100.0, 10000.0]
    assert model.embed.scale == 32 ** 0.5
    cache = model.new_cache(1, 10)  # the windowed layer's rolling buffer of `window` rows, the full layer's all 10
    assert cache.capacities == [4, 10] and cache.capacity == 10 and model.new_cache(1, 3).capacities == [3, 3]
    with pytest.raises(ValueError, match="global_layers: only with a window"):
        gpt2_small(global_layers=(0,))
    with pytest.raises(ValueError, match="global_layers: expected layer indices in"):
        gpt2_small(n_layers=2, window=4, global_layers=(2,))


def test_cached_logits_match_full_forward():
    model = tiny()
    ids = torch.randint(0, V, (2, 9))
    cache = model.new_cache(2, 9)
    with torch.no_grad():
        steps = [model(ids[:, :4], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(4, 9)]
        steps = torch.cat(steps, 1)
        torch.testing.assert_close(steps, model(ids), atol=1e-4, rtol=1e-5)  # logits of size 1 to 10


@pytest.mark.parametrize("overrides,padded", [({}, False), ({"positional": "rotary", "window": 5}, False),
                                              ({"positional": "rotary", "n_kv_heads": 2}, True), (GEMMA_SHAPE, True)])
def test_prefill_in_chunks_equals_one_forward(monkeypatch, overrides, padded):
    """A prompt of several PREFILL_CHUNKs (and a partial one): each chunk attends to the rows of those before it,
    through the tiled kernel while every row holds the same count, after a padded chunk through decode_attention."""
    monkeypatch.setattr(decoder, "PREFILL_CHUNK", 4)
    model = tiny(**overrides)
    ids = torch.randint(0, V, (3, 11))
    lengths = torch.tensor([11, 6, 9]) if padded else None
    cache = model.new_cache(3, 12)
    with torch.no_grad():
        hidden = model.prefill(ids, cache, lengths)
        for b in range(3):
            n = 11 if lengths is None else int(lengths[b])
            torch.testing.assert_close(hidden[b, :n], model.hidden(ids[b:b + 1, :n])[0], atol=1e-5, rtol=1e-5)
    assert cache.uniform != padded and cache.lengths.tolist() == ([11] * 3 if lengths is None else lengths.tolist())
    with torch.no_grad():  # last=True: each row's last prompt token alone
        last = model.prefill(ids, model.new_cache(3, 12), lengths, last=True)
    ends = torch.tensor([10] * 3) if lengths is None else lengths - 1
    torch.testing.assert_close(last, hidden[torch.arange(3), ends], atol=0, rtol=0)


def test_padded_prompts_equal_single_prompts():
    model = tiny()
    lengths = torch.tensor([6, 3, 5])
    prompt = torch.randint(0, V, (3, 6))
    out = model.generate(prompt, 8, key_lengths=lengths)
    for b, n in enumerate(lengths.tolist()):
        assert torch.equal(out[b, 6:], model.generate(prompt[b:b + 1, :n], 8)[0, n:])


def test_sampling():
    model = tiny()
    prompt = torch.randint(0, V, (4, 5))
    greedy = model.generate(prompt, 8)
    assert torch.equal(model.generate(prompt, 8, do_sample=True, top_k=1), greedy)
    assert torch.equal(model.generate(prompt, 8, do_sample=True, top_p=1e-6), greedy)
    sample = lambda seed, **kw: model.generate(prompt, 8, do_sample=True, temperature=2.0,  # noqa: E731
                                               generator=torch.Generator().manual_seed(seed), **kw)
    assert torch.equal(sample(1), sample(1)) and not torch.equal(sample(1), sample(2))
    assert torch.equal(sample(3, top_k=5, top_p=0.9), sample(3, top_k=5, top_p=0.9))


def test_eos_stops_rows():
    model = tiny()
    prompt = torch.randint(0, V, (2, 5))
    greedy = model.generate(prompt, 8)
    eos = int(greedy[0, 7])  # row 0 emits it at its 3rd new token
    out = model.generate(prompt, 8, eos_id=eos)
    first = (out[0, 5:] == eos).nonzero()[0, 0]
    assert (out[0, 5 + first:] == eos).all() and torch.equal(out[0, :5 + first], greedy[0, :5 + first])


@pytest.mark.parametrize("n_kv_heads", [None, 2])
def test_beam_search(n_kv_heads):
    model = tiny(n_kv_heads=n_kv_heads)
    prompt = torch.randint(0, V, (2, 5))
    assert torch.equal(model.generate(prompt, 8, beam_size=1), model.generate(prompt, 8))
    beams = model.generate(prompt, 8, beam_size=4, eos_id=3, length_penalty=0.6)
    assert torch.equal(beams, model.generate(prompt, 8, beam_size=4, eos_id=3, length_penalty=0.6, use_cache=False))
    assert torch.equal(beams[:, :5], prompt)


def test_beam_search_finds_higher_likelihood_than_greedy():
    model = tiny()
    prompt = torch.randint(0, V, (4, 4))

    def logprob(seq):
        with torch.no_grad():
            lp = torch.log_softmax(model(seq[:, :-1]), -1)[:, 3:]  # predictions of the new tokens
        return lp.gather(-1, seq[:, 4:, None]).sum((1, 2))
    assert (logprob(model.generate(prompt, 6, beam_size=5, length_penalty=0.0)) >=
            logprob(model.generate(prompt, 6)) - 1e-5).all()


def test_from_hf_reproduces_gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0,
        pad_token_id=0)).eval()
    ours = DecoderLM.from_hf(hf)
    ids = torch.randint(1, V, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf(ids).logits, atol=1e-5, rtol=1e-5)
    expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, min_new_tokens=10,
                           do_sample=False)
    assert torch.equal(ours.generate(ids, 10), expected)


def test_compile_training_step():
    model = tiny(n_kv_heads=2).train()
    ids = torch.randint(0, V, (2, 8))

    def loss_fn(ids):
        return F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    assert_compiled_training_step_matches(model, loss_fn, ids)


@torch.no_grad()
def test_compile_decode_step_with_static_cache():
    model = tiny(positional="rotary", n_kv_heads=1)
    prompt = torch.randint(0, V, (2, 5))
    cache = model.new_cache(2, 12)
    model(prompt, cache=cache)
    step = torch.compile(lambda tok: model(tok, cache=cache)[:, -1], fullgraph=True, backend="aot_eager")
    tok, out = model.generate(prompt, 1)[:, -1:], []
    for _ in range(6):
        out.append(tok)
        tok = step(tok).argmax(-1, keepdim=True)
    assert torch.equal(torch.cat([prompt] + out, 1), model.generate(prompt, 6))


def test_nan_embedding_does_not_reach_earlier_tokens():
    """A NaN embedding at token 2 leaves the logits of tokens 0-1 as they were (causal attention hides it from them,
    also inside a key tile they share) and makes those of tokens 2.. NaN."""
    model = tiny(n_kv_heads=2)
    ids = torch.randint(0, V, (2, 9))
    poison = lambda module, inputs, out: out.index_fill(1, torch.tensor([2]), float("nan"))  # noqa: E731
    with torch.no_grad():
        clean = model(ids)
        handle = model.embed.register_forward_hook(poison)
        try:
            logits = model(ids)
        finally:
            handle.remove()
    torch.testing.assert_close(logits[:, :2], clean[:, :2], atol=1e-5, rtol=1e-5)
    assert logits[:, 2:].isnan().all()


@torch.no_grad()
def test_generate_compiled_equals_eager():
    """generate(compile=True): the tokens of eager decoding (greedy and beam search, a rolling cache, an int8 model
    over a bfloat16 cache), from one compiled package for every prompt length and max_new_tokens of a batch size (the
    cache's capacity is dynamic)."""
    from pytransformer.models.compiled_step import _PACKAGES
    model = tiny(**LLAMA_SHAPE)
    for length, new in ((5, 7), (9, 12), (3, 4)):
        prompt = torch.randint(0, V, (2, length))
        assert torch.equal(model.generate(prompt, new, compile=True), model.generate(prompt, new))
    assert len(_PACKAGES[model]) == 1
    prompt = torch.randint(0, V, (1, 4))
    assert torch.equal(model.generate(prompt, 6, beam_size=2, compile=True), model.generate(prompt, 6, beam_size=2))
    rolling = tiny(positional="rotary", window=4)  # a cache of `window` rows: the rolling buffer
    prompt = torch.randint(0, V, (2, 6))
    assert torch.equal(rolling.generate(prompt, 9, compile=True), rolling.generate(prompt, 9))
    gemma = tiny(**GEMMA_SHAPE)  # windowed and full layers: beyond the window, the windowed layer's rolling buffer
    for length, new in ((2, 2), (3, 9), (4, 7)):  # keeps its 4 rows in a package for every larger capacity
        prompt = torch.randint(0, V, (2, length))
        assert torch.equal(gemma.generate(prompt, new, compile=True), gemma.generate(prompt, new))
    assert [p.capacities for p in _PACKAGES[gemma].values()] == [(4, 4), (5, sys.maxsize)]
    int8 = quantize(model)  # an int8 model over a bfloat16 cache (half the cache memory of float32)
    prompt = torch.randint(0, V, (2, 5))
    assert torch.equal(int8.generate(prompt, 7, compile=True, cache_dtype=torch.bfloat16),
                       int8.generate(prompt, 7, cache_dtype=torch.bfloat16))


@cuda_only
@pytest.mark.parametrize("overrides", [{}, LLAMA_SHAPE], ids=["gpt2", "llama"])
@torch.no_grad()
def test_generate_on_cuda_equals_cpu(overrides):
    """Greedy float32 generation of a GPT-2- and a Llama-shaped model on the GPU gives the CPU's tokens: a batch and a
    padded batch (prefill chunks through the tiled kernel, then decode_attention), and beam search; the compiled step
    (a CUDA graph on CUDA), with a bfloat16 cache and with beam search, gives the GPU's own eager tokens."""
    model = tiny(**overrides)
    gpu = tiny(**overrides).cuda()
    prompt, lengths = torch.randint(0, V, (3, 7)), torch.tensor([7, 3, 5])
    runs = [dict(), dict(key_lengths=lengths), dict(beam_size=2)]
    for kwargs in runs:
        on_gpu = {k: v.cuda() if torch.is_tensor(v) else v for k, v in kwargs.items()}
        assert torch.equal(gpu.generate(prompt.cuda(), 9, **on_gpu).cpu(), model.generate(prompt, 9, **kwargs)), kwargs
    for kwargs in (dict(compile=True), dict(cache_dtype=torch.bfloat16, compile=True), dict(beam_size=2, compile=True)):
        eager = {k: v for k, v in kwargs.items() if k != "compile"}
        assert torch.equal(gpu.generate(prompt.cuda(), 9, **kwargs), gpu.generate(prompt.cuda(), 9, **eager)), kwargs


def emulated_capture(emu):
    """compiled_step._capture as the host emulator can play it: the first step runs as it is, the capture leaves the
    inputs as they were (a real one runs nothing), and each replay runs the step into the captured output, capturing
    as emulated_capturing plays it (the emulator also counts any stream synchronisation, which a capture forbids)."""
    def capture(run, first, inputs):
        logits = run(*first)
        saved = [t.clone() for t in inputs]
        with emulated_capturing(emu):
            out = run(*inputs)
        for t, before in zip(inputs, saved):
            t.copy_(before)

        def replay():
            with emulated_capturing(emu):
                out.copy_(run(*inputs))
        return logits, replay, out
    return capture


@pytest.mark.cuda
@pytest.mark.parametrize("host_traffic", [lambda t: torch.tensor([1, 2]), lambda t: t.max().item(),
                                          lambda t: bool(t.any()), lambda t: t.nonzero(), lambda t: t[t > 0]],
                         ids=["tensor", "item", "bool", "nonzero", "mask"])
def test_emulated_capture_refuses_what_a_gpu_capture_does(emu, host_traffic):
    """Inside emulated_capturing, a tensor made from host data and a tensor's values read on the host raise, as a
    capture on a GPU refuses them; device work passes."""
    t = torch.arange(4)
    with emulated_capturing(emu):
        (t * 2 + 1).sum()
        with pytest.raises(RuntimeError, match="CUDA graph capture"):
            host_traffic(t)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", ["gpt2", "llama", "llama int8", "llama bfloat16"])
@pytest.mark.parametrize("kwargs", [dict(), dict(beam_size=2), dict(window=4)], ids=["greedy", "beam", "rolling"])
@torch.no_grad()
def test_cuda_graphed_step_gives_eager_tokens(emu, monkeypatch, kwargs, shape):
    """On CUDA, compile=True captures the decoding step in a CUDA graph (compiled_step._graphed_step): played with
    every op on the emulated glue, the first step runs as it is, reading the lengths back (two layers, append and
    decode each; none for a rolling cache), and every replay reads nothing back; the tokens are eager decoding's on
    the same kernels, through beam search's in-place reordering of the captured cache rows and a rolling cache's
    wrap, for a GPT-2 and a Llama shape (rotary positions, GQA, RMSNorm, SwiGLU), float32, int8 and bfloat16."""
    from pytransformer.models import compiled_step
    window = kwargs.pop("window", None)
    model = tiny(window=window, **(LLAMA_SHAPE if shape.startswith("llama") else {}))
    if shape.endswith("int8"):
        quantize(model)
    if shape.endswith("bfloat16"):
        model.to(torch.bfloat16)
    prompt = torch.randint(0, V, (2, 5))
    for op in ("attention", "decode_attention", "int8_linear", "kv_cache_append", "linear", "masked_softmax", "norm"):
        monkeypatch.setattr(sys.modules[f"pytransformer.ops.{op}"], "_ops", emu)
    expected = model.generate(prompt, 8, **kwargs)

    def graphed(model, cache):
        cache.max_length = None  # as compiled_step drops it
        return compiled_step._graphed_step(model, cache, emulated_capture(emu))
    monkeypatch.setattr(decoder, "compiled_step", graphed)
    emu.synchronizations(), emu.launched_kernels()
    assert torch.equal(model.generate(prompt, 8, compile=True, **kwargs), expected)
    assert emu.synchronizations() == (2 * 2 if window is None else 0)  # a rolling cache's rows always fit
    launched = " ".join(emu.launched_kernels())
    attention = "attention_mma_fwd" if shape.endswith("bfloat16") else "attention_simt_fwd"
    kernels = [attention, "decode_", "kv_cache_append", "norm_fwd"] + ["int8"] * shape.endswith("int8")
    assert all(k in launched for k in kernels), launched[:2000]


@torch.no_grad()
def test_compiled_step_packages_and_constants():
    """compile=True reuses a package for the model structure, batch and capacity range it was compiled for: a rolling
    cache (capacity == window) and another batch size get packages of their own, a model of the same structure loads
    the same package file (no compile), and the package's constants are the model's tensors: an in-place update
    and a replaced weight are both seen. The tokens are always eager decoding's."""
    from pytransformer.models import compiled_step
    model = tiny(positional="rotary", window=4)
    prompt = torch.randint(0, V, (2, 1))

    def same(model, prompt, new):
        assert torch.equal(model.generate(prompt, new, compile=True), model.generate(prompt, new))

    same(model, prompt, 2)  # capacity 3: positions in order
    same(model, torch.randint(0, V, (2, 6)), 9)  # capacity 4 == window: the rolling buffer
    assert [p.capacities for p in compiled_step._PACKAGES[model].values()] == [(2, 3), (4, 4)]
    fc2 = model.decoder.layers[1].ff.fc2
    fc2.weight.mul_(-3)  # in place
    same(model, prompt, 2)
    fc2.weight = torch.nn.Parameter(torch.randn_like(fc2.weight) * 3)  # a new tensor: the same package's constant
    same(model, prompt, 2)
    assert len(compiled_step._PACKAGES[model]) == 2
    same(model, torch.randint(0, V, (3, 1)), 2)  # another batch size
    assert len(compiled_step._PACKAGES[model]) == 3
    twin = tiny(positional="rotary", window=4)
    with pytest.MonkeyPatch.context() as patch:  # no compile: the package file is there
        patch.setattr(compiled_step.subprocess, "run", None)
        same(twin, prompt, 2)
    first = next(iter(compiled_step._PACKAGES[model].values()))
    assert [p.key for p in compiled_step._PACKAGES[twin].values()] == [first.key]


def test_compiled_step_refuses_what_it_cannot_compile(monkeypatch, tmp_path):
    """A cache with cross-attention entries or non-contiguous tensors is a ValueError; a cache directory that cannot
    be written is a RuntimeError naming PYTRANSFORMER_CACHE."""
    from pytransformer.models.compiled_step import compiled_step
    from pytransformer.nn import KVCache
    with pytest.raises(ValueError, match="cache: compiled_step takes a self-attention cache"):
        compiled_step(tiny(), KVCache(2, 1, 4, 8, 6, memory_length=3))
    model = tiny()
    cache = model.new_cache(1, 6)
    cache.k[1] = cache.k[1].transpose(2, 3)
    with pytest.raises(ValueError, match="cache: compiled_step takes contiguous cache tensors"):
        compiled_step(model, cache)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("PYTRANSFORMER_CACHE", str(tmp_path / "file"))
    with pytest.raises(RuntimeError, match="PYTRANSFORMER_CACHE"):
        model.generate(torch.randint(0, V, (1, 3)), 2, compile=True)


def test_generate_compiled_needs_the_cache():
    with pytest.raises(ValueError, match="compile"):
        tiny().generate(torch.zeros(1, 3, dtype=torch.long), 2, compile=True, use_cache=False)
