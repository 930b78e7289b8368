"""pytransformer.integrations.transformers on tiny random transformers models of every family we load (GPT-2, Llama,
Mistral with a window shorter than the sequence, Qwen2, Qwen3, Phi-3, Gemma 3, BERT): the "pytransformer" attention
backend against attn_implementation="sdpa" (logits of padded and unpadded batches, greedy generate tokens, gradients
of a training step, torch.compile(fullgraph=True) with our op in the one graph), its errors, and patch_linears /
unpatch_linears."""
import copy
import subprocess
import sys

import pytest
import torch
import torch._dynamo.testing
import torch.nn.functional as F

from pytransformer import ops
from pytransformer.nn.quantized import quantize_per_channel

transformers = pytest.importorskip("transformers")
integration = pytest.importorskip("pytransformer.integrations.transformers")

V, L = 100, 12
COMMON = {"vocab_size": V, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64, "initializer_range": 0.2,
          "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None}
FAMILIES = {
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_embd=32, n_layer=2, n_head=4, n_positions=64, initializer_range=0.2, attn_pdrop=0.0,
        resid_pdrop=0.0, embd_pdrop=0.0, pad_token_id=0, bos_token_id=None, eos_token_id=None)),
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, sliding_window=4)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**COMMON, head_dim=16)),
    "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(**COMMON)),
    "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **COMMON, head_dim=16, query_pre_attn_scalar=10, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"])),
    "bert": lambda: transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, initializer_range=0.2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        pad_token_id=0)),
}
DECODERS = [name for name in FAMILIES if name != "bert"]


@pytest.fixture(scope="module")
def pairs():
    """name -> (the model on "sdpa", a copy of it on "pytransformer"), both in eval mode."""
    out = {}
    for i, (name, build) in enumerate(FAMILIES.items()):
        torch.manual_seed(i)
        sdpa = build().eval()
        ours = copy.deepcopy(sdpa)
        ours.set_attn_implementation(integration.NAME)
        out[name] = (sdpa, ours)
    return out


def batch(name: str, padded: bool):
    """ids [3, L] and attention_mask: padded decoders have rows with 4 pads on the left (generation's padding) and 3
    on the right; padded BERT has rows with 3 and 5 pads on the right."""
    ids, mask = torch.randint(1, V, (3, L)), torch.ones(3, L, dtype=torch.long)
    if padded and name == "bert":
        mask[1, -3:], mask[2, -5:] = 0, 0
    elif padded:
        mask[1, :4], mask[2, -3:] = 0, 0
    return ids.masked_fill(mask == 0, 0), mask


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_logits_equal_sdpa(pairs, name, padded):
    sdpa, ours = pairs[name]
    ids, mask = batch(name, padded)
    with torch.no_grad():
        expected, got = sdpa(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert not got.isnan().any()  # left-padded rows see no key: zeros, never NaN
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def greedy(model, ids, mask, n=8):
    return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                          pad_token_id=0)


@pytest.mark.parametrize("name", DECODERS)
def test_greedy_generate_equals_sdpa(pairs, name):
    sdpa, ours = pairs[name]
    ids, mask = batch(name, padded=True)
    ids, mask = ids[:2], mask[:2]  # left padding only, as for generation
    with torch.no_grad():
        for i, m in ((ids, mask), (ids[:1], mask[:1])):
            assert torch.equal(greedy(ours, i, m), greedy(sdpa, i, m))


def test_greedy_generate_with_a_static_cache_equals_sdpa(pairs):
    sdpa, ours = pairs["llama"]
    ids, mask = batch("llama", padded=False)  # the prefill into the empty static cache comes without a mask
    with torch.no_grad():
        assert torch.equal(*(m.generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0,
                                        cache_implementation="static") for m in (ours, sdpa)))


def test_unpadded_decoding_steps_read_the_cache_with_decode_attention(pairs, monkeypatch):
    calls = []
    decode = ops.decode_attention
    monkeypatch.setattr(ops, "decode_attention", lambda *a, **k: calls.append(a[0].shape) or decode(*a, **k))
    sdpa, ours = pairs["llama"]
    ids, mask = batch("llama", padded=False)
    with torch.no_grad():
        assert torch.equal(greedy(ours, ids, mask, n=5), greedy(sdpa, ids, mask, n=5))
    assert calls == [torch.Size([3, 4, 1, 8])] * (4 * 2)  # 4 steps after the prefill, 2 layers


