"""Hugging Face architectures, one home per model_type: its config fields -> our config, and its tensor names -> our
parameters. Both DecoderLM/EncoderModel.from_hf (a transformers model in memory: config.to_dict() and state_dict())
and from_pretrained (a save_pretrained directory: config.json and safetensors files) go through `architecture`, and
checkpoint.py loads the tensors; transformers itself is never imported.

Supported model_type values: "gpt2" (GPT2LMHeadModel), "llama", "mistral", "qwen2" (their *ForCausalLM) -> DecoderLM;
"bert" (BertModel, or the encoder and pooler of a BertFor* checkpoint) -> EncoderModel. A config field that would make
the Hugging Face model compute something our model does not raises ValueError naming the field.

Decisions: Hugging Face's q/k/v (and gate/up) projections are concatenated by rows into our fused qkv_proj (and the
SwiGLU fc1 = gate | up); RoPE needs no permutation (both use the rotate-half layout). Rope types: default and llama3
(any other rope_type, and partial_rotary_factor != 1, raise). Mistral's sliding_window applies to every layer; Qwen2's
use_sliding_window only when it makes every layer windowed (a mix raises, naming layer_types). attention_dropout must
be 0 (our one dropout rate would also act on the residuals). A tied checkpoint's lm_head.weight (present in
state_dict(), absent from save_pretrained files) is not loaded; buffers of older versions (GPT-2's attn.bias mask,
Llama's rotary_emb.inv_freq, BERT's position_ids) and BertFor* task heads (cls.*) are skipped; any other tensor the
plan does not use is an error."""
from typing import Callable, NamedTuple

from .configs import DecoderConfig, EncoderConfig, bert_base, gpt2_small

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


class Architecture(NamedTuple):
    """A checkpoint's architecture in our terms."""
    config: DecoderConfig | EncoderConfig
    plan: dict  # our parameter name -> (its Hugging Face tensor names, concatenated by rows; transpose: bool)
    ignored: tuple[str, ...]  # regular expressions of Hugging Face tensor names that are not loaded


