"""Generation throughput (greedy tokens/s) of DecoderLM (and of Seq2SeqTransformer translating) against Hugging Face
`generate` and, when their packages are installed, CTranslate2's Generator or Translator (`ctranslate2`) and llama.cpp
(`llama_cpp`, llama-cpp-python; the Llama, Qwen3 and Gemma 3 models), on the same weights, prompts and thread count,
timed in turns.

The model is a random Hugging Face model, float32, saved with save_pretrained to a temporary folder, with a word-level
vocabulary "t0", "t1", ... (so CTranslate2's token strings map one to one to ids). Each engine loads it from there:
ours with DecoderLM.from_pretrained, Hugging Face with from_pretrained, CTranslate2 and llama.cpp from their own
converters' output (llama.cpp: GGUF, see bench/llamacpp.py). For bfloat16 and float16 the same weights are saved again
in that dtype, and every engine loads that folder, so that each can keep the weights as stored (mapped, where it
maps).
`--engines` times a subset (ours always runs: every ratio is to it).

- `--model gpt2`: GPT-2 small shape (124M parameters, tied head); `--uncached-new-tokens N` adds ours without the
  KV cache (float32).
- `--model llama`: a Llama shape (124M parameters, GQA 4:1, SwiGLU, untied head).
- `--model llama-1b`: TinyLlama-1.1B's shape (1.1B parameters, GQA 8:1, SwiGLU, untied head), a size llama.cpp's
  users run, where the weights' read outweighs every fixed cost.
- `--model qwen3-0.6b`: Qwen3-0.6B's shape (596M parameters, a quarter of them the tied vocabulary of 151936; 28
  layers of 16 query heads of 128 sharing 8 KV heads, wider than d_model 1024; q/k norms), a model llama.cpp's users
  run.
- `--model gemma3-270m`: Gemma 3 270M's shape (268M parameters, 168M of them the tied vocabulary of 262144; 18 layers
  of 4 query heads of 256 sharing one KV head, five of every six with a window of 512).
- `--model marian`: translation with the shape of Helsinki-NLP's opus-mt-en-de (a Marian encoder-decoder, 6+6
  layers, d_model 512, 74M parameters): the prompt is the source sentence, the new tokens its translation, decoded
  from the pad id (never generated, as the opus-mt models' bad_words_ids say) and exactly that many (no EOS before:
  Hugging Face's min_new_tokens, CTranslate2's min_decoding_length, our suppress_ids); ours is
  Seq2SeqTransformer.from_pretrained, eager (generate(compile=True) is DecoderLM's), CTranslate2 its Translator.

In each of `--dtypes`: float32; bfloat16 (weights and activations; CTranslate2's compute type bfloat16 where its CPU
build has it); float16 (weights and activations; not CTranslate2, which has no float16 compute on the CPU); int8
(ours: weight-only int8, and "ours, x 8 bits" with x quantized per row to 8 bits too, x_bits=8; Hugging Face: torch's
dynamic int8 quantization of its nn.Linear layers; CTranslate2: int8_float32). llama.cpp runs GGUF f32 for float32,
bf16 and f16 for bfloat16, f16 for float16, and q8_0 for int8. Each engine and dtype runs in a process of its own
(engines sharing a process slow each other: a loaded CTranslate2 slowed PyTorch's generation by about 15%), which also
gives its resident memory after the load and at its peak. The engines
of a dtype are loaded together and take turns, one timed call each, round after round (measure), so that the host's
speed, which can drift by a third within minutes on a shared machine, is the same for all of them. The record also
says whether our float32 greedy tokens equal Hugging Face's and llama.cpp's (f32).

Besides tokens/s over the whole generate call, each engine gets the same split into prefill and decode (see
split_times): generate(ids, 1) is timed as the prefill, and the rest of generate(ids, n) as n - 1 decode steps.
"""
import argparse
import copy
import datetime
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

from ..models import DecoderLM, Seq2SeqTransformer, count_parameters
from ..nn.quantized import quantize
from . import command_line, device_name, llamacpp, proc_status, sync

