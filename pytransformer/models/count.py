"""Parameter counts by component and KV-cache bytes per token of the named configs (`python -m pytransformer count`)."""
import torch
from torch import nn

from ..nn import FeedForward, LayerNorm, MultiHeadAttention, RMSNorm
from .configs import CONFIGS, DecoderConfig, EncoderConfig, Seq2SeqConfig, count_parameters
from .decoder import DecoderLM
from .encoder import EncoderModel
from .seq2seq import Seq2SeqTransformer

COMPONENTS = ("embeddings", "self-attention", "cross-attention", "feed-forward", "norms", "heads")


def build(name: str, device="meta") -> nn.Module:
    """The model of the named config (CONFIGS), on the meta device by default (shapes only, no memory)."""
    config = CONFIGS[name]()
    model_class = {Seq2SeqConfig: Seq2SeqTransformer, DecoderConfig: DecoderLM, EncoderConfig: EncoderModel}
    with torch.device(device):
        return model_class[type(config)](config)


def _component(name: str, module: nn.Module) -> str | None:
    if isinstance(module, MultiHeadAttention):
        return "cross-attention" if name.endswith("cross_attn") else "self-attention"
    if isinstance(module, FeedForward):
        return "feed-forward"
    if isinstance(module, (LayerNorm, RMSNorm)):
        return "norms"
    if isinstance(module, nn.Embedding):
        return "embeddings"
    return None


def parameters_by_component(model: nn.Module) -> dict[str, int]:
    """Parameter elements per component, each (tied) parameter counted once under its first owner; "heads" holds
    what belongs to none of the others (an untied output projection, a pooler, an MLM transform)."""
    owners = {name: _component(name, m) for name, m in model.named_modules()}
    counts = dict.fromkeys(COMPONENTS, 0)
    for name, p in model.named_parameters():  # tied parameters appear once
        parts = name.split(".")[:-1]
        prefixes = (".".join(parts[:i]) for i in range(len(parts), -1, -1))  # innermost module first
        counts[next((owners[q] for q in prefixes if owners[q]), "heads")] += p.numel()
    return counts


def kv_cache_bytes_per_token(model: nn.Module, dtype=torch.float32) -> dict[str, int]:
    """Bytes a KVCache of `model` holds per token in `dtype`: self-attention per generated (or prompt) token and, for
    an encoder-decoder, cross-attention per source token; empty for an encoder-only model."""
    if isinstance(model, Seq2SeqTransformer):
        cache = model.new_cache(1, 1, 1, device="meta", dtype=dtype)
    elif isinstance(model, DecoderLM):
        cache = model.new_cache(1, 1, device="meta", dtype=dtype)
    else:
        return {}
    sizes = {"self-attention": sum(t.nbytes for t in cache.k + cache.v)}
    if cache.cross_k is not None:
        sizes["cross-attention"] = sum(t.nbytes for t in cache.cross_k + cache.cross_v)
    return sizes


def report(name: str) -> str:
    """The parameter table and KV-cache bytes per token of the named config, as text."""
    model = build(name)
    total = count_parameters(model)
    lines = [f"{name} ({type(model).__name__}): {total:,} parameters", "| component | parameters | share |",
             "|---|---|---|"]
    lines += [f"| {c} | {n:,} | {n / total:.2%} |" for c, n in parameters_by_component(model).items() if n]
    lines.append(f"| total | {total:,} | 100.00% |")
    kv32, kv16 = kv_cache_bytes_per_token(model), kv_cache_bytes_per_token(model, torch.bfloat16)
    if not kv32:
        lines.append("KV cache: none (encoder-only)")
    per = {"self-attention": "target token" if "cross-attention" in kv32 else "token",
           "cross-attention": "source token"}
    for kind, n in kv32.items():
        lines.append(f"KV cache, {kind}: {n:,} bytes per {per[kind]} in float32, {kv16[kind]:,} in float16/bfloat16"
                     f" ({n * 1024 / 2**20:.1f} MiB per 1024 tokens in float32)")
    return "\n".join(lines)