def _activation(name: str) -> str:
    if name not in _ACTIVATIONS:
        raise ValueError(f"model: activation {name!r} is not supported ({sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def _require(d: dict, field: str, supported, default=None) -> None:
    """ValueError naming `field` when the config's value (default when absent) is not the one we compute."""
    value = d.get(field, default)
    if value != supported:
        raise ValueError(f"{field}: {value!r} is not supported by pytransformer (only {supported!r})")


def _rows(prefix: str, *names: str, transpose: bool = False) -> tuple:
    return tuple(f"{prefix}{n}" for n in names), transpose


def _module(ours: str, theirs: str, bias: bool = True, transpose: bool = False) -> dict:
    """The weight (transposed if asked) and bias of a Linear or norm."""
    return ({f"{ours}.weight": ((f"{theirs}.weight",), transpose)}
            | ({f"{ours}.bias": ((f"{theirs}.bias",), False)} if bias else {}))


def _head(plan: dict, tied: bool) -> tuple[str, ...]:
    """Add the untied LM head to plan; a tied checkpoint may still hold it (as state_dict() does): not loaded."""
    if not tied:
        plan["lm_head.weight"] = (("lm_head.weight",), False)
    return (r"lm_head\.weight",) if tied else ()


def gpt2(d: dict, names) -> Architecture:
    """GPT2LMHeadModel (Conv1D weights are [in, out]: transposed)."""
    _require(d, "scale_attn_weights", True, True)
    _require(d, "scale_attn_by_inverse_layer_idx", False, False)
    _require(d, "add_cross_attention", False, False)
    tied = d.get("tie_word_embeddings", True)
    config = gpt2_small(vocab_size=d["vocab_size"], d_model=d["n_embd"], n_heads=d["n_head"], n_layers=d["n_layer"],
                        d_ff=d.get("n_inner") or 4 * d["n_embd"], max_len=d["n_positions"],
                        dropout=d.get("resid_pdrop", 0.1), activation=_activation(d.get("activation_function",
                                                                                          "gelu_new")),
                        eps=d.get("layer_norm_epsilon", 1e-5), tie_embeddings=tied)
    plan = {"embed.tok.weight": (("wte.weight",), False), "embed.pos.weight": (("wpe.weight",), False),
            **_module("decoder.norm", "ln_f")}
    for i in range(config.n_layers):
        p, h = f"decoder.layers.{i}", f"h.{i}"
        plan |= (_module(f"{p}.res_self.norm", f"{h}.ln_1") | _module(f"{p}.res_ff.norm", f"{h}.ln_2")
                 | _module(f"{p}.self_attn.qkv_proj", f"{h}.attn.c_attn", transpose=True)
                 | _module(f"{p}.self_attn.out_proj", f"{h}.attn.c_proj", transpose=True)
                 | _module(f"{p}.ff.fc1", f"{h}.mlp.c_fc", transpose=True)
                 | _module(f"{p}.ff.fc2", f"{h}.mlp.c_proj", transpose=True))
    return Architecture(config, plan, _head(plan, tied) + (r"h\.\d+\.attn\.(masked_)?bias",))  # old mask buffers


def _rope(d: dict) -> tuple[float, dict | None]:
    """rope_theta and the scaling dict (None: plain RoPE), from transformers 5's `rope_parameters` or the older
    top-level `rope_theta` and `rope_scaling`."""
    params = d.get("rope_parameters") or {**(d.get("rope_scaling") or {}), "rope_theta": d.get("rope_theta", 1e4)}
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor: {params['partial_rotary_factor']!r} is not supported (only 1.0)")
    kind = params.get("rope_type", params.get("type", "default"))
    return params["rope_theta"], None if kind == "default" else {**params, "rope_type": kind}


def _window(d: dict, n_layers: int) -> int | None:
    """The sliding window of every layer (None: full attention); ValueError for a mix of full and windowed layers."""
    if d["model_type"] == "mistral":
        return d.get("sliding_window")
    if d["model_type"] == "llama" or not d.get("use_sliding_window", False):
        return None
    kinds = set(d.get("layer_types") or ["full_attention" if i < d.get("max_window_layers", n_layers)
                                         else "sliding_attention" for i in range(n_layers)])
    if len(kinds) > 1:
        raise ValueError("layer_types: Qwen2 with use_sliding_window and max_window_layers mixes full and sliding-window"
                         " attention layers, which is not supported (one window for all layers)")
    return d["sliding_window"] if kinds == {"sliding_attention"} else None


def llama(d: dict, names) -> Architecture:
    """LlamaForCausalLM, MistralForCausalLM (sliding window) and Qwen2ForCausalLM (Q/K/V biases): pre-RMSNorm,
    rotary (rotate-half, as ours: no permutation), SwiGLU (fc1 rows = gate_proj | up_proj), GQA."""
    hidden, heads, n_layers = d["hidden_size"], d["num_attention_heads"], d["num_hidden_layers"]
    _require(d, "hidden_act", "silu", "silu")
    if d.get("head_dim") not in (None, hidden // heads) or hidden % heads:
        raise ValueError(f"head_dim: {d.get('head_dim')!r} is not supported (only hidden_size // num_attention_heads = "
                         f"{hidden // heads})")
    for field in ("attention_bias", "mlp_bias"):
        _require(d, field, False, False)
    _require(d, "attention_dropout", 0.0, 0.0)
    qwen2 = d["model_type"] == "qwen2"
    theta, scaling = _rope(d)
    tied = d.get("tie_word_embeddings", False)
    config = DecoderConfig(vocab_size=d["vocab_size"], d_model=hidden, n_heads=heads,
                           n_kv_heads=d.get("num_key_value_heads") or heads, d_ff=d["intermediate_size"],
                           n_layers=n_layers, max_len=d.get("max_position_embeddings", 2048), dropout=0.0,
                           activation="swiglu", norm="pre", norm_type="rmsnorm", positional="rotary", rope_theta=theta,
                           rope_scaling=scaling, tie_embeddings=tied, eps=d.get("rms_norm_eps", 1e-6), bias=False,
                           qkv_bias=qwen2, window=_window(d, n_layers))
    plan = {"embed.tok.weight": (("embed_tokens.weight",), False), **_module("decoder.norm", "norm", bias=False)}
    for i in range(n_layers):
        p, h = f"decoder.layers.{i}", f"layers.{i}"
        plan |= (_module(f"{p}.res_self.norm", f"{h}.input_layernorm", bias=False)
                 | _module(f"{p}.res_ff.norm", f"{h}.post_attention_layernorm", bias=False)
                 | {f"{p}.self_attn.qkv_proj.weight": _rows(f"{h}.self_attn.", "q_proj.weight", "k_proj.weight",
                                                            "v_proj.weight")}
                 | _module(f"{p}.self_attn.out_proj", f"{h}.self_attn.o_proj", bias=False)
                 | {f"{p}.ff.fc1.weight": _rows(f"{h}.mlp.", "gate_proj.weight", "up_proj.weight")}
                 | _module(f"{p}.ff.fc2", f"{h}.mlp.down_proj", bias=False))
        if qwen2:
            plan[f"{p}.self_attn.qkv_proj.bias"] = _rows(f"{h}.self_attn.", "q_proj.bias", "k_proj.bias", "v_proj.bias")
    return Architecture(config, plan, _head(plan, tied) + (r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq",))


def bert(d: dict, names) -> Architecture:
    """BertModel: the embeddings, encoder and pooler (when the checkpoint has one); a BertFor* checkpoint's task heads
    (cls.*) are not loaded."""
    _require(d, "position_embedding_type", "absolute", "absolute")
    _require(d, "is_decoder", False, False)
    _require(d, "add_cross_attention", False, False)
    pooler = "pooler.dense.weight" in names
    config = bert_base(vocab_size=d["vocab_size"], d_model=d["hidden_size"], n_heads=d["num_attention_heads"],
                       n_layers=d["num_hidden_layers"], d_ff=d["intermediate_size"],
                       max_len=d["max_position_embeddings"], dropout=d.get("hidden_dropout_prob", 0.1),
                       activation=_activation(d.get("hidden_act", "gelu")), eps=d.get("layer_norm_eps", 1e-12),
                       type_vocab_size=d.get("type_vocab_size", 2), pooler=pooler)
    e = "embeddings."
    plan = {"embed.tok.weight": ((f"{e}word_embeddings.weight",), False),
            "embed.pos.weight": ((f"{e}position_embeddings.weight",), False),
            "embed.types.weight": ((f"{e}token_type_embeddings.weight",), False), **_module("embed.norm", f"{e}LayerNorm")}
    if pooler:
        plan |= _module("pooler", "pooler.dense")
    for i in range(config.n_layers):
        p, h = f"encoder.layers.{i}", f"encoder.layer.{i}"
        a = f"{h}.attention.self."
        plan |= ({f"{p}.self_attn.qkv_proj.weight": _rows(a, "query.weight", "key.weight", "value.weight"),
                  f"{p}.self_attn.qkv_proj.bias": _rows(a, "query.bias", "key.bias", "value.bias")}
                 | _module(f"{p}.self_attn.out_proj", f"{h}.attention.output.dense")
                 | _module(f"{p}.res_attn.norm", f"{h}.attention.output.LayerNorm")
                 | _module(f"{p}.ff.fc1", f"{h}.intermediate.dense") | _module(f"{p}.ff.fc2", f"{h}.output.dense")
                 | _module(f"{p}.res_ff.norm", f"{h}.output.LayerNorm"))
    return Architecture(config, plan, (r"embeddings\.position_ids", r"cls\..*"))


# model_type -> (the backbone's prefix in a task model's tensor names, optional in a file; the architecture)
ARCHITECTURES: dict[str, tuple[str, Callable[[dict, set], Architecture]]] = {
    "gpt2": ("transformer.", gpt2), "llama": ("model.", llama), "mistral": ("model.", llama),
    "qwen2": ("model.", llama), "bert": ("bert.", bert)}


def normalized_name(name: str, prefix: str) -> str:
    """A Hugging Face tensor name without the backbone prefix, with the LayerNorm gamma/beta of old checkpoints
    renamed weight/bias (as transformers does on load)."""
    name = name.removeprefix(prefix)
    for old, new in ((".gamma", ".weight"), (".beta", ".bias")):
        if name.endswith(old) and "LayerNorm" in name:
            name = name[: -len(old)] + new
    return name


def architecture(d: dict, names) -> tuple[Architecture, dict[str, str]]:
    """The Architecture of a config dict (with "model_type") and its tensors' names, and the map from normalized
    names (those the plan uses) to the names as given."""
    model_type = d.get("model_type")
    if model_type not in ARCHITECTURES:
        raise ValueError(f"model_type: {model_type!r} is not supported (one of {sorted(ARCHITECTURES)})")
    prefix, build = ARCHITECTURES[model_type]
    given = {normalized_name(n, prefix): n for n in names}
    return build(d, set(given)), given
