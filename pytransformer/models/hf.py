"""Hugging Face architectures, one home per model_type: its config fields -> our config, and its tensor names -> our
parameters. Both DecoderLM/EncoderModel.from_hf (a transformers model in memory: config.to_dict() and state_dict())
and from_pretrained (a save_pretrained directory: config.json and safetensors files) go through `architecture`, and
checkpoint.py loads the tensors; transformers itself is never imported.

Supported model_type values: "gpt2" (GPT2LMHeadModel), "llama", "mistral", "qwen2", "qwen3", "phi3" (their *ForCausalLM)
and "gemma3_text" (Gemma3ForCausalLM) -> DecoderLM; "bert" (BertModel, or the encoder and pooler of a BertFor*
checkpoint) -> EncoderModel; "marian" (MarianMTModel, the Helsinki-NLP opus-mt translation models) ->
Seq2SeqTransformer. A config field that would make the Hugging Face model compute something our model does not, or that
is missing, of the wrong type or out of range, raises ValueError naming the field; nothing here allocates tensors.

Decisions: Hugging Face's q/k/v (and gate/up) projections are concatenated by rows into our fused qkv_proj (and the
SwiGLU fc1 = gate | up; Phi-3's come fused); RoPE needs no permutation (both use the rotate-half layout). Rope types:
default and llama3 (any other rope_type, and partial_rotary_factor != 1, raise). Mistral's and Phi-3's sliding_window
applies to every layer; Qwen2's and Qwen3's use_sliding_window only when it makes every layer windowed (a mix raises,
naming layer_types). attention_dropout (and Phi-3's resid_pdrop and embd_pdrop) must be 0 (our one dropout rate would
also act on the residuals). Marian: one table for source and target embeddings and the output projection
(share_encoder_decoder_embeddings and tie_word_embeddings true), embeddings scaled by sqrt(d_model) (scale_embedding
true), sinusoidal positions with the sines first ("sinusoidal_halves"), post-norm layers; its final_logits_bias buffer
must be zeros (checkpoint.py; transformers never trains it), and its positional tables are recomputed. A tied
checkpoint's copies of the embedding (lm_head.weight, and Marian's encoder/decoder embed_tokens.weight: present in
state_dict(), absent from save_pretrained files) are not loaded when they equal the embedding (checkpoint.py refuses a
different one; for lm_head: set tie_word_embeddings to false to use it); buffers of older versions (GPT-2's attn.bias
mask, Llama's rotary_emb.inv_freq, BERT's position_ids) and the task heads of BertFor* checkpoints (cls.* of the
masked-LM and pre-training models, classifier.* of the sequence, token and multiple-choice classifiers, qa_outputs.* of
question answering) are skipped; any other tensor the plan does not use is an error."""
import math
from typing import Callable, NamedTuple

from .configs import DecoderConfig, EncoderConfig, Seq2SeqConfig, bert_base, gpt2_small

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu",
                "silu": "silu", "swish": "silu"}


class Architecture(NamedTuple):
    """A checkpoint's architecture in our terms."""
    config: DecoderConfig | EncoderConfig | Seq2SeqConfig
    plan: dict  # our parameter name -> Source
    ignored: tuple[str, ...]  # regular expressions of Hugging Face tensor names that are not loaded
    sizes: dict  # the config fields that set tensor sizes -> their values (named when a tensor's shape disagrees)
    copies: dict = {}  # Hugging Face names of tied copies -> the tensor each must equal when present (not loaded)
    zeros: dict = {}  # Hugging Face tensors that must be there and hold zeros (not loaded) -> their shape


class Source(NamedTuple):
    """The Hugging Face tensors of one of our parameters: concatenated by rows (`rows`: each one's row count; None
    for a single tensor), or one tensor transposed, or one tensor plus `offset` (Gemma's RMSNorm weights, stored as
    weight - 1; added in float32)."""
    names: tuple[str, ...]
    transpose: bool = False
    rows: tuple[int, ...] | None = None
    offset: float = 0.0