# Our KV cache's dtype where it is not the model's: int8 models keep a 16-bit cache, as llama.cpp runs q8_0 and bf16
# (its default float16 cache); its f32 runs keep a float32 cache, as ours (llamacpp.load).
CACHE_DTYPES = {"int8": torch.bfloat16}
# 12 layers, d_model 768, 12 query heads sharing 3 KV heads, SwiGLU 2048, vocabulary 32000: 124M parameters
LLAMA_SHAPE = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                   num_attention_heads=12, num_key_value_heads=3, tie_word_embeddings=False)
# The decoder shapes of --model besides gpt2, each with its transformers model class: "llama" (GPT-2 small's size),
# "llama-1b", TinyLlama-1.1B's shape (22 layers, d_model 2048, 32 query heads sharing 4 KV heads, SwiGLU 5632,
# vocabulary 32000: 1.1B parameters), "qwen3-0.6b", Qwen3-0.6B's (28 layers, d_model 1024, 16 query heads of 128
# sharing 8 KV heads, q/k norms, SwiGLU 3072, a tied vocabulary of 151936: 596M parameters), and "gemma3-270m", Gemma 3
# 270M's (18 layers, d_model 640, 4 query heads of 256 sharing one KV head, every sixth layer full attention and the
# others a window of 512, GeGLU 2048, a tied vocabulary of 262144: 268M parameters, 168M of them the embedding), sizes
# that llama.cpp's users run.
GEMMA3_LAYERS = (["sliding_attention"] * 5 + ["full_attention"]) * 3
DECODER_SHAPES = {
    "llama": ("LlamaForCausalLM", LLAMA_SHAPE),
    "llama-1b": ("LlamaForCausalLM", dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632,
                                          num_hidden_layers=22, num_attention_heads=32, num_key_value_heads=4,
                                          tie_word_embeddings=False)),
    "qwen3-0.6b": ("Qwen3ForCausalLM", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                            num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                            head_dim=128, tie_word_embeddings=True, max_position_embeddings=40960)),
    "gemma3-270m": ("Gemma3ForCausalLM", dict(vocab_size=262144, hidden_size=640, intermediate_size=2048,
                                              num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1,
                                              head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
                                              layer_types=GEMMA3_LAYERS, max_position_embeddings=32768,
                                              tie_word_embeddings=True, pad_token_id=0))}
# Helsinki-NLP/opus-mt-en-de's shape: 6+6 layers, d_model 512, 8 heads, FFN 2048 (SiLU), a vocabulary of 58101 whose
# last id is the pad id the decoder starts from: 74M parameters.
MARIAN_SHAPE = dict(vocab_size=58101, d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
                    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048, max_position_embeddings=512,
                    activation_function="swish", scale_embedding=True, pad_token_id=58100,
                    decoder_start_token_id=58100, eos_token_id=0, forced_eos_token_id=0)
CT2_TYPES = {"float32": "float32", "bfloat16": "bfloat16", "int8": "int8_float32"}


def timed(fn, device) -> float:
    """Wall time of one fn() call in seconds."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def hf_model(name: str, device, **config):
    """A random Hugging Face GPT2LMHeadModel ("gpt2"), MarianMTModel ("marian") or the model class of a name of
    DECODER_SHAPES (float32, eval); `config` overrides the shape's settings (e.g. num_hidden_layers)."""
    import transformers
    torch.manual_seed(0)
    if name == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(pad_token_id=0, **config))
    elif name == "marian":
        model = transformers.MarianMTModel(transformers.MarianConfig(**{**MARIAN_SHAPE, **config}))
    else:
        model_class, shape = DECODER_SHAPES[name]
        model_class = getattr(transformers, model_class)
        model = model_class(model_class.config_class(**{**shape, **config}))
    return model.to(device).eval()


def hf_generate(hf, beams: int = 1):
    """generate(ids, n) of a Hugging Face model: greedy, exactly n new tokens (a Marian model: the translation of
    source ids, starting with the pad id, which it never generates; beam search with `beams` > 1)."""
    if hf.config.is_encoder_decoder:
        return lambda ids, n: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                                          min_new_tokens=n, do_sample=False, num_beams=beams,
                                          bad_words_ids=[[hf.config.pad_token_id]], forced_eos_token_id=None)
    return lambda ids, n: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, pad_token_id=0)


