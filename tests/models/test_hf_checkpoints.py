"""Hugging Face checkpoints without a download: tiny random Llama (tied; llama3 rope scaling with an untied head),
Mistral (sliding window shorter than the sequence: the rolling cache wraps; heads wider than hidden_size / heads),
Qwen2 (Q/K/V biases), Qwen3 (q/k norms, wider heads too), Phi-3 (fused q|k|v and gate|up, a window), Gemma 3 (a
windowed and a full layer, each its rotary base; sandwich norms stored as weight - 1; GeGLU), GPT-2 and BERT
built with transformers and saved with save_pretrained (one sharded), loaded by from_hf and from_pretrained: logits
and greedy tokens equal Hugging Face's (batch 1, and batch 3 padded), torch.compile, bfloat16, int8, errors."""
import contextlib
import json
import shutil
import sys

import pytest
import torch

from pytransformer import quantize
from pytransformer.models import DecoderLM, EncoderModel
from pytransformer.nn import QuantizedLinear

transformers = pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

V, NEW = 100, 64
COMMON = {"vocab_size": V, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
          "initializer_range": 0.3, "pad_token_id": 0, "bos_token_id": None, "eos_token_id": None}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32, "rope_theta": 500000.0}
GEMMA3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "default", "rope_theta": 100.0}}
DECODERS = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, tie_word_embeddings=True)),
    "llama3": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(**COMMON, rope_parameters=LLAMA3,
                                                                             tie_word_embeddings=False)),
    "mistral": lambda: transformers.MistralForCausalLM(transformers.MistralConfig(**COMMON, sliding_window=8,
                                                                                 head_dim=24)),  # as Nemo's
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON)),
    "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**COMMON, head_dim=24,
                                                                           tie_word_embeddings=True)),
    "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(**COMMON, sliding_window=12)),
    "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
        **COMMON, head_dim=24, query_pre_attn_scalar=24, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], rope_parameters=GEMMA3_ROPE)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=256, initializer_range=0.3, bos_token_id=None,
        eos_token_id=None, pad_token_id=0)),
}


