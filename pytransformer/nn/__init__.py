"""Modules built on pytransformer.ops."""
from .norm import LayerNorm, RMSNorm

__all__ = ["LayerNorm", "RMSNorm"]