def our_generate(model, engine: str, dtype: str, config: dict, beams: int = 1):
    """generate(ids, n) of our model as `engine` runs it ("ours", "ours, compiled", "ours, no cache", "ours, x 8
    bits"): greedy, exactly n new tokens; a Seq2SeqTransformer (Marian) translates as hf_generate does, with the pad
    and EOS ids of its Hugging Face `config` dict."""
    cache = {"use_cache": engine != "ours, no cache", "cache_dtype": CACHE_DTYPES.get(dtype)}
    if isinstance(model, Seq2SeqTransformer):
        pad, eos = config["pad_token_id"], config["eos_token_id"]
        return lambda ids, n: model.generate(ids, max_new_tokens=n, bos_id=pad, eos_id=None, suppress_ids=[pad, eos],
                                             beam_size=beams, **cache)
    if engine == "ours, no cache":
        return lambda ids, n: model.generate(ids, n, use_cache=False)
    return lambda ids, n: model.generate(ids, n, compile=engine == "ours, compiled", **cache)


def save_folder(hf, folder: Path) -> None:
    """hf.save_pretrained(folder) plus a word-level tokenizer of tokens "t<id>" split at whitespace (what
    CTranslate2's converter reads for the vocabulary); the model's bos/eos ids name its special tokens."""
    import tokenizers
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers
    hf.save_pretrained(folder)
    vocab, c = hf.config.vocab_size, hf.config
    ids = {k: getattr(c, f"{k}_token_id", None) for k in ("bos", "eos")}
    special = {k: f"t{vocab - 1 if i is None else i}" for k, i in ids.items()}
    words = {f"t{i}": i for i in range(vocab)}
    if c.is_encoder_decoder:  # Marian's pad token, which CTranslate2's converter drops from the vocabulary by name
        words = {**{w: i for w, i in words.items() if i != c.pad_token_id}, "<pad>": c.pad_token_id}
        special |= {"bos": f"t{ids['eos']}", "pad": "<pad>"}
    tok = Tokenizer(models.WordLevel(words, unk_token=special["eos"]))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    word = {k: tokenizers.AddedToken(v, single_word=True, special=True) for k, v in special.items()}  # not in "t12"
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, **{f"{k}_token": w for k, w in word.items()},
                                         unk_token=word["eos"]).save_pretrained(folder)


def ct2_folder(folder: Path, dtype: str) -> Path:
    """The CTranslate2 conversion of the saved model, with its weights stored for `dtype` (converted once)."""
    import ctranslate2
    out = folder / f"ct2-{dtype}"
    if not out.exists():
        ctranslate2.converters.TransformersConverter(str(folder)).convert(
            str(out), quantization="int8" if dtype == "int8" else dtype)
    return out


def ct2_translate(translator, pad: int, beams: int = 1):
    """generate(ids, n) of a CTranslate2 Translator: greedy (or beam search), exactly n new tokens, never the pad
    token (its Marian vocabulary has none); returns them after the pad id, as Hugging Face's generate does."""
    def generate(ids, n):
        results = translator.translate_batch([[f"t{i}" for i in row] for row in ids.tolist()], beam_size=beams,
                                             max_decoding_length=n, min_decoding_length=n)
        return torch.tensor([[pad] + [int(t[1:]) for t in r.hypotheses[0]] for r in results])
    return generate


def ct2_generate(generator):
    """generate(ids, n) of a CTranslate2 Generator: greedy (top-1 sampling), exactly n new tokens, the prompt
    forwarded at once (include_prompt_in_result=False); returns the new token ids."""
    def generate(ids, n):
        results = generator.generate_batch([[f"t{i}" for i in row] for row in ids.tolist()], max_length=n,
                                           min_length=n, sampling_topk=1, include_prompt_in_result=False)
        return torch.tensor([r.sequences_ids[0] for r in results])
    return generate


