"""DecoderLM: a GPT-like decoder-only language model with KV-cache generation."""
import torch
from torch import Tensor, nn

from ..nn import KVCache, Linear, TransformerDecoder, token_positions
from .common import Embeddings, float_parameter, init_normal, rotary_for
from .configs import DecoderConfig
from .generation import beam_search, check_generate_args, check_key_lengths, decode, next_token
from . import checkpoint
from .compiled_step import compiled_step, decode_step


# Tokens of all rows per forward of a prompt (DecoderLM.prefill). Half llama.cpp's micro-batch: a chunk's MLP
# activations are the largest transient memory of generation (float32, d_ff 2048: 6 MiB at 256 tokens), and 256
# rows keep the matrix products within a few percent of 512's speed.
PREFILL_CHUNK = 256


def last_positions(input_ids: Tensor) -> Tensor:
    """The last position of every row of input_ids [B, L]: [B] (L - 1 each)."""
    return input_ids.new_full((input_ids.shape[0],), input_ids.shape[1] - 1)


class DecoderLM(nn.Module):
    """Token + position embeddings, a causal TransformerDecoder without cross-attention, an LM head (tied by default)."""

    def __init__(self, config: DecoderConfig):
        super().__init__()
        self.config = config
        self.embed = Embeddings(config, scale=config.scale_embeddings)
        rotary, per_layer = rotary_for(config), None
        if config.global_layers:  # the windowed layers' own rotary base
            local = rotary_for(config, config.local_rope_theta) if rotary is not None else None
            per_layer = [{"window": config.layer_window(i), "rotary": rotary if i in config.global_layers else local}
                         for i in range(config.n_layers)]
        self.decoder = TransformerDecoder(config.n_layers, cross_attention=False, rotary=rotary, window=config.window,
                                          per_layer=per_layer, **config.layer_kwargs())
        self.lm_head = Linear(config.d_model, config.vocab_size, bias=False)
        init_normal(self)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.tok.weight

    def hidden(self, input_ids: Tensor, *, cache: KVCache | None = None, key_lengths: Tensor | None = None,
               keep: Tensor | None = None) -> Tensor:
        """input_ids [B, L] -> final hidden states [B, L, d_model] (see forward); with keep [B] (positions) only those
        at position keep[b] of each row, [B, d_model], the last layer's feed-forward run on those rows alone."""
        x = self.embed(input_ids, token_positions(input_ids.shape[1], input_ids.device, cache))
        x = self.decoder(x, key_lengths=key_lengths, cache=cache, keep=keep)
        return x if keep is None else x[:, 0]

    def forward(self, input_ids: Tensor, *, cache: KVCache | None = None, key_lengths: Tensor | None = None) -> Tensor:
        """input_ids [B, L] -> logits [B, L, vocab]. With a cache, input_ids are the next tokens of every row;
        key_lengths [B] marks a right-padded prompt (the cache then counts only the real tokens)."""
        return self.lm_head(self.hidden(input_ids, cache=cache, key_lengths=key_lengths))

    def new_cache(self, batch_size: int, capacity: int, *, device=None, dtype=None) -> KVCache:
        """An empty KVCache for batch_size rows of up to `capacity` tokens, on the model's device and dtype; a layer
        with a sliding window of at most capacity gets `window` rows: a rolling buffer that holds any number of
        tokens (the layers without a window, Gemma 3's global ones, all `capacity` rows)."""
        w = float_parameter(self)
        c = self.config
        rows = [capacity if c.layer_window(i) is None else min(capacity, c.layer_window(i)) for i in range(c.n_layers)]
        return KVCache(c.n_layers, batch_size, c.n_kv_heads or c.n_heads, c.head_dim, rows, device=device or w.device,
                       dtype=dtype or w.dtype)

    def prefill(self, input_ids: Tensor, cache: KVCache, key_lengths: Tensor | None = None, *,
                last: bool = False) -> Tensor:
        """Run a prompt [B, L] (right-padded to key_lengths [B]) into the cache -> hidden states [B, L, d_model], or
        with last=True only those of each row's last prompt token [B, d_model] (what generation needs: the last
        layer's feed-forward runs on those rows alone). In chunks of PREFILL_CHUNK // B tokens of every row: the
        activations of one chunk at a time, so that the transient memory of a long prompt or a large batch is that of
        a chunk, at the speed of one forward (matrix products of hundreds of rows run at the rate of thousands)."""
        chunk = max(1, PREFILL_CHUNK // input_ids.shape[0])
        ends = last_positions(input_ids) if key_lengths is None else key_lengths - 1  # [B]
        hidden, kept = [], None
        for start in range(0, input_ids.shape[1], chunk):
            part = input_ids[:, start:start + chunk]
            lens = None if key_lengths is None else (key_lengths - start).clamp(0, part.shape[1])
            keep = (ends - start).clamp(0, part.shape[1] - 1) if last else None
            h = self.hidden(part, cache=cache, key_lengths=lens, keep=keep)  # last: [B, d_model]
            if last:  # a row whose last token is in this chunk or later takes this chunk's (later ones overwrite)
                kept = h if kept is None else torch.where((ends >= start)[:, None], h, kept)
            else:
                hidden.append(h)
        return kept if last else torch.cat(hidden, 1)

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, do_sample: bool = False, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None, *,
                 key_lengths: Tensor | None = None, eos_id: int | list[int] | None = None, beam_size: int = 1,
                 length_penalty: float = 1.0, use_cache: bool = True, on_token=None, compile: bool = False,
                 cache_dtype: torch.dtype | None = None) -> Tensor:
        """Prompt [B, L] (right-padded to key_lengths [B] if given) -> prompt + new tokens [B, L + n]: greedy,
        sampled, or beam search when beam_size > 1; n < max_new_tokens when every row emitted an eos_id (an int, or a
        list of ids any of which ends a row). on_token(tokens [B]) is called as each step's tokens are chosen
        (streaming; not with beam search). ValueError naming the argument for key_lengths that are not [B] lengths in
        [1, L], or for more tokens than learned positions (max_len). compile=True runs each decoding step as one
        library compiled ahead of time by AOTInductor in a child process (models/compiled_step.py): the first call
        for a model structure and batch size compiles it (tens of seconds) into $PYTRANSFORMER_CACHE (default
        ~/.cache/pytransformer); later calls, and later processes, load it for any prompt length and max_new_tokens.
        On CUDA it captures the step in a CUDA graph instead, replayed for every token.
        cache_dtype: the KV cache's float dtype (default the model's); attention then runs in it (KVCache): a 16-bit
        cache holds a float32 or int8 model's keys and values in half the memory."""
        check_generate_args(max_new_tokens, beam_size, do_sample, temperature, top_k, top_p, cache_dtype=cache_dtype,
                            use_cache=use_cache)
        if on_token is not None and beam_size > 1:
            raise ValueError("on_token: beam search settles its tokens only at the end")
        n_rows, length = input_ids.shape[0] * beam_size, input_ids.shape[1]
        if key_lengths is not None:
            check_key_lengths(key_lengths, input_ids.shape[0], length)
        if self.config.positional == "learned" and length + max_new_tokens > self.config.max_len:
            raise ValueError(f"max_new_tokens: {length} prompt tokens + {max_new_tokens} new ones exceed the model's "
                             f"{self.config.max_len} learned positions (max_len)")
        ids = input_ids.repeat_interleave(beam_size, 0)  # [N, L]
        lens = None if key_lengths is None else key_lengths.to(ids.device).repeat_interleave(beam_size, 0)
        if compile and not use_cache:
            raise ValueError("compile: compiles the cached decoding step, so it needs use_cache=True")
        if use_cache:
            cache = self.new_cache(n_rows, length + max_new_tokens, dtype=cache_dtype)
            last = self.prefill(ids, cache, lens, last=True)  # [N, d]

            step = compiled_step(self, cache) if compile else lambda tok: decode_step(self, tok, cache)
            reorder = cache.reorder
        else:
            if key_lengths is not None:
                raise ValueError("key_lengths: padded prompts need use_cache=True")
            last = self.hidden(ids, keep=last_positions(ids))

            def step(tok):
                nonlocal ids
                ids = torch.cat([ids, tok], 1)
                return self.lm_head(self.hidden(ids, keep=last_positions(ids)))

            def reorder(index):
                nonlocal ids
                ids = ids[index]
        logits = self.lm_head(last)  # [N, vocab]
        if beam_size > 1:
            new = beam_search(step, reorder, logits, beam_size, max_new_tokens, eos_id, length_penalty)
        else:
            new = decode(step, logits, max_new_tokens, lambda x: next_token(x, do_sample, temperature, top_k, top_p,
                                                                            generator), eos_id, on_token)
        return torch.cat([input_ids, new], 1)

    @classmethod
    def from_hf(cls, model) -> "DecoderLM":
        """A DecoderLM with the config and weights of a Hugging Face GPT2LMHeadModel, LlamaForCausalLM,
        MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Phi3ForCausalLM or Gemma3ForCausalLM object (on its
        device, in its dtype and train/eval mode). See models/hf.py for what is supported; anything else raises
        ValueError naming the config field."""
        return checkpoint.from_hf(cls, DecoderConfig, model)

    @classmethod
    def from_pretrained(cls, path, dtype: torch.dtype = torch.float32, quantize: bool = False, *,
                        device=None, mmap: bool = True) -> "DecoderLM":
        """A DecoderLM (eval mode) from a local directory written by a Hugging Face model's save_pretrained (config.json
        with model_type gpt2, llama, mistral, qwen2, qwen3, phi3 or gemma3_text; model.safetensors or a sharded
        model.safetensors.index.json), in `dtype` on `device` (default CPU), without importing transformers.
        quantize=True returns the weight-only int8 model (pytransformer.quantize), each weight quantized as it is read,
        so the float weights are never all in memory. A broken directory raises ValueError (FileNotFoundError for a
        missing path) naming the file and the field or tensor, checked from config.json and the safetensors headers
        before anything is allocated; integer weights and a tied config whose file holds a different lm_head.weight are
        refused. On the CPU, weights stored in `dtype` and used as stored (not transposed or quantized; fused ones where
        their parts follow each other in the file) stay in a private mapping of the file unless mmap=False
        (models/checkpoint.py)."""
        return checkpoint.from_pretrained(cls, DecoderConfig, path, dtype=dtype, device=device, quantize=quantize,
                                          mmap=mmap)
