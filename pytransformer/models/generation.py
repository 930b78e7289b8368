"""Decoding loops shared by DecoderLM and Seq2SeqTransformer: greedy, sampling and beam search.

Each loop drives a `step(tokens [N, 1]) -> logits [N, V]` callable (a cached or uncached forward of the next token)
starting from the logits of the prompt's last position."""
import math

import torch
from torch import Tensor


def check_generate_args(max_new_tokens, beam_size: int, do_sample: bool, temperature: float, top_k, top_p, *,
                        cache_dtype: torch.dtype | None = None, use_cache: bool = True) -> None:
    """ValueError naming the argument for settings generate() cannot honour; top_k=0 and top_p=1 mean no filter."""
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)
    if not is_int(max_new_tokens) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens: expected an int >= 0, got {max_new_tokens!r}")
    if not is_int(beam_size) or beam_size < 1:
        raise ValueError(f"beam_size: expected an int >= 1, got {beam_size!r}")
    if top_k is not None and (not is_int(top_k) or top_k < 0):
        raise ValueError(f"top_k: expected None or an int >= 0 (0: no top-k filter), got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p: expected None or a value in (0, 1], got {top_p!r}")
    if do_sample and not (temperature > 0 and math.isfinite(temperature)):
        raise ValueError(f"temperature: expected a finite value > 0 when sampling, got {temperature!r}")
    if cache_dtype is not None and not (use_cache and isinstance(cache_dtype, torch.dtype) and
                                        cache_dtype.is_floating_point):
        raise ValueError(f"cache_dtype: expected None or a float dtype of the KV cache, with use_cache=True; got "
                         f"{cache_dtype!r} with use_cache={use_cache}")


def eos_ids(eos_id, device) -> Tensor | None:
    """The end-of-sequence ids [E] of an int or a non-empty list of ints (None: none; an id no token has, such as -1,
    ends no row); ValueError naming eos_id."""
    if eos_id is None:
        return None
    ids = [eos_id] if not isinstance(eos_id, (list, tuple)) else list(eos_id)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"eos_id: expected None, an int or a non-empty list of ints, got {eos_id!r}")
    return torch.tensor(ids, device=device)


def suppressor(ids, vocab: int, device):
    """A function logits [N, V] -> logits with the columns of `ids` (token ids never to generate, as Hugging Face's
    suppress_tokens) at -inf; the identity for None. ValueError naming suppress_ids unless ids is a list of ints in
    [0, vocab)."""
    if ids is None:
        return lambda logits: logits
    if not (isinstance(ids, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab
                                                   for i in ids)):
        raise ValueError(f"suppress_ids: expected None or a list of token ids in [0, {vocab}), got {ids!r:.80}")
    index = torch.tensor(ids, dtype=torch.long, device=device)
    return lambda logits: logits.index_fill(-1, index, float("-inf"))


def check_key_lengths(key_lengths, rows: int, length: int, name: str = "key_lengths") -> None:
    """ValueError naming the argument (`name`) unless it is an integer tensor [rows] of prompt lengths in
    [1, length]."""
    if not (torch.is_tensor(key_lengths) and not key_lengths.is_floating_point() and key_lengths.dtype != torch.bool
            and tuple(key_lengths.shape) == (rows,)):
        raise ValueError(f"{name}: expected an integer tensor of shape [{rows}] (one length per prompt row), got "
                         f"{key_lengths!r:.80}")
    if rows and not (int(key_lengths.min()) >= 1 and int(key_lengths.max()) <= length):
        raise ValueError(f"{name}: expected each in [1, {length}] (the prompt's length), got "
                         f"{key_lengths.tolist()}")


