"""Seq2SeqTransformer: the encoder-decoder of Vaswani et al. 2017 with cached, greedy or beam-search decoding."""

import torch
from torch import Tensor, nn

from ..nn import KVCache, Linear, TransformerDecoder, TransformerEncoder, token_positions
from . import checkpoint
from .common import Embeddings, float_parameter, rotary_for
from .configs import Seq2SeqConfig
from .generation import beam_search, check_generate_args, check_key_lengths, decode, next_token, suppressor


class Seq2SeqTransformer(nn.Module):
    """Source/target embeddings scaled by sqrt(d_model) (one shared table with the output projection when
    tie_embeddings), a TransformerEncoder, a TransformerDecoder with cross-attention, an output projection."""

    def __init__(self, config: Seq2SeqConfig):
        super().__init__()
        self.config = config
        rotary = rotary_for(config)
        self.src_embed = Embeddings(config, scale=True)
        self.tgt_embed = self.src_embed if config.tie_embeddings else Embeddings(config, scale=True)
        self.encoder = TransformerEncoder(config.n_encoder_layers, rotary=rotary, **config.layer_kwargs())
        self.decoder = TransformerDecoder(config.n_decoder_layers, rotary=rotary, **config.layer_kwargs())
        self.lm_head = Linear(config.d_model, config.vocab_size, bias=False)
        for m in self.modules():  # Transformer (fairseq) initialisation
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, config.d_model ** -0.5)
        if config.tie_embeddings:
            self.lm_head.weight = self.src_embed.tok.weight

    def encode(self, src: Tensor, src_key_lengths: Tensor | None = None) -> Tensor:
        """src [B, Ls] -> memory [B, Ls, d_model]."""
        x = self.src_embed(src, torch.arange(src.shape[1], device=src.device))
        return self.encoder(x, key_lengths=src_key_lengths)

    def decode(self, tgt: Tensor, memory: Tensor | None = None, *, src_key_lengths: Tensor | None = None,
               tgt_key_lengths: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """tgt [B, Lt] -> logits [B, Lt, vocab], causal; with a cache, tgt are the next tokens and memory may be None."""
        x = self.tgt_embed(tgt, token_positions(tgt.shape[1], tgt.device, cache))
        x = self.decoder(x, memory, key_lengths=tgt_key_lengths, memory_key_lengths=src_key_lengths, cache=cache)
        return self.lm_head(x)

    def forward(self, src: Tensor, tgt: Tensor, *, src_key_lengths: Tensor | None = None,
                tgt_key_lengths: Tensor | None = None) -> Tensor:
        """src [B, Ls], tgt [B, Lt] (teacher forcing) -> logits [B, Lt, vocab]."""
        memory = self.encode(src, src_key_lengths)
        return self.decode(tgt, memory, src_key_lengths=src_key_lengths, tgt_key_lengths=tgt_key_lengths)

    def new_cache(self, batch_size: int, capacity: int, memory_length: int, *, device=None, dtype=None) -> KVCache:
        """An empty KVCache: self-attention for `capacity` target tokens, cross-attention for memory_length keys."""
        c, w = self.config, float_parameter(self)
        return KVCache(c.n_decoder_layers, batch_size, c.n_kv_heads or c.n_heads, c.head_dim, capacity,
                       memory_length=memory_length, device=device or w.device, dtype=dtype or w.dtype)

    @torch.no_grad()
    def generate(self, src: Tensor, src_key_lengths: Tensor | None = None, *, max_new_tokens: int, bos_id: int,
                 eos_id: int, beam_size: int = 1, length_penalty: float = 1.0, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                 generator: torch.Generator | None = None, use_cache: bool = True,
                 cache_dtype: torch.dtype | None = None, suppress_ids: list[int] | None = None) -> Tensor:
        """src [B, Ls] -> target tokens [B, 1 + n] starting with bos_id: the encoder runs once, cross-attention K/V
        are cached once, self-attention goes through the KV cache; rows that emitted eos_id continue with eos_id.
        ValueError naming src_key_lengths unless it is an integer tensor [B] of lengths in [1, Ls]. cache_dtype: the
        KV cache's float dtype (default the model's), as in DecoderLM.generate. suppress_ids: token ids never
        generated, such as a Marian model's pad id, which is also its bos_id: as transformers' suppress_tokens and
        bad_words_ids, their logits are -inf before sampling's softmax, and their log-probabilities -inf in beam
        search (whose scores stay those of the model's distribution, not renormalised)."""
        check_generate_args(max_new_tokens, beam_size, do_sample, temperature, top_k, top_p, cache_dtype=cache_dtype,
                            use_cache=use_cache)
        suppress = suppressor(suppress_ids, self.config.vocab_size, src.device)
        if self.config.positional != "rotary" and max_new_tokens + 1 > self.config.max_len:
            raise ValueError(f"max_new_tokens: bos_id + {max_new_tokens} new tokens exceed the model's "
                             f"{self.config.max_len} target positions (max_len)")
        if src_key_lengths is not None:
            check_key_lengths(src_key_lengths, src.shape[0], src.shape[1], "src_key_lengths")
        n_rows = src.shape[0] * beam_size
        memory = self.encode(src, src_key_lengths).repeat_interleave(beam_size, 0)  # [N, Ls, d]
        lens = None if src_key_lengths is None else src_key_lengths.to(src.device).repeat_interleave(beam_size, 0)
        tgt = torch.full((n_rows, 1), bos_id, dtype=torch.long, device=src.device)
        if use_cache:
            cache = self.new_cache(n_rows, max_new_tokens + 1, memory.shape[1], dtype=cache_dtype)
            self.decoder.cache_memory(cache, memory, lens)

            def step(tok):
                return self.decode(tok, cache=cache)[:, -1]
            reorder = cache.reorder
        else:
            def step(tok):
                nonlocal tgt
                tgt = torch.cat([tgt, tok], 1)
                return self.decode(tgt, memory, src_key_lengths=lens)[:, -1]

            def reorder(index):
                nonlocal tgt
                tgt = tgt[index]
        logits = step(tgt) if use_cache else self.decode(tgt, memory, src_key_lengths=lens)[:, -1]
        if beam_size > 1:
            new = beam_search(step, reorder, logits, beam_size, max_new_tokens, eos_id, length_penalty, suppress)
        else:
            new = decode(step, logits, max_new_tokens, lambda x: next_token(suppress(x), do_sample, temperature, top_k,
                                                                            top_p, generator), eos_id)
        bos = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
        return torch.cat([bos, new], 1)

    @classmethod
    def from_hf(cls, model) -> "Seq2SeqTransformer":
        """A Seq2SeqTransformer with the config and weights of a Hugging Face MarianMTModel object (on its device, in
        its dtype and train/eval mode). See models/hf.py for what is supported; anything else raises ValueError
        naming the config field. Generate as transformers does with bos_id=config.decoder_start_token_id,
        eos_id=config.eos_token_id and suppress_ids=[config.pad_token_id]."""
        return checkpoint.from_hf(cls, Seq2SeqConfig, model)

    @classmethod
    def from_pretrained(cls, path, dtype: torch.dtype = torch.float32, quantize: bool = False, *, device=None,
                        mmap: bool = True) -> "Seq2SeqTransformer":
        """A Seq2SeqTransformer (eval mode) from a local save_pretrained directory of a Marian translation model
        (config.json with model_type marian; safetensors weights), in `dtype` on `device` (default CPU), without
        importing transformers; quantize, mmap and errors as DecoderLM.from_pretrained's."""
        return checkpoint.from_pretrained(cls, Seq2SeqConfig, path, dtype=dtype, device=device, quantize=quantize,
                                          mmap=mmap)
