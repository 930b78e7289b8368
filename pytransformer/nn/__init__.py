"""Modules built on pytransformer.ops."""
from .attention import MultiHeadAttention
from .feedforward import FeedForward
from .kv_cache import AttentionCache, KVCache, LayerCache
from .linear import Linear
from .layers import (Residual, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder,
                     TransformerEncoderLayer)
from .norm import LayerNorm, RMSNorm
from .quantized import QuantizedEmbedding, QuantizedLinear
from .positional import LearnedPositionalEmbedding, RotaryEmbedding, SinusoidalPositionalEncoding, token_positions

__all__ = ["LayerNorm", "RMSNorm", "MultiHeadAttention", "FeedForward", "SinusoidalPositionalEncoding",
           "LearnedPositionalEmbedding", "RotaryEmbedding", "token_positions", "Residual", "TransformerEncoderLayer",
           "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder", "KVCache", "AttentionCache",
           "LayerCache", "Linear", "QuantizedLinear", "QuantizedEmbedding"]
