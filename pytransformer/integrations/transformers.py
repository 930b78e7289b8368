"""Our kernels inside Hugging Face transformers models: the attention backend "pytransformer" and patch_linears.

Importing this module (with transformers installed) or calling register() adds the backend, after which
`AutoModelForCausalLM.from_pretrained(path, attn_implementation="pytransformer")` (or
`model.set_attn_implementation("pytransformer")`) runs ops.attention in every attention layer of the model families
that take transformers' attention interface (Llama, Mistral, Qwen2, GPT-2, BERT, ...): prefill and training through
the fused kernel, one-token decoding steps without a mask through ops.decode_attention. The backend's masks are SDPA's
(a bool [B, 1, Lq, Lk] mask, True = may attend, or None where plain causal or full attention is meant), so padding,
sliding windows and packed sequences reach the kernel as they reach SDPA.

patch_linears(model) swaps the model's linear layers for ours (float32/bfloat16 weight streaming, or int8), so that
`model.generate` runs its projections on our kernels too; unpatch_linears(model) puts the original modules back.

transformers is imported lazily (here, only when it is installed), so `import pytransformer` never needs it.
"""
import importlib.util

import torch
from torch import Tensor, nn

from .. import ops
from ..nn import Linear, QuantizedLinear

NAME = "pytransformer"
# Keyword arguments that some model families pass to the attention function and that change its math in ways our
# kernels do not compute: logit soft-capping (Gemma 2), attention sinks (gpt-oss), an additive learned position bias
# (T5-style models: our float masks get no gradient).
UNSUPPORTED = {"softcap": "logit soft-capping", "s_aux": "attention sinks", "sinks": "attention sinks",
               "position_bias": "a learned position bias"}


def _check_supported(kwargs: dict) -> None:
    """ValueError naming the first keyword argument (given, not None) whose math our kernels do not compute."""
    for name, what in UNSUPPORTED.items():
        if kwargs.get(name) is not None:
            raise ValueError(f"{name}: the {NAME!r} attention backend does not support {what}; load the model with "
                             f"attn_implementation='eager' instead")
    if kwargs.get("output_attentions"):
        raise ValueError(f"output_attentions: the {NAME!r} attention backend never forms the attention weights; "
                         f"load the model with attn_implementation='eager' to get them")


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _unmasked(query: Tensor, key: Tensor, value: Tensor, causal: bool, window, scale, dropout: float) -> Tensor:
    """Attention without a mask tensor: full attention, or causal (with the window) aligned as SDPA's is_causal."""
    lq, lk = query.shape[2], key.shape[2]
    if not causal:
        return ops.attention(query, key, value, scale=scale, dropout_p=dropout)
    if lq == 1 and dropout == 0.0 and not _needs_grad(query, key, value):  # a decoding step: the cache read in place
        lengths = torch.full((query.shape[0],), lk, dtype=torch.int32, device=query.device)
        return ops.decode_attention(query, key, value, lengths, scale=scale, window=window, max_length=lk)
    if lq > 1 and lk > lq:
        # transformers leaves the mask out here only for a prefill into an empty static cache, whose keys past the
        # queries are unwritten: SDPA's is_causal (aligned top-left) sees keys j <= i, the first Lq keys bottom-right.
        key, value = key[:, :, :lq], value[:, :, :lq]
    return ops.attention(query, key, value, causal=True, window=window, scale=scale, dropout_p=dropout)


