"""Encoder-only, decoder-only and encoder-decoder Transformer models with their configs and generation."""
from .configs import (CONFIGS, DecoderConfig, EncoderConfig, Seq2SeqConfig, bert_base, count_parameters, gpt2_small,
                      transformer_base, transformer_big)
from .decoder import DecoderLM
from .encoder import EncoderModel
from .generation import beam_search, decode, next_token
from .seq2seq import Seq2SeqTransformer
from .count import kv_cache_bytes_per_token, parameters_by_component  # noqa: E402  (needs the three models)

__all__ = ["DecoderConfig", "EncoderConfig", "Seq2SeqConfig", "transformer_base", "transformer_big", "gpt2_small",
           "bert_base", "CONFIGS", "count_parameters", "DecoderLM", "EncoderModel", "Seq2SeqTransformer",
           "next_token", "decode", "beam_search", "parameters_by_component", "kv_cache_bytes_per_token"]