def _random_norms(model):
    """Norm weights (ones at init) made random, so a wrong mapping shows."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.uniform_(0.5, 1.5) if name.endswith("weight") else p.uniform_(-0.5, 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """name -> (the Hugging Face model, its save_pretrained directory); GPT-2 saved in shards."""
    out = {}
    for i, (name, build) in enumerate(DECODERS.items()):
        torch.manual_seed(i)
        model = _random_norms(build())
        path = tmp_path_factory.mktemp(name)
        model.save_pretrained(path, **({"max_shard_size": "100KB"} if name == "gpt2" else {}))
        out[name] = (model, path)
    return out


def test_sharded_save_is_read(saved):
    path = saved["gpt2"][1]
    assert (path / "model.safetensors.index.json").exists() and not (path / "model.safetensors").exists()


@pytest.mark.parametrize("name", list(DECODERS))
def test_logits_match(saved, name):
    hf, path = saved[name]
    ids = torch.randint(1, V, (2, 40))  # longer than Mistral's window and llama3's original context
    with torch.no_grad():
        expected = hf(ids).logits
        for ours in (DecoderLM.from_hf(hf), DecoderLM.from_pretrained(path)):
            assert not ours.training
            torch.testing.assert_close(ours(ids), expected, atol=1e-4, rtol=1e-4)


def test_from_hf_and_from_pretrained_agree(saved):
    hf, path = saved["llama3"]
    a, b = DecoderLM.from_hf(hf), DecoderLM.from_pretrained(path)
    assert a.config == b.config
    assert a.config.rope_scaling["rope_type"] == "llama3" and not a.config.tie_embeddings
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name


def test_config_translation(saved):
    llama, mistral, qwen2 = (DecoderLM.from_pretrained(saved[n][1]) for n in ("llama", "mistral", "qwen2"))
    assert llama.lm_head.weight is llama.embed.tok.weight  # tied stays one parameter
    assert llama.config.n_kv_heads == 2 and llama.config.norm_type == "rmsnorm" and llama.config.window is None
    assert mistral.config.window == 8 and mistral.config.d_head == 24
    attn = qwen2.decoder.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.out_proj.bias is None and qwen2.decoder.layers[0].ff.fc1.bias is None
    assert llama.new_cache(1, 100).k[0].shape[1] == 2  # GQA: K/V heads are not copied
    assert llama.config.d_head is None and llama.decoder.layers[0].self_attn.q_norm is None
    qwen3 = DecoderLM.from_pretrained(saved["qwen3"][1])
    attn = qwen3.decoder.layers[1].self_attn
    assert qwen3.config.d_head == 24 and qwen3.config.qk_norm and attn.qkv_proj.bias is None
    assert attn.qkv_proj.weight.shape == (8 * 24, 64) and attn.out_proj.weight.shape == (64, 4 * 24)
    assert attn.q_norm.weight.shape == attn.k_norm.weight.shape == (24,) and attn.q_norm.eps == 1e-6
    assert qwen3.new_cache(1, 100).k[0].shape == (1, 2, 100, 24)
    hf, path = saved["phi3"]
    phi3 = DecoderLM.from_pretrained(path)
    assert phi3.config.window == 12 and phi3.config.activation == "swiglu"
    layer, theirs = phi3.decoder.layers[1], hf.model.layers[1]
    assert torch.equal(layer.self_attn.qkv_proj.weight, theirs.self_attn.qkv_proj.weight)
    assert torch.equal(layer.ff.fc1.weight, theirs.mlp.gate_up_proj.weight)
    hf, path = saved["gemma3"]
    gemma = DecoderLM.from_pretrained(path)
    c, layers = gemma.config, gemma.decoder.layers
    assert (c.window, c.global_layers, c.rope_theta, c.local_rope_theta) == (8, (1,), 100.0, 10000.0)
    assert (layers[0].self_attn.window, layers[1].self_attn.window) == (8, None)
    assert layers[0].self_attn.rotary.base == 10000.0 and layers[1].self_attn.rotary.base == 100.0
    assert c.norm == "sandwich" and c.activation == "geglu" and c.scale_embeddings and c.d_head == 24
    assert torch.equal(layers[1].res_ff.out_norm.weight, 1 + hf.model.layers[1].post_feedforward_layernorm.weight)
    assert gemma.new_cache(1, 100).capacities == [8, 100]  # a rolling buffer for the windowed layer alone


@pytest.mark.parametrize("name", list(DECODERS))
def test_greedy_matches_generate(saved, name):
    hf, path = saved[name]
    ours = DecoderLM.from_pretrained(path)
    torch.manual_seed(1)
    ids = torch.randint(1, V, (1, 7))
    expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, do_sample=False)
    assert expected.shape == (1, 7 + NEW)
    assert torch.equal(ours.generate(ids, NEW), expected)


@pytest.mark.parametrize("batch", [1, 8])
def test_gpt2_greedy_256_tokens_match_generate(batch):
    """Every one of 256 greedy float32 tokens equals Hugging Face's, at batch 1 and 8 (the decoding steps' linear
    layers run ops.linear's weight-streaming kernel, the batch-8 prompt ATen's GEMM)."""
    torch.manual_seed(3)
    hf = _random_norms(DECODERS["gpt2"]())
    hf.config.n_positions = 512
    hf.transformer.wpe = torch.nn.Embedding(512, 64).eval()
    ids = torch.randint(1, V, (batch, 16))
    expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=256, min_new_tokens=256,
                           do_sample=False)
    assert torch.equal(DecoderLM.from_hf(hf).generate(ids, 256), expected)


@pytest.mark.parametrize("name", ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3", "gpt2"])
def test_padded_batch_matches_generate(saved, name):
    """Our right-padded prompts (key_lengths) against Hugging Face's left-padded ones (attention_mask)."""
    hf, path = saved[name]
    ours = DecoderLM.from_hf(hf)
    torch.manual_seed(2)
    lengths = torch.tensor([11, 4, 7])  # Mistral: longer and shorter than the window of 8
    right = torch.randint(1, V, (3, 11)) * (torch.arange(11) < lengths[:, None])
    left = torch.stack([row.roll(int(11 - n)) for row, n in zip(right, lengths)])
    mask = (torch.arange(11) >= 11 - lengths[:, None]).long()
    expected = hf.generate(left, attention_mask=mask, max_new_tokens=NEW, do_sample=False)[:, 11:]
    got = ours.generate(right, NEW, key_lengths=lengths)[:, 11:]
    assert torch.equal(got, expected)


