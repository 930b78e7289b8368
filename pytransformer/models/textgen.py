"""Text generation from a save_pretrained directory (`python -m pytransformer generate`): the prompt is tokenized with
the directory's tokenizer.json (the optional `tokenizers` package), the model loaded by DecoderLM.from_pretrained, the
text written as the tokens arrive, and the prefill and decode throughput reported at the end."""
import sys
import time
from pathlib import Path

import torch

from .checkpoint import read_json
from .decoder import DecoderLM


def load_tokenizer(model_dir):
    """The tokenizers.Tokenizer of model_dir/tokenizer.json; ValueError saying what is missing or naming the file
    when it is unreadable."""
    path = Path(model_dir) / "tokenizer.json"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("the tokenizers package is needed to read tokenizer.json (pip install tokenizers)") from None
    if not path.is_file():
        raise ValueError(f"{path}: no tokenizer.json in the model directory (save the tokenizer with it)")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # noqa: BLE001 -- tokenizers raises a bare Exception for a corrupt file
        raise ValueError(f"{path}: not a readable tokenizer.json ({e})") from e


def eos_tokens(model_dir) -> list[int] | None:
    """The end-of-sequence ids of generation_config.json, else config.json (every id of a list ends the text, as in
    transformers), or None; ValueError naming the file and eos_token_id when it is not an id or a list of ids."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        d = read_json(path) if path.is_file() else {}
        eos = d.get("eos_token_id") if isinstance(d, dict) else None
        if eos is None:
            continue
        ids = eos if isinstance(eos, list) else [eos]
        if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
            raise ValueError(f"{path}: eos_token_id: expected a token id or a non-empty list of them, got {eos!r}")
        return ids
    return None


class TextStream:
    """Writes the text of the tokens passed one call at a time, each piece once it decodes to whole characters."""

    def __init__(self, tokenizer, out):
        self.tokenizer, self.out, self.ids, self.text = tokenizer, out, [], ""

    def __call__(self, tokens: torch.Tensor) -> None:
        self.ids.append(int(tokens[0]))
        self._write(end=False)

    def finish(self) -> None:
        """Write what is left (an incomplete character included) and a newline."""
        self._write(end=True)
        self.out.write("\n")

    def _write(self, end: bool) -> None:
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd") and not end:  # maybe an incomplete UTF-8 sequence: wait for the next token
            return
        self.out.write(text[len(self.text):] if text.startswith(self.text) else text)
        self.out.flush()
        self.text = text


def prepare(model_dir, prompt: str, *, int8: bool = False, bf16: bool = False, device="cpu"):
    """(tokenizer, model, prompt ids [1, L]) of a checkpoint directory; ValueError or FileNotFoundError saying what is
    wrong with the directory or the prompt."""
    tokenizer = load_tokenizer(model_dir)
    model = DecoderLM.from_pretrained(model_dir, dtype=torch.bfloat16 if bf16 else torch.float32, quantize=int8,
                                      device=device)
    ids = torch.tensor([tokenizer.encode(prompt).ids], device=device)
    if ids.shape[1] == 0:
        raise ValueError("prompt: it encodes to no tokens")
    return tokenizer, model, ids


def stream(tokenizer, model, ids, prompt: str, *, max_new_tokens: int = 64, temperature: float | None = None,
           top_p: float | None = None, top_k: int | None = None, seed: int | None = None,
           eos_id: int | list[int] | None = None, cache_dtype: torch.dtype | None = None, compile: bool = False,
           out=None, err=None) -> list[int]:
    """Write the prompt and its continuation to `out` (default stdout) as it is generated, then the prefill and
    decode throughput to `err` (default stderr); the new token ids. Greedy unless temperature (> 0), top_p or top_k
    is given (then sampled, temperature 1 by default); cache_dtype and compile as in DecoderLM.generate (the step is
    compiled, or loaded, by a one-token generate first, so that neither rate counts it). Nothing is written when
    generate refuses the arguments (the prompt goes out with the first new token)."""
    out, err = out or sys.stdout, err or sys.stderr
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: expected >= 1, got {max_new_tokens}")
    if compile:
        model.generate(ids[:, :1], 1, cache_dtype=cache_dtype, compile=True)
    do_sample = bool(temperature) or top_p is not None or top_k is not None
    generator = None if seed is None else torch.Generator(ids.device).manual_seed(seed)
    text, times = TextStream(tokenizer, out), []

    def on_token(tokens):
        times.append(time.perf_counter())
        if len(times) == 1:
            out.write(prompt)
        text(tokens)
    start = time.perf_counter()
    new = model.generate(ids, max_new_tokens, do_sample, temperature or 1.0, top_k, top_p, generator, eos_id=eos_id,
                         on_token=on_token, cache_dtype=cache_dtype, compile=compile)[0, ids.shape[1]:]
    text.finish()
    prefill, decode = times[0] - start, times[-1] - times[0]
    err.write(f"prefill: {ids.shape[1]} tokens in {prefill:.3f} s ({ids.shape[1] / prefill:.1f} tokens/s); decode: "
              f"{len(times) - 1} tokens in {decode:.3f} s ({(len(times) - 1) / max(decode, 1e-9):.1f} tokens/s)\n")
    return new.tolist()