def load_engine(engine: str, dtype: str, folder: Path, device, threads: int, max_batch: int, max_len: int,
                beams: int = 1):
    """generate(ids, n) of an engine loaded from the saved folder in `dtype`: "ours" (DecoderLM.from_pretrained;
    int8: quantize=True, and a bfloat16 KV cache: CACHE_DTYPES), "ours, compiled" (the same, generate(compile=True)),
    "ours, x 8 bits" (int8 with x_bits=8), "ours, no cache", "Hugging Face" (from_pretrained;
    int8: torch's dynamic quantization of its nn.Linear layers), "CTranslate2" (its conversion of the folder, on
    the CPU) or "llama.cpp <GGUF type>" (its conversion, with a context for max_batch sequences of max_len tokens);
    a Marian folder's engines translate, with beam search when `beams` > 1."""
    if engine.startswith("llama.cpp"):
        return llamacpp.load(folder, engine.split()[1], threads, max_batch, max_len)
    torch_dtype = torch.float32 if dtype == "int8" else getattr(torch, dtype)
    config = json.loads((folder / "config.json").read_text())
    seq2seq = config["model_type"] == "marian"
    if engine.startswith("ours"):
        model = (Seq2SeqTransformer if seq2seq else DecoderLM).from_pretrained(folder, torch_dtype,
                                                                             quantize=dtype == "int8", device=device)
        if engine == "ours, x 8 bits":
            quantize(model, x_bits=8)
        return our_generate(model, engine, dtype, config, beams)
    if engine == "Hugging Face":
        import transformers
        auto = transformers.AutoModelForSeq2SeqLM if seq2seq else transformers.AutoModelForCausalLM
        model = auto.from_pretrained(folder, dtype=torch_dtype).to(device).eval()
        if dtype == "int8":
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        return hf_generate(model, beams)
    if engine != "CTranslate2":
        raise ValueError(f"engine: no engine is named {engine!r}")
    import ctranslate2
    kind = ctranslate2.Translator if seq2seq else ctranslate2.Generator
    loaded = kind(str(ct2_folder(folder, dtype)), device="cpu", compute_type=CT2_TYPES[dtype], intra_threads=threads)
    return ct2_translate(loaded, config["pad_token_id"], beams) if seq2seq else ct2_generate(loaded)


def prompts(batch: int, prompt_len: int, vocab: int, device) -> torch.Tensor:
    """The prompt ids [batch, prompt_len] of a batch size: the same for every engine and for the token check."""
    torch.manual_seed(batch)
    return torch.randint(0, vocab, (batch, prompt_len), device=device)