def next_token(logits: Tensor, do_sample: bool = False, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """logits [N, V] -> tokens [N]: the argmax, or a sample after temperature, top-k and top-p (nucleus) filtering."""
    if not do_sample:
        return logits.max(-1).indices  # argmax's index (the first maximum), 5x faster than argmax on bfloat16
    logits = logits.float() / temperature
    if top_k:
        kth = logits.topk(min(top_k, logits.shape[-1]), -1).values[:, -1:]  # [N, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_logits, order = logits.sort(-1, descending=True)
        probs = sorted_logits.softmax(-1)
        drop = probs.cumsum(-1) - probs > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


def decode(step, logits: Tensor, max_new_tokens: int, pick, eos_id: int | list[int] | None = None,
           on_token=None) -> Tensor:
    """Greedy or sampled decoding: tokens [N, n <= max_new_tokens]; a row that emitted an eos_id (an int or a list:
    any of them) keeps emitting the first, and decoding stops early once every row has. on_token(tokens [N]) is
    called with each step's tokens (streaming)."""
    eos = eos_ids(eos_id, logits.device)  # [E]
    finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device)
    # One tensor holds the tokens, written as they come: a small tensor kept per step among each step's freed logits
    # made glibc's heap grow step by step while the bytes in use stayed flat (docs/benchmarks.md).
    tokens = torch.empty(logits.shape[0], max_new_tokens, dtype=torch.long, device=logits.device)
    n = 0
    while n < max_new_tokens:
        tok = pick(logits)  # [N]
        if eos is not None:
            tok = tok.masked_fill(finished, eos[0])
            finished = finished | torch.isin(tok, eos)
        tokens[:, n] = tok
        n += 1
        if on_token is not None:
            on_token(tok)
        if n == max_new_tokens or (eos is not None and bool(finished.all())):
            break
        logits = step(tok[:, None])
    return tokens[:, :n]


def beam_search(step, reorder, logits: Tensor, beam_size: int, max_new_tokens: int,
                eos_id: int | list[int] | None = None, length_penalty: float = 1.0, suppress=None) -> Tensor:
    """Beam search over N = B * beam_size rows (beams of one input adjacent, all starting from the same state):
    tokens [B, n] of each input's best beam by log-probability / length ** length_penalty, where length counts the
    tokens up to and including EOS (any of eos_id's; a finished beam continues with the first). `reorder(index [N])`
    makes row i continue from row index[i]. suppress (suppressor): applied to each step's log-probabilities."""
    n_rows, vocab = logits.shape
    batch, k = n_rows // beam_size, beam_size
    device = logits.device
    scores = torch.full((batch, k), float("-inf"), device=device)
    scores[:, 0] = 0.0  # the beams start identical: expand only the first
    finished = torch.zeros(batch, k, dtype=torch.bool, device=device)
    lengths = torch.zeros(batch, k, dtype=torch.long, device=device)
    seqs = torch.zeros(batch, k, 0, dtype=torch.long, device=device)
    eos = eos_ids(eos_id, device)  # [E]
    eos_only = torch.full((vocab,), float("-inf"), device=device)  # a finished beam extends with EOS at no cost
    if eos is not None:
        eos_only[eos[0]] = 0.0
    rows = torch.arange(batch, device=device)[:, None] * k  # [B, 1]
    for i in range(max_new_tokens):
        logp = torch.log_softmax(logits.float(), -1)
        logp = (logp if suppress is None else suppress(logp)).view(batch, k, vocab)
        if eos is not None:  # only an EOS finishes a beam
            logp = torch.where(finished[..., None], eos_only, logp)
        scores, flat = (scores[..., None] + logp).view(batch, k * vocab).topk(k, -1)  # [B, K]
        beam, tok = flat // vocab, flat % vocab
        seqs = torch.cat([seqs.gather(1, beam[..., None].expand(-1, -1, i)), tok[..., None]], -1)
        was_finished = finished.gather(1, beam)
        lengths = lengths.gather(1, beam) + (~was_finished).long()
        finished = was_finished | torch.isin(tok, eos) if eos is not None else was_finished
        if i + 1 == max_new_tokens or bool(finished.all()):
            break
        reorder((rows + beam).view(-1))
        logits = step(tok.view(-1, 1))
    best = (scores / lengths.clamp(min=1).float() ** length_penalty).argmax(-1)  # [B]
    return seqs[torch.arange(batch, device=device), best]