@pytest.mark.parametrize("name", list(FAMILIES))
def test_training_step_gradients_equal_sdpa(pairs, name):
    ids, mask = batch(name, padded=True)
    grads = []
    for model in map(copy.deepcopy, pairs[name]):
        model.train()
        model(ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for n, g in grads[0].items():
        torch.testing.assert_close(grads[1][n], g, atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_compiled_forward_has_one_graph_with_our_attention(pairs, name):
    sdpa, ours = pairs[name]
    ids, mask = batch(name, padded=True)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    with torch.no_grad():
        got = torch.compile(ours, backend=counter, fullgraph=True)(ids, attention_mask=mask).logits
        torch.testing.assert_close(got, sdpa(ids, attention_mask=mask).logits, atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 1
    calls = [n for n in counter.graphs[0].graph.nodes if n.target is torch.ops.pytransformer.attention]
    assert len(calls) == 2  # one per layer


def call(**kwargs):
    """The backend's attention function on random [2, 4, 5, 8] inputs (2 key/value heads)."""
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    return integration.attention_forward(torch.nn.Module(), q, k, v, kwargs.pop("attention_mask", None), **kwargs)


@pytest.mark.parametrize("kwarg", ["softcap", "s_aux", "sinks", "position_bias", "output_attentions"])
def test_what_our_kernels_do_not_compute_raises_naming_it(kwarg):
    with pytest.raises(ValueError, match=f"^{kwarg}: .*attn_implementation='eager'"):
        call(**{kwarg: torch.ones(()) if kwarg != "output_attentions" else True})
    call(**{kwarg: None})


def test_causal_without_a_mask_aligns_as_sdpa_for_a_prefill_into_an_empty_static_cache():
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8)
    out, weights = integration.attention_forward(torch.nn.Module(), q, k, v, None, is_causal=True)
    assert weights is None and out.shape == (2, 5, 4, 8)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2))


def test_a_query_row_that_sees_no_key_gives_zeros_and_no_gradient():
    q, k, v = (torch.randn(2, 4, 5, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(2, 1, 5, 5, dtype=torch.bool).tril()
    mask[1, :, :2, :3] = False  # rows 0 and 1 of batch 1: left padding hides every key they could see
    out, _ = integration.attention_forward(torch.nn.Module(), q, k, v, mask)
    out.sum().backward()
    assert torch.equal(out[1, :2], torch.zeros(2, 4, 8)) and torch.equal(q.grad[1, :, :2], torch.zeros(4, 2, 8))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
    torch.testing.assert_close(out, expected.nan_to_num(0.0))


def test_a_decoding_step_that_needs_grad_sees_every_cached_key():
    q, k, v = (torch.randn(2, 4, n, 8, requires_grad=True) for n in (1, 9, 9))
    out, _ = integration.attention_forward(torch.nn.Module(), q, k, v, None, is_causal=True)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v).transpose(1, 2))


@pytest.mark.parametrize("lq", [1, 7], ids=["decoding step", "prefill"])
def test_a_sliding_window_without_a_mask_is_applied(lq):
    q, k, v = torch.randn(2, 4, lq, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    p = torch.arange(lq)[:, None] + 7 - lq
    j = torch.arange(7)
    window = (j <= p) & (j > p - 3)  # a query at position p sees keys p - 3 < j <= p
    with torch.no_grad():
        out, _ = integration.attention_forward(torch.nn.Module(), q, k, v, None, sliding_window=3)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=window, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2))


def test_dropout_reaches_the_op_in_training():
    torch.manual_seed(0)
    a = call(dropout=0.5)[0]
    torch.manual_seed(0)
    b = call(dropout=0.5)[0]
    torch.manual_seed(0)
    assert torch.equal(a, b) and not torch.allclose(a, call()[0])


def test_register_is_idempotent_and_adds_the_mask_function():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    integration.register()
    integration.register()
    assert AttentionInterface._global_mapping[integration.NAME] is integration.attention_forward
    assert AttentionMaskInterface._global_mapping[integration.NAME] is sdpa_mask