def test_gemma3_cache_of_the_window_size(saved):
    """A cache of exactly `window` rows: the windowed layers take it as a rolling buffer, the full one as a plain
    cache (both hold positions 0 .. 7 in order); the tokens are transformers'."""
    hf, path = saved["gemma3"]
    ids = torch.randint(1, V, (2, 3))
    expected = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False)
    assert torch.equal(DecoderLM.from_pretrained(path).generate(ids, 5), expected)


def test_mistral_rolling_cache_wraps(saved):
    ours = DecoderLM.from_pretrained(saved["mistral"][1])
    cache = ours.new_cache(1, 7 + NEW)
    assert cache.capacity == ours.config.window == 8  # a rolling buffer: 71 tokens through 8 rows


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "gemma3"])
def test_compiled_forward(saved, name):
    hf, path = saved[name]
    ours = DecoderLM.from_pretrained(path)
    ids = torch.randint(1, V, (2, 9))
    with torch.no_grad():
        compiled = torch.compile(ours, fullgraph=True, backend="aot_eager")(ids)
        torch.testing.assert_close(compiled, hf(ids).logits, atol=1e-4, rtol=1e-4)


def _relative_error(a, b):
    return float((a.float() - b).norm() / b.norm())


def test_bfloat16_and_int8(saved):
    hf, path = saved["llama3"]
    ids = torch.randint(1, V, (2, 12))
    with torch.no_grad():
        expected = hf(ids).logits
        bf16 = DecoderLM.from_pretrained(path, dtype=torch.bfloat16)
        assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
        assert bf16.decoder.layers[0].self_attn.rotary.inv_freq.dtype == torch.float32
        assert bf16(ids).dtype == torch.bfloat16 and _relative_error(bf16(ids), expected) < 0.05
        int8 = DecoderLM.from_pretrained(path, quantize=True)
        assert isinstance(int8.lm_head, QuantizedLinear) and int8.lm_head.weight.dtype == torch.int8
        # int8 weights (per output channel) of this small random model: relative error 0.035 median, 0.086 the worst
        # of 300 random inputs (a wrong scale or layout gives ~1)
        assert _relative_error(int8(ids), expected) < 0.12
    assert int8.generate(ids, 5).shape == (2, 17)


@pytest.mark.parametrize("name", ["gpt2", "llama3", "qwen3", "gemma3"])  # tied and untied head, q/k norms
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_load_quantizes_as_it_reads(saved, name, dtype):
    """from_pretrained(quantize=True) quantizes each weight as it is read: the same int8 model, to the bit, as
    quantizing the loaded float model."""
    path = saved[name][1]
    streamed = DecoderLM.from_pretrained(path, dtype, quantize=True)
    whole = quantize(DecoderLM.from_pretrained(path, dtype))
    a, b = streamed.state_dict(), whole.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    assert type(streamed.embed.tok) is type(whole.embed.tok)


def test_bert(tmp_path):
    torch.manual_seed(3)
    hf = _random_norms(transformers.BertModel(transformers.BertConfig(
        vocab_size=V, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64, initializer_range=0.1)))
    hf.save_pretrained(tmp_path)
    ids, types = torch.randint(0, V, (3, 9)), torch.randint(0, 2, (3, 9))
    mask = (torch.arange(9)[None] < torch.tensor([9, 4, 6])[:, None]).long()
    with torch.no_grad():
        expected = hf(ids, attention_mask=mask, token_type_ids=types)
        for ours in (EncoderModel.from_hf(hf), EncoderModel.from_pretrained(tmp_path)):
            hidden = ours(ids, attention_mask=mask, token_type_ids=types)
            torch.testing.assert_close(hidden, expected.last_hidden_state, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(ours.pool(hidden), expected.pooler_output, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="model_type: 'bert' is not a DecoderLM"):
        DecoderLM.from_pretrained(tmp_path)


# Errors


def _copy(src, dst, **config_changes):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, **config_changes}))
    return dst