def _activation(d: dict, field: str, default: str) -> str:
    """Our name of the config's activation `field`; ValueError naming the field when it is not one we compute."""
    name = d.get(field, default)
    if not isinstance(name, str) or name not in _ACTIVATIONS:
        raise ValueError(f"{field}: activation {name!r} is not supported ({sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def _integer(d: dict, field: str, default=None, least: int = 1) -> int:
    """The config's integer `field` (default when absent or null; an integral float such as 3e8 counts), at least
    `least`; ValueError naming the field otherwise."""
    value = d.get(field)
    value = default if value is None else value
    if value is None:
        raise ValueError(f"{field}: missing (a required field of model_type {d['model_type']!r})")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{field}: expected an integer >= {least}, got {value!r}")
    return value


def _number(d: dict, field: str, default: float, least: float = 0.0, below: float = math.inf) -> float:
    """The config's number `field` (default when absent or null) in [least, below); ValueError naming it otherwise."""
    value = d.get(field)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not least <= value < below:
        raise ValueError(f"{field}: expected a number in [{least}, {below}), got {value!r}")
    return float(value)


def _flag(d: dict, field: str, default: bool) -> bool:
    """The config's boolean `field` (default when absent); ValueError naming it otherwise."""
    value = d.get(field, default)
    if not isinstance(value, bool):
        raise ValueError(f"{field}: expected true or false, got {value!r}")
    return value


def _heads(d: dict, width: str, heads: str, kv_heads: str | None = None, *,
           head_width: bool = False) -> tuple[int, int, int]:
    """(width, heads, key/value heads) of the config: the width a multiple of the heads (unless head_width and the
    config sets head_dim, each head's own width), the heads of the key/value heads; ValueError naming the field
    otherwise."""
    w, h = _integer(d, width), _integer(d, heads)
    kv = _integer(d, kv_heads, h) if kv_heads else h
    if w % h and not (head_width and d.get("head_dim") is not None):
        raise ValueError(f"{heads}: {h} does not divide {width} {w}")
    if h % kv:
        raise ValueError(f"{kv_heads}: {kv} does not divide {heads} {h}")
    return w, h, kv


def _layers(d: dict, field: str, names) -> int:
    """The number of layers; ValueError naming the field when the checkpoint has fewer tensors than layers (each
    layer has several), so an absurd count fails before a plan of that many layers is built."""
    n = _integer(d, field)
    if n > len(names):
        raise ValueError(f"{field}: {n} layers, but the checkpoint holds only {len(names)} tensors")
    return n


def _require(d: dict, field: str, supported, default=None) -> None:
    """ValueError naming `field` when the config's value (default when absent) is not the one we compute."""
    value = d.get(field, default)
    if value != supported:
        raise ValueError(f"{field}: {value!r} is not supported by pytransformer (only {supported!r})")


def _rows(prefix: str, names: tuple[str, ...], rows: tuple[int, ...]) -> Source:
    """Tensors prefix + names, of `rows` rows each, concatenated by rows."""
    return Source(tuple(f"{prefix}{n}" for n in names), rows=rows)


def _fused_qkv(ours: str, prefix: str, names: tuple[str, str, str], rows: tuple[int, ...], bias: bool) -> dict:
    """Our fused `ours`.qkv_proj weight (and bias) from the query, key and value projections prefix + names[i],
    concatenated by rows."""
    kinds = ("weight", "bias") if bias else ("weight",)
    return {f"{ours}.qkv_proj.{k}": _rows(prefix, tuple(f"{n}.{k}" for n in names), rows) for k in kinds}


def _module(ours: str, theirs: str, bias: bool = True, transpose: bool = False) -> dict:
    """The weight (transposed if asked) and bias of a Linear or norm."""
    return ({f"{ours}.weight": Source((f"{theirs}.weight",), transpose)}
            | ({f"{ours}.bias": Source((f"{theirs}.bias",))} if bias else {}))


def _head(plan: dict, tied: bool) -> dict:
    """Add the untied LM head to plan; a tied checkpoint may still hold it (as state_dict() does): Architecture.copies
    of the embedding."""
    if not tied:
        plan["lm_head.weight"] = Source(("lm_head.weight",))
    return {"lm_head.weight": plan["embed.tok.weight"].names[0]} if tied else {}


def gpt2(d: dict, names) -> Architecture:
    """GPT2LMHeadModel (Conv1D weights are [in, out]: transposed)."""
    _require(d, "scale_attn_weights", True, True)
    _require(d, "scale_attn_by_inverse_layer_idx", False, False)
    _require(d, "add_cross_attention", False, False)
    tied = _flag(d, "tie_word_embeddings", True)
    width, heads, _ = _heads(d, "n_embd", "n_head")
    sizes = {"vocab_size": _integer(d, "vocab_size"), "n_embd": width, "n_inner": _integer(d, "n_inner", 4 * width),
             "n_positions": _integer(d, "n_positions")}
    config = gpt2_small(vocab_size=sizes["vocab_size"], d_model=width, n_heads=heads,
                        n_layers=_layers(d, "n_layer", names), d_ff=sizes["n_inner"], max_len=sizes["n_positions"],
                        dropout=_number(d, "resid_pdrop", 0.1, below=1.0),
                        activation=_activation(d, "activation_function", "gelu_new"),
                        eps=_number(d, "layer_norm_epsilon", 1e-5), tie_embeddings=tied)
    plan = {"embed.tok.weight": Source(("wte.weight",)), "embed.pos.weight": Source(("wpe.weight",)),
            **_module("decoder.norm", "ln_f")}
    for i in range(config.n_layers):
        p, h = f"decoder.layers.{i}", f"h.{i}"
        plan |= (_module(f"{p}.res_self.norm", f"{h}.ln_1") | _module(f"{p}.res_ff.norm", f"{h}.ln_2")
                 | _module(f"{p}.self_attn.qkv_proj", f"{h}.attn.c_attn", transpose=True)
                 | _module(f"{p}.self_attn.out_proj", f"{h}.attn.c_proj", transpose=True)
                 | _module(f"{p}.ff.fc1", f"{h}.mlp.c_fc", transpose=True)
                 | _module(f"{p}.ff.fc2", f"{h}.mlp.c_proj", transpose=True))
    return Architecture(config, plan, (r"h\.\d+\.attn\.(masked_)?bias",), sizes, _head(plan, tied))  # old masks


def _rope(d: dict) -> tuple[float, dict | None]:
    """rope_theta and the scaling dict (None: plain RoPE), from transformers 5's `rope_parameters` or the older
    top-level `rope_theta` and `rope_scaling`."""
    field = "rope_parameters" if d.get("rope_parameters") else "rope_scaling"
    params = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ValueError(f"{field}: expected a JSON object, got {params!r}")
    params = {**params} if field == "rope_parameters" else {**params, "rope_theta": d.get("rope_theta")}
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"partial_rotary_factor: {params['partial_rotary_factor']!r} is not supported (only 1.0)")
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str):
        raise ValueError(f"{field}: rope_type: expected a string, got {kind!r}")
    for name in ("rope_theta", "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if name in params or name == "rope_theta":
            params[name] = _number(params, name, 1e4, least=1e-30)
    return params["rope_theta"], None if kind == "default" else {**params, "rope_type": kind}


def _layer_types(d: dict, n_layers: int, derived: Callable[[int], str]) -> list[str]:
    """The config's layer_types: n_layers of "full_attention" and "sliding_attention"; where absent (configs saved
    before transformers wrote it), derived(i) for each layer i, as transformers derives them; ValueError naming the
    field otherwise."""
    types = d.get("layer_types")
    types = [derived(i) for i in range(n_layers)] if types is None else types
    if not (isinstance(types, list) and len(types) == n_layers
            and all(t in ("full_attention", "sliding_attention") for t in types)):
        raise ValueError(f"layer_types: expected {n_layers} of 'full_attention' and 'sliding_attention', got {types!r}")
    return types


def _window(d: dict, n_layers: int) -> int | None:
    """The sliding window of every layer (None: full attention); ValueError for a mix of full and windowed layers."""
    if d["model_type"] in ("mistral", "phi3"):
        return None if d.get("sliding_window") is None else _integer(d, "sliding_window")
    if d["model_type"] == "llama" or not _flag(d, "use_sliding_window", False):
        return None
    kinds = set(_layer_types(d, n_layers, lambda i: "full_attention" if i < _integer(
        d, "max_window_layers", n_layers, least=0) else "sliding_attention"))
    if len(kinds) > 1:
        raise ValueError(f"layer_types: {d['model_type']} with use_sliding_window and max_window_layers mixes full and"
                         " sliding-window attention layers, which is not supported (one window for all layers)")
    return _integer(d, "sliding_window") if kinds == {"sliding_attention"} else None


def _head_sizes(d: dict, default_head_dim: int | None = None) -> tuple[dict, dict]:
    """A decoder whose heads may have a width of their own (head_dim; default hidden_size // num_attention_heads, or
    default_head_dim): (the config's sizes, our config's d_model, n_heads, n_kv_heads and d_head (None: the
    default width))."""
    hidden, heads, kv_heads = _heads(d, "hidden_size", "num_attention_heads", "num_key_value_heads", head_width=True)
    head_dim = _integer(d, "head_dim", default_head_dim or hidden // heads)
    return ({"vocab_size": _integer(d, "vocab_size"), "hidden_size": hidden,
             "intermediate_size": _integer(d, "intermediate_size"), "head_dim": head_dim,
             "num_attention_heads * head_dim": heads * head_dim, "num_key_value_heads * head_dim": kv_heads * head_dim},
            {"d_model": hidden, "n_heads": heads, "n_kv_heads": kv_heads,
             "d_head": None if head_dim * heads == hidden else head_dim})


def _gated_mlp(p: str, h: str, d_ff: int, fused: bool = False) -> dict:
    """Our fc1 (gate | up rows) and fc2 from a gated MLP's gate_proj and up_proj (fused: its gate_up_proj, Phi-3's)
    and down_proj."""
    fc1 = (_module(f"{p}.ff.fc1", f"{h}.mlp.gate_up_proj", bias=False) if fused else
           {f"{p}.ff.fc1.weight": _rows(f"{h}.mlp.", ("gate_proj.weight", "up_proj.weight"), (d_ff, d_ff))})
    return fc1 | _module(f"{p}.ff.fc2", f"{h}.mlp.down_proj", bias=False)


def _qkv_rows(sizes: dict) -> tuple[int, int, int]:
    """The rows of q, k and v in our fused qkv_proj."""
    return (sizes["num_attention_heads * head_dim"], *[sizes["num_key_value_heads * head_dim"]] * 2)


def llama(d: dict, names) -> Architecture:
    """LlamaForCausalLM, MistralForCausalLM (sliding window), Qwen2ForCausalLM (Q/K/V biases), Qwen3ForCausalLM
    (an RMSNorm over each head of q and k before rotary) and Phi3ForCausalLM (q|k|v and gate|up fused in the
    checkpoint as in ours; sliding window): pre-RMSNorm, rotary (rotate-half, as ours: no permutation), SwiGLU (fc1
    rows = gate_proj | up_proj), GQA, heads of head_dim (default hidden_size // num_attention_heads)."""
    sizes, heads = _head_sizes(d)
    n_layers = _layers(d, "num_hidden_layers", names)
    _require(d, "hidden_act", "silu", "silu")
    for field in ("attention_bias", "mlp_bias"):
        _require(d, field, False, False)
    qwen2, qwen3, phi3 = (d["model_type"] == t for t in ("qwen2", "qwen3", "phi3"))
    for field in ("attention_dropout",) + (("resid_pdrop", "embd_pdrop") if phi3 else ()):
        _require(d, field, 0.0, 0.0)
    theta, scaling = _rope(d)
    tied = _flag(d, "tie_word_embeddings", False)
    if phi3:  # the fused tensors' rows
        sizes |= {"(num_attention_heads + 2 * num_key_value_heads) * head_dim": sum(_qkv_rows(sizes)),
                  "2 * intermediate_size": 2 * sizes["intermediate_size"]}
    config = DecoderConfig(vocab_size=sizes["vocab_size"], **heads,
                           d_ff=sizes["intermediate_size"], n_layers=n_layers,
                           max_len=_integer(d, "max_position_embeddings", 2048), dropout=0.0, activation="swiglu",
                           norm="pre", norm_type="rmsnorm", positional="rotary", rope_theta=theta, rope_scaling=scaling,
                           tie_embeddings=tied, eps=_number(d, "rms_norm_eps", 1e-6), bias=False, qkv_bias=qwen2,
                           window=_window(d, n_layers), qk_norm=qwen3)
    plan = {"embed.tok.weight": Source(("embed_tokens.weight",)), **_module("decoder.norm", "norm", bias=False)}
    for i in range(n_layers):
        p, h = f"decoder.layers.{i}", f"layers.{i}"
        qkv = (_module(f"{p}.self_attn.qkv_proj", f"{h}.self_attn.qkv_proj", bias=False) if phi3 else
               _fused_qkv(f"{p}.self_attn", f"{h}.self_attn.", ("q_proj", "k_proj", "v_proj"), _qkv_rows(sizes), qwen2))
        plan |= (_module(f"{p}.res_self.norm", f"{h}.input_layernorm", bias=False)
                 | _module(f"{p}.res_ff.norm", f"{h}.post_attention_layernorm", bias=False)
                 | qkv | _module(f"{p}.self_attn.out_proj", f"{h}.self_attn.o_proj", bias=False)
                 | _gated_mlp(p, h, config.d_ff, fused=phi3))
        if qwen3:
            plan |= (_module(f"{p}.self_attn.q_norm", f"{h}.self_attn.q_norm", bias=False)
                     | _module(f"{p}.self_attn.k_norm", f"{h}.self_attn.k_norm", bias=False))
    return Architecture(config, plan, (r"layers\.\d+\.self_attn\.rotary_emb\.inv_freq",), sizes, _head(plan, tied))


def bert(d: dict, names) -> Architecture:
    """BertModel: the embeddings, encoder and pooler (when the checkpoint has one); a BertFor* checkpoint's task heads
    (cls.*, classifier.*, qa_outputs.*) are not loaded."""
    _require(d, "position_embedding_type", "absolute", "absolute")
    _require(d, "is_decoder", False, False)
    _require(d, "add_cross_attention", False, False)
    pooler = "pooler.dense.weight" in names
    hidden, heads, _ = _heads(d, "hidden_size", "num_attention_heads")
    sizes = {field: _integer(d, field, default) for field, default in (
        ("vocab_size", None), ("intermediate_size", None), ("max_position_embeddings", None), ("type_vocab_size", 2))}
    config = bert_base(vocab_size=sizes["vocab_size"], d_model=hidden, n_heads=heads,
                       n_layers=_layers(d, "num_hidden_layers", names), d_ff=sizes["intermediate_size"],
                       max_len=sizes["max_position_embeddings"],
                       dropout=_number(d, "hidden_dropout_prob", 0.1, below=1.0),
                       activation=_activation(d, "hidden_act", "gelu"), eps=_number(d, "layer_norm_eps", 1e-12),
                       type_vocab_size=sizes["type_vocab_size"], pooler=pooler)
    e = "embeddings."
    plan = {"embed.tok.weight": Source((f"{e}word_embeddings.weight",)),
            "embed.pos.weight": Source((f"{e}position_embeddings.weight",)),
            "embed.types.weight": Source((f"{e}token_type_embeddings.weight",)),
            **_module("embed.norm", f"{e}LayerNorm")}
    if pooler:
        plan |= _module("pooler", "pooler.dense")
    for i in range(config.n_layers):
        p, h = f"encoder.layers.{i}", f"encoder.layer.{i}"
        plan |= (_fused_qkv(f"{p}.self_attn", f"{h}.attention.self.", ("query", "key", "value"), (hidden,) * 3, True)
                 | _module(f"{p}.self_attn.out_proj", f"{h}.attention.output.dense")
                 | _module(f"{p}.res_attn.norm", f"{h}.attention.output.LayerNorm")
                 | _module(f"{p}.ff.fc1", f"{h}.intermediate.dense") | _module(f"{p}.ff.fc2", f"{h}.output.dense")
                 | _module(f"{p}.res_ff.norm", f"{h}.output.LayerNorm"))
    return Architecture(config, plan, (r"embeddings\.position_ids", r"(cls|classifier|qa_outputs)\..*"),
                        sizes | {"hidden_size": hidden})


def gemma3(d: dict, names) -> Architecture:
    """Gemma3ForCausalLM (model_type gemma3_text: Gemma 3 270M and 1B): sandwich RMSNorms whose weights are stored as
    weight - 1 (Source.offset), embeddings times sqrt(hidden_size), GeGLU (tanh GELU), q/k norms, heads of head_dim,
    sliding-window layers (their own rotary base) with full-attention ones among them (layer_types), tied head."""
    sizes, heads = _head_sizes(d, default_head_dim=256)
    head_dim = sizes["head_dim"]
    n_layers = _layers(d, "num_hidden_layers", names)
    _require(d, "hidden_activation", "gelu_pytorch_tanh", "gelu_pytorch_tanh")
    _require(d, "attention_bias", False, False)
    _require(d, "attention_dropout", 0.0, 0.0)
    _require(d, "query_pre_attn_scalar", head_dim, head_dim)  # the softmax scale is ours, head_dim ** -0.5
    for field in ("attn_logit_softcapping", "final_logit_softcapping"):
        _require(d, field, None)
    _require(d, "use_bidirectional_attention", False, False)
    params = d.get("rope_parameters")
    if params is None:  # as transformers 4 saved it: rope_theta and rope_scaling, rope_local_base_freq
        theta, scaling = _rope(d)
        local_theta, local_scaling = _number(d, "rope_local_base_freq", 10000.0, least=1e-30), None
    elif isinstance(params, dict) and set(params) == {"full_attention", "sliding_attention"}:
        theta, scaling = _rope({"rope_parameters": params["full_attention"]})
        local_theta, local_scaling = _rope({"rope_parameters": params["sliding_attention"]})
    else:
        raise ValueError(f"rope_parameters: expected the full_attention and sliding_attention layers', got {params!r}")
    if local_scaling is not None:
        raise ValueError(f"rope_parameters: sliding_attention: {local_scaling['rope_type']!r} is not supported "
                         "(only default)")
    types = _layer_types(d, n_layers, lambda i: "sliding_attention" if (i + 1) % _integer(
        d, "sliding_window_pattern", 6) else "full_attention")
    full = tuple(i for i, t in enumerate(types) if t == "full_attention")
    window = None if len(full) == n_layers else _integer(d, "sliding_window")
    mixed = window is not None and bool(full)  # else one rotary base: the sliding layers' when every layer is one
    theta, scaling = (local_theta, None) if window is not None and not full else (theta, scaling)
    tied = _flag(d, "tie_word_embeddings", True)
    config = DecoderConfig(vocab_size=sizes["vocab_size"], **heads,
                           d_ff=sizes["intermediate_size"], n_layers=n_layers,
                           max_len=_integer(d, "max_position_embeddings", 32768), dropout=0.0, activation="geglu",
                           norm="sandwich", norm_type="rmsnorm", positional="rotary", rope_theta=theta,
                           rope_scaling=scaling, tie_embeddings=tied, eps=_number(d, "rms_norm_eps", 1e-6), bias=False,
                           window=window, global_layers=full if mixed else (),
                           local_rope_theta=local_theta if mixed else None,
                           qk_norm=True, scale_embeddings=True)

    def norm(ours, theirs):
        return {f"{ours}.weight": Source((f"{theirs}.weight",), offset=1.0)}
    plan = {"embed.tok.weight": Source(("embed_tokens.weight",)), **norm("decoder.norm", "norm")}
    for i in range(n_layers):
        p, h = f"decoder.layers.{i}", f"layers.{i}"
        plan |= (norm(f"{p}.res_self.norm", f"{h}.input_layernorm")
                 | norm(f"{p}.res_self.out_norm", f"{h}.post_attention_layernorm")
                 | norm(f"{p}.res_ff.norm", f"{h}.pre_feedforward_layernorm")
                 | norm(f"{p}.res_ff.out_norm", f"{h}.post_feedforward_layernorm")
                 | _fused_qkv(f"{p}.self_attn", f"{h}.self_attn.", ("q_proj", "k_proj", "v_proj"), _qkv_rows(sizes),
                              False)
                 | norm(f"{p}.self_attn.q_norm", f"{h}.self_attn.q_norm")
                 | norm(f"{p}.self_attn.k_norm", f"{h}.self_attn.k_norm")
                 | _module(f"{p}.self_attn.out_proj", f"{h}.self_attn.o_proj", bias=False)
                 | _gated_mlp(p, h, config.d_ff))
    return Architecture(config, plan, (), sizes, _head(plan, tied))


def marian(d: dict, names) -> Architecture:
    """MarianMTModel: post-norm encoder-decoder, one embedding table (source, target, output), sinusoidal positions
    with the sines first, embeddings scaled by sqrt(d_model)."""
    width, heads, _ = _heads(d, "d_model", "encoder_attention_heads")
    sizes = {"vocab_size": _integer(d, "vocab_size"), "d_model": width,
             "encoder_ffn_dim": _integer(d, "encoder_ffn_dim"),
             "max_position_embeddings": _integer(d, "max_position_embeddings")}
    _require(d, "decoder_attention_heads", heads)
    _require(d, "decoder_ffn_dim", sizes["encoder_ffn_dim"])
    _require(d, "decoder_vocab_size", sizes["vocab_size"], sizes["vocab_size"])
    for field, default in (("scale_embedding", False), ("share_encoder_decoder_embeddings", True),
                           ("tie_word_embeddings", True)):
        _require(d, field, True, default)
    for field in ("attention_dropout", "activation_dropout", "encoder_layerdrop", "decoder_layerdrop"):
        _require(d, field, 0.0, 0.0)
    config = Seq2SeqConfig(vocab_size=sizes["vocab_size"], d_model=width, n_heads=heads, d_ff=sizes["encoder_ffn_dim"],
                           n_encoder_layers=_layers(d, "encoder_layers", names),
                           n_decoder_layers=_layers(d, "decoder_layers", names),
                           max_len=sizes["max_position_embeddings"], dropout=_number(d, "dropout", 0.1, below=1.0),
                           activation=_activation(d, "activation_function", "gelu"), norm="post",
                           positional="sinusoidal_halves", tie_embeddings=True, eps=1e-5)
    plan = {"src_embed.tok.weight": Source(("shared.weight",))}
    for side, n_layers in (("encoder", config.n_encoder_layers), ("decoder", config.n_decoder_layers)):
        # (our attention, its residual, Hugging Face's attention, whose layer norm is <name>_layer_norm)
        blocks = [("self_attn", "res_attn" if side == "encoder" else "res_self", "self_attn")]
        blocks += [("cross_attn", "res_cross", "encoder_attn")] if side == "decoder" else []
        for i in range(n_layers):
            p = f"{side}.layers.{i}"  # the same path in both
            for ours, residual, theirs in blocks:
                plan |= (_fused_qkv(f"{p}.{ours}", f"{p}.{theirs}.", ("q_proj", "k_proj", "v_proj"), (width,) * 3,
                                    True)
                         | _module(f"{p}.{ours}.out_proj", f"{p}.{theirs}.out_proj")
                         | _module(f"{p}.{residual}.norm", f"{p}.{theirs}_layer_norm"))
            plan |= (_module(f"{p}.ff.fc1", f"{p}.fc1") | _module(f"{p}.ff.fc2", f"{p}.fc2")
                     | _module(f"{p}.res_ff.norm", f"{p}.final_layer_norm"))
    copies = {name: "shared.weight" for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight",
                                                 "lm_head.weight")}
    return Architecture(config, plan, (r"(encoder|decoder)\.embed_positions\.weight",), sizes, copies,
                        {"final_logits_bias": [1, config.vocab_size]})


# model_type -> (the backbone's prefix in a task model's tensor names, optional in a file; the config class it builds;
# the architecture)
ARCHITECTURES: dict[str, tuple[str, type, Callable[[dict, set], Architecture]]] = {
    "gpt2": ("transformer.", DecoderConfig, gpt2), "llama": ("model.", DecoderConfig, llama),
    "mistral": ("model.", DecoderConfig, llama), "qwen2": ("model.", DecoderConfig, llama),
    "qwen3": ("model.", DecoderConfig, llama), "phi3": ("model.", DecoderConfig, llama),
    "gemma3_text": ("model.", DecoderConfig, gemma3),
    "bert": ("bert.", EncoderConfig, bert), "marian": ("model.", Seq2SeqConfig, marian)}


def normalized_name(name: str, prefix: str) -> str:
    """A Hugging Face tensor name without the backbone prefix, with the LayerNorm gamma/beta of old checkpoints
    renamed weight/bias (as transformers does on load)."""
    name = name.removeprefix(prefix)
    for old, new in ((".gamma", ".weight"), (".beta", ".bias")):
        if name.endswith(old) and "LayerNorm" in name:
            name = name[: -len(old)] + new
    return name


def backbone_prefix(d, config_class: type, model: str) -> str:
    """The backbone prefix of a config dict's model_type; ValueError naming model_type when it is not supported, or
    is not an architecture of `model` (whose config is a config_class), before any other field is read."""
    if not isinstance(d, dict):
        raise ValueError(f"expected a JSON object of config fields, got {type(d).__name__}")
    model_type = d.get("model_type")
    if not isinstance(model_type, str) or model_type not in ARCHITECTURES:
        raise ValueError(f"model_type: {model_type!r} is not supported (one of {sorted(ARCHITECTURES)})")
    prefix, config, _ = ARCHITECTURES[model_type]
    if config is not config_class:
        raise ValueError(f"model_type: {model_type!r} is not a {model} architecture (those are "
                         f"{sorted(t for t, (_, c, _) in ARCHITECTURES.items() if c is config_class)})")
    return prefix


def architecture(d: dict, names) -> Architecture:
    """The Architecture of a config dict (checked by backbone_prefix) and its tensors' normalized names."""
    return ARCHITECTURES[d["model_type"]][2](d, set(names))