def attention_forward(module: nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                      dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                      sliding_window: int | None = None, **kwargs) -> tuple[Tensor, None]:
    """transformers' attention function on our kernels: query [B, Hq, Lq, D], key/value [B, Hkv, Lk, D/Dv] (GQA heads
    shared, not repeated) and the backend's mask (bool or float [B, 1|Hq, Lq, Lk], or None) -> ([B, Lq, Hq, Dv], None).

    A mask already holds the causal, window and padding pattern (aligned to the cache as transformers built it), so it
    goes to ops.attention alone; without one, is_causal (else module.is_causal, else True) and sliding_window apply.
    A query row that sees no key (a left-padded position) gives zeros."""
    _check_supported(kwargs)
    if attention_mask is not None:
        out = ops.attention(query, key, value, mask=attention_mask, scale=scaling, dropout_p=dropout)
    else:
        causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal)
        out = _unmasked(query, key, value, causal, sliding_window if causal else None, scaling, dropout)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Add the attention backend "pytransformer" (our attention function and SDPA's mask function) to transformers;
    calling it again changes nothing."""
    if importlib.util.find_spec("transformers") is None:
        raise ImportError(f"register: the {NAME!r} attention backend needs the `transformers` package (pip install "
                          f"transformers)")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


class PatchedLinear(Linear):
    """Our Linear in place of a transformers model's linear layer: x is cast to the weight's dtype (bfloat16 weights in
    a float32 model) and the result back to x's. unpatch_linears puts `original` back."""

    def forward(self, x: Tensor) -> Tensor:
        """x [..., in_features] -> [..., out_features] in x's dtype."""
        return super().forward(x.to(self.weight.dtype)).to(x.dtype)


class PatchedQuantizedLinear(QuantizedLinear):
    """Our int8 QuantizedLinear in place of a transformers model's linear layer (ops.int8_linear returns x's dtype);
    unpatch_linears puts `original` back."""


def _conv1d_class():
    """transformers' Conv1D (GPT-2's linear layers: weight [in, out]), or None without transformers."""
    if importlib.util.find_spec("transformers") is None:
        return None
    from transformers.pytorch_utils import Conv1D
    return Conv1D


def _weights(module: nn.Module, conv1d) -> tuple[Tensor, Tensor | None]:
    """A linear layer's weight [out, in] and bias [out] (Conv1D's weight transposed)."""
    if conv1d is not None and type(module) is conv1d:
        return module.weight.detach().t().contiguous(), module.bias
    return module.weight, module.bias


def _parameter(t: Tensor, dtype: torch.dtype, requires_grad: bool) -> nn.Parameter:
    """t itself when it is a parameter of that dtype (shared with the original layer), else a converted copy."""
    if isinstance(t, nn.Parameter) and t.dtype == dtype:
        return t
    return nn.Parameter(t.detach().to(dtype), requires_grad=requires_grad)


def _replacement(module: nn.Module, conv1d, dtype, quantize: bool) -> nn.Module:
    """Our layer computing what `module` (an nn.Linear or Conv1D) computes, its weights in `dtype` (None: theirs)."""
    weight, bias = _weights(module, conv1d)
    dtype = dtype or weight.dtype
    new = PatchedLinear(weight.shape[1], weight.shape[0], bias is not None, device="meta")
    new.weight = _parameter(weight, dtype, module.weight.requires_grad)
    if bias is not None:
        new.bias = _parameter(bias, dtype, bias.requires_grad)
    if quantize:
        new = PatchedQuantizedLinear.from_linear(new)
    new.__dict__["original"] = module  # a plain attribute: not a submodule, so not in the state dict twice
    return new


def patch_linears(model: nn.Module, dtype: torch.dtype | None = None, quantize: bool = False) -> nn.Module:
    """Swap every nn.Linear of `model` (and GPT-2's Conv1D) for ours in place and return the model.

    dtype: the weights' dtype (None or theirs: nn.Linear parameters shared with the original layers, so training
    still updates them; float32, float16 or bfloat16 otherwise: converted copies, x cast to that dtype and the result
    back). quantize=True:
    int8 weights with per-output-channel scales in that dtype (ops.int8_linear; inference only, no backward).
    Subclasses of nn.Linear (other libraries' quantized layers) stay as they are. unpatch_linears(model) undoes it."""
    if dtype is not None and dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"dtype: expected None, torch.float32, torch.float16 or torch.bfloat16, got {dtype}")
    if any(isinstance(m, (PatchedLinear, PatchedQuantizedLinear)) for m in model.modules()):
        raise ValueError("model: its linear layers are patched already; call unpatch_linears(model) first")
    conv1d = _conv1d_class()
    kinds = (nn.Linear,) if conv1d is None else (nn.Linear, conv1d)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) in kinds:
                setattr(parent, name, _replacement(child, conv1d, dtype, quantize))
    return model


def unpatch_linears(model: nn.Module) -> nn.Module:
    """Put back, in place, the original layers that patch_linears replaced (as they were then) and return the model."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, (PatchedLinear, PatchedQuantizedLinear)):
                setattr(parent, name, child.original)
    return model


if importlib.util.find_spec("transformers") is not None:
    register()