def test_missing_files(saved, tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        DecoderLM.from_pretrained(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="config.json"):
        DecoderLM.from_pretrained(tmp_path)
    path = _copy(saved["llama"][1], tmp_path / "no_weights")
    (path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        DecoderLM.from_pretrained(path)
    shard = _copy(saved["gpt2"][1], tmp_path / "shard_gone")
    next(shard.glob("model-00002-*.safetensors")).unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-.*listed in model.safetensors.index.json"):
        DecoderLM.from_pretrained(shard)


@pytest.mark.parametrize("changes, match", [
    ({"model_type": "falcon"}, "model_type: 'falcon' is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "rope_type 'yarn'"),
    ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}}, "rope_type 'linear'"),
    ({"head_dim": 24}, r"q_proj.weight: shape \[64, 64\] does not fit decoder.layers.0.self_attn.qkv_proj.weight of the "
                       r"config, which needs \[96, 64\] \(num_attention_heads \* head_dim = 96\)"),
    ({"head_dim": 10 ** 9}, "head_dim: 1000000000 is larger than any tensor"),
    ({"attention_bias": True}, "attention_bias"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"intermediate_size": 96}, r"mlp.gate_proj.weight: shape \[128, 64\] does not fit decoder.layers.0.ff.fc1.weight "
                                r"of the config, which needs \[96, 64\] \(intermediate_size = 96\)"),
])
def test_unsupported_or_mismatched_config(saved, tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        DecoderLM.from_pretrained(_copy(saved["llama"][1], tmp_path / "changed", **changes))


@pytest.mark.parametrize("changes, match", [
    ({"query_pre_attn_scalar": 256}, "query_pre_attn_scalar"), ({"final_logit_softcapping": 30.0}, "final_logit"),
    ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"), ({"hidden_activation": "gelu"}, "hidden_activation"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"layer_types": ["full_attention"]}, "layer_types"), ({"layer_types": ["local", "global"]}, "layer_types"),
    ({"layer_types": None, "sliding_window_pattern": 0}, "sliding_window_pattern"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "rope_parameters"),
    ({"rope_parameters": None, "rope_local_base_freq": "1e4"}, "rope_local_base_freq"),
    ({"rope_parameters": {**GEMMA3_ROPE, "sliding_attention": {"rope_type": "linear", "factor": 8.0}}},
     "sliding_attention: 'linear'"),
])
def test_gemma3_unsupported_config(saved, tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        DecoderLM.from_pretrained(_copy(saved["gemma3"][1], tmp_path / "changed", **changes))


def test_gemma3_config_as_transformers_4_saved_it(saved, tmp_path):
    """rope_theta (the full layers') and rope_local_base_freq in place of rope_parameters: the same model."""
    path = _copy(saved["gemma3"][1], tmp_path / "v4", rope_parameters=None, rope_theta=100.0,
                 rope_local_base_freq=10000.0, rope_scaling=None)
    assert DecoderLM.from_pretrained(path).config == DecoderLM.from_pretrained(saved["gemma3"][1]).config


@pytest.mark.parametrize("pattern, full", [(2, (1,)), (None, ())])  # transformers' default: every sixth layer
def test_gemma3_config_without_layer_types(saved, tmp_path, pattern, full):
    """sliding_window_pattern in place of layer_types (the Gemma 3 1B config.json): every pattern-th layer full."""
    changes = {"layer_types": None} | ({} if pattern is None else {"sliding_window_pattern": pattern})
    config = DecoderLM.from_pretrained(_copy(saved["gemma3"][1], tmp_path / "pattern", **changes)).config
    assert config.window == 8 and config.global_layers == full
    hf = transformers.Gemma3TextConfig.from_pretrained(tmp_path / "pattern")
    assert tuple(i for i, t in enumerate(hf.layer_types) if t == "full_attention") == full


@pytest.mark.parametrize("types, window, theta", [(["sliding_attention"] * 2, 8, 10000.0),
                                                  (["full_attention"] * 2, None, 100.0)])
def test_gemma3_one_kind_of_layer(saved, tmp_path, types, window, theta):
    """Every layer windowed (one rotary, the sliding layers') or none: no per-layer settings."""
    config = DecoderLM.from_pretrained(_copy(saved["gemma3"][1], tmp_path / "one", layer_types=types)).config
    assert (config.window, config.global_layers, config.rope_theta) == (window, (), theta)
    assert config.local_rope_theta is None


@pytest.mark.parametrize("field", ["resid_pdrop", "embd_pdrop", "attention_dropout"])
def test_phi3_dropout_is_refused(saved, tmp_path, field):
    with pytest.raises(ValueError, match=field):
        DecoderLM.from_pretrained(_copy(saved["phi3"][1], tmp_path / field, **{field: 0.1}))


def test_qwen2_mixed_sliding_window(saved, tmp_path):
    path = _copy(saved["qwen2"][1], tmp_path / "mixed", use_sliding_window=True, sliding_window=8,
                 max_window_layers=1, layer_types=["full_attention", "sliding_attention"])
    with pytest.raises(ValueError, match="layer_types"):
        DecoderLM.from_pretrained(path)


@pytest.mark.parametrize("change, match", [("drop", "missing tensors .*layers.1.mlp.down_proj.weight"),
                                           ("add", "unexpected tensors extra.weight")])
def test_missing_or_unexpected_tensor(saved, tmp_path, change, match):
    path = _copy(saved["llama3"][1], tmp_path / change)
    tensors = safetensors_torch.load_file(path / "model.safetensors")
    if change == "drop":
        del tensors["model.layers.1.mlp.down_proj.weight"]
    else:
        tensors["extra.weight"] = torch.zeros(3)
    safetensors_torch.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=match):
        DecoderLM.from_pretrained(path)


@pytest.mark.parametrize("head_dim", [16, 128])
def test_llama3_frequencies_equal_transformers(head_dim):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from pytransformer.nn.positional import rope_inv_freq
    params = {**LLAMA3, "original_max_position_embeddings": 8192}
    config = transformers.LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, rope_parameters=params,
                                      max_position_embeddings=131072)
    expected, scaling = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    assert scaling == 1.0 and torch.equal(rope_inv_freq(head_dim, params["rope_theta"], params), expected)