def split_times(batch: int, new_tokens: int, t_all: float, t_first: float) -> dict:
    """The one rule that splits generation time, for every engine: from the times of generate(ids, new_tokens)
    (t_all) and generate(ids, 1) (t_first, the prompt's forward and the first token: the prefill), tokens/s over the
    whole call, decode tokens/s (the other new_tokens - 1 steps of each row over t_all - t_first; nan when noise
    makes that difference not positive) and the prefill time in seconds."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens: the split needs at least 2 new tokens, got {new_tokens}")
    decode = t_all - t_first
    return {"total": batch * new_tokens / t_all, "decode": batch * (new_tokens - 1) / decode if decode > 0 else
            float("nan"), "prefill": t_first}


REPLY = "@bench-generate "  # marks the worker's replies on its stdout (engines may print there too)
# Seconds between two engines' calls: an engine's threads spin for a while after its call (OpenMP's and ggml's
# thread pools wait for the next piece of work so), and would take cores from the next engine's call.
PAUSE_S = 0.2


def pause() -> None:
    time.sleep(PAUSE_S)


def worker(spec: str) -> None:
    """The process of one engine and dtype (see Engine): load it and reply "loaded", then for each request on stdin,
    a JSON {"batch": b, "n": n, "sample": s}, time one generate(ids, n) of that batch's prompts and reply with the
    seconds; at end of input reply with the memory: anonymous resident memory (Linux: RssAnon, sampled every
    millisecond while loading and during the calls of requests with "sample" true, counted from just before the load)
    after the load and at its peak, and the peak total resident memory (VmHWM, the kernel's high-water mark, which
    counts mapped files such as llama.cpp's weights too) over the total just before the load. The sampler takes the
    GIL and a core a thousand times a second, so measure samples only untimed calls."""
    s = json.loads(spec)
    torch.set_num_threads(s["threads"])
    peak, busy, done = [0], threading.Event(), threading.Event()

    def sample():  # only while busy, so that it takes no time from a timed call or from another engine
        while busy.wait() and not done.is_set():
            peak[0] = max(peak[0], proc_status("RssAnon"))
            time.sleep(0.001)

    def reply(value):
        print(REPLY + json.dumps(value), flush=True)
    before, before_total = proc_status("RssAnon"), proc_status("VmRSS")
    busy.set()
    sampler = threading.Thread(target=sample, daemon=True)  # daemon: a failed load still ends the process
    sampler.start()
    generate = load_engine(s["engine"], s["dtype"], Path(s["folder"]), s["device"], s["threads"],
                           max(s["batch_sizes"]), s["prompt_len"] + s["new_tokens"], s["beams"])
    after_load = proc_status("RssAnon")
    busy.clear()
    reply("loaded")
    with torch.no_grad():
        for line in sys.stdin:
            request = json.loads(line)
            ids = prompts(request["batch"], s["prompt_len"], s["vocab"], s["device"])
            if request["sample"]:
                busy.set()
            seconds = timed(lambda: generate(ids, request["n"]), s["device"])
            busy.clear()
            reply(seconds)
    done.set()
    busy.set()
    sampler.join()
    reply({"after_load": after_load - before, "peak": max(peak[0], proc_status("RssAnon")) - before,
           "peak_total": proc_status("VmHWM") - before_total})


class EngineFailed(Exception):
    """An engine's process ended early; the message is the last line it wrote to stderr, or its exit status."""


class Engine:
    """One engine and dtype in a process of its own (worker), loaded on start and timing one generate call per
    request, so that the engines of a dtype can take turns (measure)."""

    def __init__(self, spec: dict):
        self.name = spec["engine"]
        self.stderr = tempfile.TemporaryFile("w+")  # a file, not a pipe: a chatty engine cannot block on it
        self.proc = subprocess.Popen([sys.executable, "-c", f"from {__name__} import worker; import sys; "
                                      "worker(sys.argv[1])", json.dumps(spec)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        self.reply()  # loaded

    def reply(self):
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])
        self.proc.wait()
        self.stderr.seek(0)
        lines = self.stderr.read().strip().splitlines()
        raise EngineFailed(lines[-1] if lines else f"exit status {self.proc.returncode}")

    def time(self, batch: int, n: int, sample: bool = False) -> float:
        """Seconds of one generate(ids, n) of the batch's prompts, with its memory sampled or not (see worker)."""
        self.proc.stdin.write(json.dumps({"batch": batch, "n": n, "sample": sample}) + "\n")
        self.proc.stdin.flush()
        return self.reply()

    def close(self) -> dict:
        """End the process -> its memory (see worker)."""
        self.proc.stdin.close()
        try:
            return self.reply()
        finally:
            self.proc.wait()
            self.stderr.close()


def measure(calls: dict, dtype, folder: Path, device, batch_sizes, prompt_len, vocab, beams: int = 1):
    """The engines of `calls` ({engine: (new tokens, timed runs)}) in `dtype`, each in a process of its own
    (Engine), all loaded at once and timed in turns: per batch size an untimed first call each, generate(ids, n) with
    its memory sampled (a compiled engine compiles then), then round after round one generate(ids, n) and one
    generate(ids, 1) of each engine, unsampled, so that a drift of the host's speed falls on every engine alike and no
    sampler runs beside a timed call; every call starts PAUSE_S after the last ended -> {engine: (split_times of the
    median times per batch size, with "spread": the range of the timed generate(ids, n) calls over their median, and
    "middle_half": their interquartile range over the median; after-load, peak anonymous and peak total resident
    bytes)}, or for an engine that cannot run the reason (a string)."""
    spec = dict(dtype=dtype, folder=str(folder), device=str(device), threads=torch.get_num_threads(),
                batch_sizes=batch_sizes, prompt_len=prompt_len, vocab=vocab, beams=beams)
    running, failed, times = {}, {}, {}
    for engine, (n, _) in calls.items():
        try:
            running[engine] = Engine(dict(spec, engine=engine, new_tokens=n))
        except EngineFailed as e:
            failed[engine] = str(e)

    def turn(engine, batch, n, timed=True):
        if engine in running:
            pause()
            try:
                t = running[engine].time(batch, n, sample=not timed)
            except EngineFailed as e:
                failed[engine] = str(e)
                del running[engine]
                return
            if timed:
                times.setdefault(engine, {}).setdefault(batch, {}).setdefault(n, []).append(t)
    for batch in batch_sizes:
        for engine in list(running):
            turn(engine, batch, calls[engine][0], timed=False)
        for run in range(max(runs for _, runs in calls.values())):
            for engine in [e for e in running if run < calls[e][1]]:
                for n in (calls[engine][0], 1):
                    turn(engine, batch, n)
    results = {}
    for engine in calls:  # in the order given
        try:
            if engine in failed:
                raise EngineFailed(failed[engine])
            memory = running[engine].close()
        except EngineFailed as e:
            results[engine] = str(e)
            continue
        rates = {}
        for batch, t in times[engine].items():
            calls_n = t[calls[engine][0]]
            median = statistics.median(calls_n)
            q1, _, q3 = statistics.quantiles(calls_n, n=4, method="inclusive") if len(calls_n) > 1 else (0, 0, 0)
            rates[batch] = split_times(batch, calls[engine][0], median, statistics.median(t[1]))
            rates[batch].update(spread=(max(calls_n) - min(calls_n)) / median, middle_half=(q3 - q1) / median)
        results[engine] = rates, memory["after_load"], memory["peak"], memory["peak_total"]
    return results


def engines(device, dtype: str, uncached: bool, model: str) -> list[str]:
    """The engines to time in `dtype`: ours, eager and (a decoder) with each decoding step compiled
    (generate(compile=True); on the CPU the warm-up call compiles it, on CUDA every call captures it in a CUDA graph)
    (and ours without the KV cache; int8 also ours with x quantized to 8 bits), Hugging Face's (int8 on the CPU
    only: torch's dynamic quantization has no CUDA kernels), and on the CPU when their packages are installed
    CTranslate2's and, for DECODER_SHAPES, llama.cpp's in each of its GGUF types for `dtype` ("llama.cpp f32", ...)."""
    cpu = torch.device(device).type == "cpu"
    names = ["ours"] + (["ours, compiled"] if model != "marian" else []) + (["ours, no cache"] if uncached else [])
    names += ["ours, x 8 bits"] if dtype == "int8" else []
    names += ["Hugging Face"] if cpu or dtype != "int8" else []
    if cpu and dtype in CT2_TYPES and importlib.util.find_spec("ctranslate2") is not None:
        names.append("CTranslate2")
    if cpu and model in DECODER_SHAPES and importlib.util.find_spec("llama_cpp"):
        names += [f"llama.cpp {t}" for t in llamacpp.GGUF_TYPES[dtype]]
    return names


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first new-token position where any row of a and b differ, or None when they are equal."""
    diff = (a != b).any(0).nonzero()
    return None if diff.numel() == 0 else int(diff[0])


def same_tokens(hf, device, batch_sizes, prompt_len, new_tokens, others, beams: int = 1
                ) -> dict[str, dict[int, int | None]]:
    """Per engine of `others` ({name: generate(ids, n)}, each returning the new tokens after the ids, or after a
    Marian model's pad id) and batch size: the first position where our float32 tokens (greedy, or beam search with
    `beams`) differ from that engine's (None: equal)."""
    seq2seq = hf.config.is_encoder_decoder
    ours = our_generate((Seq2SeqTransformer if seq2seq else DecoderLM).from_hf(hf), "ours", "float32",
                        hf.config.to_dict(), beams)
    result, skip = {name: {} for name in others}, 1 if seq2seq else prompt_len
    for batch in batch_sizes:
        ids = prompts(batch, prompt_len, hf.config.vocab_size, device)
        with torch.no_grad():
            a = ours(ids, new_tokens)[:, skip:]
            for name, generate in others.items():
                result[name][batch] = first_difference(a, generate(ids, new_tokens)[:, skip:])
    return result


def llamacpp_notes(names) -> list[str]:
    """What the record says about the llama.cpp rows among the engine names run."""
    types = [name.split()[1] for name in names if name.startswith("llama.cpp")]
    if not types:
        return []
    notes = ["- llama.cpp (llama-cpp-python, built for this CPU): the folder converted by llama.cpp's "
             "convert_hf_to_gguf.py (q8_0: the converter's own `--outtype q8_0`), memory-mapped as llama.cpp loads it; "
             "a batch is that many parallel sequences in one llama_batch per step, sampled by its greedy sampler; "
             "its KV cache is float32 for f32, else its default float16, and ours is the model's dtype, bfloat16 for "
             "int8 (generate(cache_dtype=torch.bfloat16))"]
    if "q8_0" in types and not llamacpp.extra_buffers("q8_0"):
        notes.append("- llama.cpp q8_0 ran with its extra buffer types off (use_extra_bufts=false): on this AMX CPU "
                     "llama.cpp's AMX path can crash in q8_0 prompt processing")
    return notes


def markdown(rows, memory, device, command, model_desc, runs, tokens=None, not_run=(), decoding="greedy") -> str:
    """The record: rows (batch, prompt length, engine, dtype, new tokens, split_times), memory (engine, dtype, prompt
    length, after-load, peak and peak total bytes), the token checks and what could not run; `decoding` names the
    search ("greedy", or "beam search (4 beams)")."""
    lines = [f"- device: {device_name(device)}", f"- torch: {torch.__version__}",
             f"- date: {datetime.date.today().isoformat()}", f"- command: `{command}`",
             f"- model: {model_desc}; {decoding}, median of {runs} runs",
             "- each engine and dtype runs in a process of its own (in one process, a loaded CTranslate2 slowed "
             "PyTorch's generation by about 15%), with the same thread count; the engines of a dtype take turns, one "
             f"timed call each, round after round, each call {PAUSE_S} s after the last ended; tokens/s counts the "
             "new tokens of the batch over the whole generate call, prefill included",
             "- prefill: the median time of generate(ids, 1) (the prompt's forward and the first token); decode "
             "tokens/s: the other new tokens of the batch over the median time of generate(ids, n) less the prefill",
             "- spread: the range of the timed calls of generate(ids, n) over their median (call-to-call steadiness), "
             "in brackets their interquartile range over the median (the middle half, which one slow call of a busy "
             "host does not move), then the range in milliseconds (a stall of the host adds the same milliseconds to "
             "any call, a larger share of a shorter one)",
             *llamacpp_notes({name for _, _, name, *_ in rows}), "",
             "| batch | prompt | variant | dtype | new tokens | tokens/s | ours vs this | decode tokens/s | ours vs "
             "this, decode | prefill (ms) | spread |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    ours = {(b, L, dtype): r for b, L, name, dtype, _, r in rows if name == "ours"}
    lines += [f"| {b} | {L} | {name} | {dtype} | {n} | {r['total']:.1f} | {o['total'] / r['total']:.2f}x | "
              f"{r['decode']:.1f} | {o['decode'] / r['decode']:.2f}x | {r['prefill'] * 1e3:.1f} | {r['spread']:.0%} "
              f"({r['middle_half']:.0%}), {r['spread'] * b * n / r['total'] * 1e3:.0f} ms |"
              for b, L, name, dtype, n, r in rows for o in [ours[b, L, dtype]]]
    lines += [f"\nNot run: {what}: {why}" for what, why in not_run]
    for name, result in (tokens or {}).items():
        lines += ["", f"{decoding.capitalize()} float32 tokens against {name}'s: " + "; ".join(
            f"batch {b}: {'identical' if pos is None else f'first difference at new token {pos}'}"
            for b, pos in result.items())]
    if memory:
        lines += ["", "Resident memory of each engine's process, counted from just before loading the model from the "
                  "save_pretrained folder (float32; for bfloat16 and float16 a save of the same weights in that dtype) "
                  "or from what CTranslate2's and llama.cpp's converters made of it: anonymous resident "
                  "memory (RssAnon, sampled every millisecond) after the load and at its peak over the load and the "
                  "first, untimed call of each batch size (the same call as the timed ones, which run without the "
                  "sampler), which leaves out mapped files (page cache); and the peak of all resident memory (VmHWM), "
                  "which counts the pages of mapped files too, such as llama.cpp's memory-mapped weights.", "",
                  "| engine | dtype | prompt | after load (MiB) | peak (MiB) | peak total (MiB) |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {e} | {d} | {L} | {a / 2**20:.0f} | {p / 2**20:.0f} | {t / 2**20:.0f} |"
                  for e, d, L, a, p, t in memory]
    return "\n".join(lines) + "\n"


def check_tokens(hf, folder: Path, args) -> dict[str, dict[int, int | None]]:
    """same_tokens against Hugging Face and, when it is among the float32 engines, llama.cpp f32 or (Marian)
    CTranslate2 (their conversions of the saved folder, loaded in this process after the timed runs)."""
    others = {"Hugging Face": hf_generate(hf, args.beams)}
    if args.model == "marian" and "CTranslate2" in engines(args.device, "float32", False, args.model):
        import ctranslate2
        others["CTranslate2"] = ct2_translate(ctranslate2.Translator(
            str(ct2_folder(folder, "float32")), device="cpu", intra_threads=torch.get_num_threads()),
            hf.config.pad_token_id, args.beams)
    llama = "llama.cpp f32" in engines(args.device, "float32", False, args.model)
    if llama:
        others["llama.cpp f32"] = llamacpp.load(folder, "f32", torch.get_num_threads(), max(args.batch_sizes),
                                                args.prompt_len[0] + args.new_tokens)
    try:
        return same_tokens(hf, args.device, args.batch_sizes, args.prompt_len[0], args.new_tokens, others,
                           args.beams)
    finally:
        if llama:
            others["llama.cpp f32"].close()


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m pytransformer bench-generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["gpt2", *DECODER_SHAPES, "marian"], default="gpt2",
                   help="gpt2: GPT-2 small's shape; llama: a Llama of that size; llama-1b: TinyLlama-1.1B's shape; "
                        "qwen3-0.6b: Qwen3-0.6B's shape; gemma3-270m: Gemma 3 270M's shape; marian: translation, "
                        "opus-mt-en-de's shape")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16", "float16", "int8"],
                   default=["float32", "int8"])
    p.add_argument("--prompt-len", type=int, nargs="+", default=[128],
                   help="prompt lengths (each engine is timed at each; the token checks use the first)")
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--uncached-new-tokens", type=int, default=None,
                   help="also time ours without the KV cache (float32) for this many new tokens (its cost per token "
                        "grows with length, so a shorter run overstates its tokens/s)")
    p.add_argument("--runs", type=int, default=5, help="timed generate calls per engine, dtype and batch (median)")
    p.add_argument("--engines", nargs="+", metavar="NAME",
                   help="time only these engines, named as in the table (\"ours, compiled\", \"Hugging Face\", "
                        "\"llama.cpp f32\", ...); ours always runs, as every ratio is to it")
    p.add_argument("--beams", type=int, default=1,
                   help="beam search with this many beams (--model marian only; the opus-mt models use 4 to 6)")
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    if args.new_tokens < 2 or (args.uncached_new_tokens or 2) < 2:
        p.error("--new-tokens and --uncached-new-tokens: at least 2 (the prefill and decode split needs them)")
    if args.beams < 1 or (args.beams > 1 and args.model != "marian"):
        p.error("--beams: at least 1, and more only with --model marian")
    try:
        hf = hf_model(args.model, args.device)
    except ImportError:
        p.error("the generation benchmark needs transformers and tokenizers (pip install transformers tokenizers)")
    shape = {"gpt2": "GPT-2 small shape", "marian": f"Marian translation, opus-mt-en-de's shape ({MARIAN_SHAPE})"}.get(
        args.model) or "{} shape ({})".format(DECODER_SHAPES[args.model][0].removesuffix("ForCausalLM"),
                                              DECODER_SHAPES[args.model][1])
    desc = f"{shape}, {count_parameters(hf) / 1e6:.1f}M parameters, random weights"
    print(f"device: {device_name(args.device)}\n| batch | prompt | variant | dtype | new tokens | tokens/s |\n"
          "|---|---|---|---|---|---|", flush=True)
    rows, memory, not_run = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "float32"
        save_folder(hf, folder)
        folders = {"float32": folder, "int8": folder}
        for half in {"bfloat16", "float16"} & set(args.dtypes):  # saved again, so that every engine loads it as stored
            folders[half] = Path(tmp) / half
            save_folder(copy.deepcopy(hf).to(getattr(torch, half)), folders[half])
        for dtype in args.dtypes:
            names = engines(args.device, dtype, bool(args.uncached_new_tokens) and dtype == "float32", args.model)
            calls = {e: (args.uncached_new_tokens, 1) if e == "ours, no cache" else (args.new_tokens, args.runs)
                     for e in names if not args.engines or e == "ours" or e in args.engines}
            for prompt_len in args.prompt_len:
                results = measure(calls, dtype, folders[dtype], args.device, args.batch_sizes, prompt_len,
                                  hf.config.vocab_size, args.beams)
                for engine, result in results.items():
                    if isinstance(result, str):
                        not_run.append((f"{engine} {dtype}", result))
                        print(f"{engine} {dtype}: not run ({result})", flush=True)
                        continue
                    rates, after_load, peak, peak_total = result
                    n = calls[engine][0]
                    for batch, rate in rates.items():
                        rows.append((batch, prompt_len, engine, dtype, n, rate))
                        print(f"| {batch} | {prompt_len} | {engine} | {dtype} | {n} | {rate['total']:.1f} |",
                              flush=True)
                    if engine != "ours, no cache":
                        memory.append((engine, dtype, prompt_len, after_load, peak, peak_total))
        tokens = check_tokens(hf, folder, args)
    rows.sort(key=lambda r: r[:2])  # by batch size and prompt length, engines and dtypes in the order run
    decoding = "greedy" if args.beams == 1 else f"beam search ({args.beams} beams)"
    text = markdown(rows, memory, args.device, command_line(), desc, args.runs, tokens, not_run, decoding)
    print(text, flush=True)
    if args.record:
        with open(args.record, "w") as f:
            f.write("# Generation benchmark\n\n" + text)


if __name__ == "__main__":
    main()