def test_the_package_and_the_integration_import_without_transformers():
    script = ("import sys; sys.modules['transformers'] = None\n"
              "import torch, pytransformer.integrations.transformers as t\n"
              "m = t.patch_linears(torch.nn.Sequential(torch.nn.Linear(4, 3)))\n"
              "assert type(m[0]) is t.PatchedLinear\n"
              "try:\n    t.register()\nexcept ImportError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "register: the 'pytransformer' attention backend needs the `transformers` package" in out.stdout


# patch_linears


def linear_layers(model):
    conv1d = transformers.pytorch_utils.Conv1D
    return [m for m in model.modules() if type(m) in (torch.nn.Linear, conv1d)]


def reference(model, weight_dtype=None, quantized=False):
    """A copy of the model whose linear layers compute what patched ones should with F.linear: weights rounded to
    weight_dtype, x rounded to it and the result too; or weights quantized per channel to int8 and back."""
    model = copy.deepcopy(model)
    for m in linear_layers(model):
        w = m.weight.detach() if type(m) is torch.nn.Linear else m.weight.detach().t()
        if quantized:
            q, scale = quantize_per_channel(w)
            w = q.float() * scale[:, None]
        elif weight_dtype is not None:
            w = w.to(weight_dtype).float()
            m.register_forward_pre_hook(lambda _, args: (args[0].to(weight_dtype).float(),))
            m.register_forward_hook(lambda _, args, out: out.to(weight_dtype).float())
        m.weight = torch.nn.Parameter(w if type(m) is torch.nn.Linear else w.t())  # a tied embedding keeps its own
    return model


@pytest.mark.parametrize("name", ["gpt2", "llama"])  # GPT-2's Conv1D, Llama's nn.Linear
def test_float32_patch_equals_sdpa_and_unpatch_restores_the_modules(pairs, name):
    sdpa, ours = map(copy.deepcopy, pairs[name])
    before = linear_layers(ours)
    ids, mask = batch(name, padded=True)
    integration.patch_linears(ours)
    patched = [m for m in ours.modules() if isinstance(m, integration.PatchedLinear)]
    assert len(patched) == len(before) and not linear_layers(ours)
    if name == "llama":  # nn.Linear parameters are shared, not copied
        assert all(p.weight is b.weight for p, b in zip(patched, before))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids, attention_mask=mask).logits, sdpa(ids, attention_mask=mask).logits,
                                   atol=1e-5, rtol=1e-5)
        assert torch.equal(greedy(ours, ids[:2], mask[:2]), greedy(sdpa, ids[:2], mask[:2]))
    with pytest.raises(ValueError, match="^model: its linear layers are patched already"):
        integration.patch_linears(ours)
    integration.unpatch_linears(ours)
    assert all(a is b for a, b in zip(linear_layers(ours), before)) and len(linear_layers(ours)) == len(before)


def test_float32_patch_trains_the_original_parameters(pairs):
    sdpa, ours = map(copy.deepcopy, pairs["llama"])
    integration.patch_linears(ours.train())
    ids, mask = batch("llama", padded=True)
    for model in (sdpa.train(), ours):
        model(ids, attention_mask=mask, labels=ids).loss.backward()
    for (n, a), b in zip(sdpa.named_parameters(), integration.unpatch_linears(ours).parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-4, msg=n)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("kind", ["bfloat16", "int8"])
def test_bfloat16_and_int8_patches_compute_their_rounded_weights(pairs, name, kind):
    _, ours = pairs[name]
    expected_model = reference(ours, torch.bfloat16) if kind == "bfloat16" else reference(ours, quantized=True)
    model = integration.patch_linears(copy.deepcopy(ours), dtype=torch.bfloat16 if kind == "bfloat16" else None,
                                      quantize=kind == "int8")
    layer = integration.PatchedLinear if kind == "bfloat16" else integration.PatchedQuantizedLinear
    assert len([m for m in model.modules() if type(m) is layer]) == len(linear_layers(ours))
    ids, mask = batch(name, padded=True)
    with torch.no_grad():
        got, expected = model(ids, attention_mask=mask).logits, expected_model(ids, attention_mask=mask).logits
        assert got.dtype == torch.float32
        tol = 2e-2 if kind == "bfloat16" else 1e-3
        torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
        assert greedy(model, ids[:2], mask[:2]).shape == (2, L + 8)


def test_patch_linears_rejects_a_dtype_it_cannot_stream():
    with pytest.raises(ValueError, match=r"^dtype: expected None, torch.float32"):
        integration.patch_linears(torch.nn.Linear(4, 4), dtype=torch.int8)


def test_the_benchmark_runs_every_variant_on_one_model(tmp_path):
    from pytransformer.bench import transformers_backend as bench
    torch.manual_seed(0)
    hf = FAMILIES["llama"]().eval()
    hf.save_pretrained(tmp_path)
    with torch.no_grad():
        results = bench.run(hf, tmp_path, torch.randint(1, V, (1, 6)), new_tokens=3, rounds=1)
    names = [name for name, _, _ in bench.TRANSFORMERS_VARIANTS] + [f"DecoderLM, {d}" for d in bench.DECODERLM_VARIANTS]
    assert list(results) == names and len(linear_layers(hf)) == 2 * 7 + 1  # put back after each patched variant
    for name in ("transformers, pytransformer attention", "+ our linears, float32", "DecoderLM, float32"):
        assert torch.equal(results[name][1], results["transformers, sdpa"][1]), name
    assert "| DecoderLM, int8 |" in bench.markdown(results, "cmd", 6, 3, 1, ("0", "0"))