# ---- from_pretrained keeps weights stored as used in a private mapping of the file ----

def _file_backed(model) -> dict[str, bool]:
    """Parameter name -> whether its data lies in a mapping of a .safetensors file (Linux: /proc/self/maps)."""
    spans = []
    for line in open("/proc/self/maps"):
        fields = line.split()
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        spans.append((lo, hi, fields[5] if len(fields) > 5 else ""))
    return {name: any(lo <= p.data_ptr() < hi and path.endswith(".safetensors") for lo, hi, path in spans)
            for name, p in model.named_parameters()}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
@pytest.mark.parametrize("name", ["llama3", "gpt2"])  # one file, untied head; shards, transposed Conv1D weights
def test_weights_stay_in_the_file_mapping(saved, name):
    """float32 weights of a float32 checkpoint that are used as stored (embeddings, norms, o_proj, down_proj, the
    head; GPT-2's biases) are views of the file's mapping, and so is Llama's gate|up (gate_proj and up_proj follow each
    other in the file); q|k|v (k_proj, o_proj, q_proj, v_proj in the file) and transposed weights are copies; the
    logits equal a copying load's; a write to a mapped weight changes neither the file nor another load."""
    path = saved[name][1]
    mapped, copied = DecoderLM.from_pretrained(path), DecoderLM.from_pretrained(path, mmap=False)
    backed = _file_backed(mapped)
    assert not any(_file_backed(copied).values())
    assert backed["embed.tok.weight"] and backed["decoder.norm.weight"]
    assert not any(backed[f"decoder.layers.{i}.self_attn.qkv_proj.weight"] for i in range(2))
    if name == "llama3":
        assert backed["lm_head.weight"] and backed["decoder.layers.0.self_attn.out_proj.weight"]
        assert all(backed[f"decoder.layers.{i}.ff.fc1.weight"] for i in range(2))  # gate|up
    else:  # Conv1D weights, stored transposed
        assert not any(backed[f"decoder.layers.0.{m}.weight"] for m in ("self_attn.out_proj", "ff.fc1"))
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        assert torch.equal(mapped(ids), copied(ids))
        mapped.embed.tok.weight.add_(1.0)
    again = DecoderLM.from_pretrained(path)
    assert torch.equal(again.embed.tok.weight, copied.embed.tok.weight)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_converted_or_quantized_weights_are_copies(saved):
    """bfloat16 from a float32 file is converted (nothing mapped); int8 maps only what stays float (the norms) and
    quantizes the rest (linear layers, the embedding) as it reads."""
    path = saved["llama3"][1]
    assert not any(_file_backed(DecoderLM.from_pretrained(path, torch.bfloat16)).values())
    int8 = DecoderLM.from_pretrained(path, quantize=True)
    backed = _file_backed(int8)
    assert backed and all(backed.values()) and all("norm" in n for n in backed)  # the float parameters left
    assert {b.dtype for n, b in int8.named_buffers() if n.endswith("weight")} == {torch.int8}


