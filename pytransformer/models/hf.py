"""Import of Hugging Face GPT2LMHeadModel and BertModel objects (already in memory) into our models (the classmethods
DecoderLM.from_hf / EncoderModel.from_hf, which pass their class as `cls`)."""
import torch

from .configs import bert_base, gpt2_small

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def _activation(name: str) -> str:
    if name not in _ACTIVATIONS:
        raise ValueError(f"model: activation {name!r} is not supported ({sorted(_ACTIVATIONS)})")
    return _ACTIVATIONS[name]


def _linear(prefix: str, weight, bias, transpose: bool = False) -> dict:
    return {f"{prefix}.weight": weight.t() if transpose else weight, f"{prefix}.bias": bias}


def _norm(prefix: str, norm) -> dict:
    return {f"{prefix}.weight": norm.weight, f"{prefix}.bias": norm.bias}


def decoder_lm_from_hf(cls, model):
    """DecoderLM with the config and weights of a transformers GPT2LMHeadModel (Conv1D weights are [in, out])."""
    c, t = model.config, model.transformer
    tied = model.lm_head.weight is t.wte.weight
    config = gpt2_small(vocab_size=c.vocab_size, d_model=c.n_embd, n_heads=c.n_head, n_layers=c.n_layer,
                        d_ff=c.n_inner or 4 * c.n_embd, max_len=c.n_positions, dropout=c.resid_pdrop,
                        activation=_activation(c.activation_function), eps=c.layer_norm_epsilon, tie_embeddings=tied)
    state = {"embed.tok.weight": t.wte.weight, "embed.pos.weight": t.wpe.weight, "lm_head.weight": model.lm_head.weight,
             **_norm("decoder.norm", t.ln_f)}
    for i, h in enumerate(t.h):
        p = f"decoder.layers.{i}"
        state |= (_norm(f"{p}.res_self.norm", h.ln_1) | _norm(f"{p}.res_ff.norm", h.ln_2)
                  | _linear(f"{p}.self_attn.qkv_proj", h.attn.c_attn.weight, h.attn.c_attn.bias, True)
                  | _linear(f"{p}.self_attn.out_proj", h.attn.c_proj.weight, h.attn.c_proj.bias, True)
                  | _linear(f"{p}.ff.fc1", h.mlp.c_fc.weight, h.mlp.c_fc.bias, True)
                  | _linear(f"{p}.ff.fc2", h.mlp.c_proj.weight, h.mlp.c_proj.bias, True))
    return _load(cls(config), state, model)


def encoder_model_from_hf(cls, model):
    """EncoderModel with the config and weights of a transformers BertModel (pooler included when it has one)."""
    c, e = model.config, model.embeddings
    config = bert_base(vocab_size=c.vocab_size, d_model=c.hidden_size, n_heads=c.num_attention_heads,
                       n_layers=c.num_hidden_layers, d_ff=c.intermediate_size, max_len=c.max_position_embeddings,
                       dropout=c.hidden_dropout_prob, activation=_activation(c.hidden_act), eps=c.layer_norm_eps,
                       type_vocab_size=c.type_vocab_size, pooler=model.pooler is not None)
    state = {"embed.tok.weight": e.word_embeddings.weight, "embed.pos.weight": e.position_embeddings.weight,
             "embed.types.weight": e.token_type_embeddings.weight, **_norm("embed.norm", e.LayerNorm)}
    if model.pooler is not None:
        state |= _linear("pooler", model.pooler.dense.weight, model.pooler.dense.bias)
    for i, layer in enumerate(model.encoder.layer):
        p, a = f"encoder.layers.{i}", layer.attention
        qkv = [a.self.query, a.self.key, a.self.value]
        state |= (_linear(f"{p}.self_attn.qkv_proj", torch.cat([m.weight for m in qkv]), torch.cat([m.bias for m in qkv]))
                  | _linear(f"{p}.self_attn.out_proj", a.output.dense.weight, a.output.dense.bias)
                  | _norm(f"{p}.res_attn.norm", a.output.LayerNorm)
                  | _linear(f"{p}.ff.fc1", layer.intermediate.dense.weight, layer.intermediate.dense.bias)
                  | _linear(f"{p}.ff.fc2", layer.output.dense.weight, layer.output.dense.bias)
                  | _norm(f"{p}.res_ff.norm", layer.output.LayerNorm))
    return _load(cls(config), state, model)


def _load(ours, state: dict, model):
    ours.load_state_dict(state)
    w = next(model.parameters())
    return ours.to(device=w.device, dtype=w.dtype).train(model.training)