def test_misaligned_tensor_is_read_not_mapped(tmp_path):
    """A tensor whose data starts at an offset that is not a multiple of its element size (the format allows it)
    is read, not mapped: mapped() gives None, and the values are right either way."""
    from pytransformer.models.checkpoint import SafetensorsFiles
    a, b = torch.randn(3).to(torch.bfloat16), torch.randn(2, 4)
    header = {"a": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
              "b": {"dtype": "F32", "shape": [2, 4], "data_offsets": [6, 38]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path = tmp_path / "model.safetensors"
    path.write_bytes(len(text).to_bytes(8, "little") + text + a.view(torch.uint8).numpy().tobytes()
                     + b.view(torch.uint8).numpy().tobytes())
    with contextlib.ExitStack() as stack:
        tensors = SafetensorsFiles([path], stack)
        assert torch.equal(tensors.mapped(["a"], torch.bfloat16), a) and tensors.mapped(["a"], torch.float32) is None
        assert tensors.mapped(["b"], torch.float32) is None and torch.equal(tensors["b"], b)


def test_parts_map_as_one_tensor_only_when_they_follow_each_other(tmp_path):
    """mapped(names): the rows of tensors that follow each other in the file in that order, as one view; in another
    order, with a tensor between them, or with rows of another length: None."""
    from safetensors.torch import save_file

    from pytransformer.models.checkpoint import SafetensorsFiles
    t = {"a": torch.randn(2, 4), "b": torch.randn(3, 4), "c": torch.randn(1, 4), "d": torch.randn(2, 3)}
    path = tmp_path / "model.safetensors"
    save_file(t, str(path))  # in name order: a, b, c, d
    with contextlib.ExitStack() as stack:
        tensors = SafetensorsFiles([path], stack)
        assert torch.equal(tensors.mapped(["a", "b", "c"], torch.float32), torch.cat([t["a"], t["b"], t["c"]]))
        assert torch.equal(tensors.mapped(["b", "c"], torch.float32), torch.cat([t["b"], t["c"]]))
        for names in (["b", "a"], ["a", "c"], ["c", "d"]):
            assert tensors.mapped(names, torch.float32) is None


def _mapped_rss(path) -> int:
    """Resident bytes of this process's mappings of `path` (Linux: /proc/self/smaps)."""
    rss, inside = 0, False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):  # a mapping's header line
            inside = len(fields) > 5 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            rss += int(fields[1]) * 1024
    return rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_reading_a_tensor_leaves_no_file_pages_resident(tmp_path):
    """A tensor read by name (to be converted, fused or quantized) comes from plain reads into memory of its own: no
    page of the file is resident in a mapping afterwards, so an int8 or converted load does not hold the whole file
    in the process's memory; the values are the file's."""
    from safetensors.torch import save_file

    from pytransformer.models.checkpoint import SafetensorsFiles
    t = {"a": torch.randn(512, 1024), "b": torch.randn(3).to(torch.bfloat16)}
    path = tmp_path / "model.safetensors"
    save_file(t, str(path))
    with contextlib.ExitStack() as stack:
        tensors = SafetensorsFiles([path], stack, mmap=False)
        assert torch.equal(tensors["a"], t["a"]) and torch.equal(tensors["b"], t["b"])
        assert _mapped_rss(path) == 0


@pytest.mark.parametrize("name", ["llama3", "gpt2"])  # fused q|k|v and gate|up from parts; transposed Conv1D weights
@pytest.mark.parametrize("dtype,quantized", [(torch.bfloat16, False), (torch.float32, True)])
def test_loads_read_blocks_of_rows(saved, monkeypatch, name, dtype, quantized):
    """A converted or quantized weight is read and written a block of rows at a time (a transposed one whole): no
    read is larger than a block, and the model equals, to the bit, one whose weights were read whole."""
    from pytransformer.models import checkpoint
    path = saved[name][1]
    whole = DecoderLM.from_pretrained(path, dtype, quantize=quantized, mmap=False)
    largest, read = [0], checkpoint.SafetensorsFiles._read

    def recorded(self, tensor, first, shape):
        transposed = name == "gpt2" and tensor.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight"))
        largest[0] = max(largest[0], 0 if transposed else (shape or [1])[0])
        return read(self, tensor, first, shape)
    monkeypatch.setattr(checkpoint, "_BLOCK_ROWS", 5)
    monkeypatch.setattr(checkpoint.SafetensorsFiles, "_read", recorded)
    blocks = DecoderLM.from_pretrained(path, dtype, quantize=quantized, mmap=False)
    assert largest[0] == 5
    a, b = blocks.state_dict(), whole.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_rows_of_a_file_tensor(tmp_path):
    """SafetensorsFiles.rows(name, start, stop) reads the rows asked for (the elements of a 1-D tensor)."""
    from pytransformer.models.checkpoint import SafetensorsFiles
    t = {"a": torch.randn(7, 3), "b": torch.randn(11).to(torch.bfloat16), "c": torch.randn(2, 3, 4)}
    path = tmp_path / "model.safetensors"
    safetensors_torch.save_file(t, str(path))
    with contextlib.ExitStack() as stack:
        tensors = SafetensorsFiles([path], stack)
        for name, (start, stop) in {"a": (2, 5), "b": (0, 11), "c": (1, 2)}.items():
            assert torch.equal(tensors.rows(name, start, stop), t[name][start:stop])


@pytest.mark.parametrize("name", ["llama3", "gpt2"])  # rotary, RMSNorm; learned positions, LayerNorm, biases
def test_loading_runs_no_meta_reference_kernels(saved, name):
    """The model is built on the meta device without its random initialisers and with the derived buffers computed
    on the CPU: arithmetic on meta tensors would run Python reference kernels whose first use imports torch._dynamo,
    and torch._check_value or empty_like of a meta tensor torch's symbolic shapes (sympy): tens of MiB of resident
    memory, in a process that only loads and generates. A fresh process loads float32 and int8 models and generates,
    eager and compiled (the compile runs in a child process), without importing either."""
    import subprocess
    path = saved[name][1]
    script = ("import sys, torch\nfrom pytransformer.models import DecoderLM\n"
              f"for q in (False, True):\n    m = DecoderLM.from_pretrained({str(path)!r}, quantize=q)\n"
              "    m.generate(torch.tensor([[1, 2, 3]]), 2, compile=not q)\n"
              "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"], out.stdout + out.stderr
