"""Generation throughput (greedy tokens/s) of DecoderLM against Hugging Face `generate` and, when the `ctranslate2`
package is installed, CTranslate2's Generator, on the same device in the same run, timed in turns.

The model is a random Hugging Face model, float32, saved to a temporary folder; ours is converted from it with
DecoderLM.from_hf, CTranslate2's with its own TransformersConverter (a word-level vocabulary "t0", "t1", ... is saved
beside it, so token strings map one to one to ids):

- `--model gpt2`: GPT-2 small shape (124M parameters, tied head); in float32 also ours without the KV cache.
- `--model llama`: a Llama shape (124M parameters, GQA 4:1, SwiGLU, untied head).

In each of `--dtypes`: float32; bfloat16 (weights and activations; CTranslate2's compute type bfloat16 where its CPU
build has it); int8 (ours: weight-only int8; Hugging Face: torch's dynamic int8 quantization of its nn.Linear layers;
CTranslate2: int8_float32). Every engine runs with the same number of threads (torch.get_num_threads()). The record
also says whether our float32 greedy tokens equal Hugging Face's, and the resident memory of each engine after
loading the model from the folder and at its peak while loading and generating (each in a fresh process).
"""
import argparse
import copy
import datetime
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from .. import quantize
from ..models import DecoderLM, count_parameters
from . import device_name, sync

# 12 layers, d_model 768, 12 query heads sharing 3 KV heads, SwiGLU 2048, vocabulary 32000: 124M parameters
LLAMA_SHAPE = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                   num_attention_heads=12, num_key_value_heads=3, tie_word_embeddings=False)
CT2_TYPES = {"float32": "float32", "bfloat16": "bfloat16", "int8": "int8_float32"}


def timed(fn, device) -> float:
    """Wall time of one fn() call in seconds."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def hf_model(name: str, device):
    """A random Hugging Face GPT2LMHeadModel or LlamaForCausalLM (float32, eval)."""
    import transformers
    torch.manual_seed(0)
    if name == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(pad_token_id=0))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_SHAPE))
    return model.to(device).eval()


def hf_generate(hf):
    """generate(ids, n) of a Hugging Face model: greedy, exactly n new tokens."""
    return lambda ids, n: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, pad_token_id=0)


def save_folder(hf, folder: Path) -> None:
    """hf.save_pretrained(folder) plus a word-level tokenizer of tokens "t<id>" (what CTranslate2's converter reads
    for the vocabulary); the model's bos/eos ids name its special tokens."""
    import transformers
    from tokenizers import Tokenizer, models
    hf.save_pretrained(folder)
    vocab = hf.config.vocab_size
    special = {k: f"t{getattr(hf.config, f'{k}_token_id', None) or vocab - 1}" for k in ("bos", "eos")}
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token=special["eos"]))
    transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=special["bos"], eos_token=special["eos"],
                                         unk_token=special["eos"]).save_pretrained(folder)


def ct2_folder(folder: Path, dtype: str) -> Path:
    """The CTranslate2 conversion of the saved model, with its weights stored for `dtype` (converted once)."""
    import ctranslate2
    out = folder / f"ct2-{dtype}"
    if not out.exists():
        ctranslate2.converters.TransformersConverter(str(folder)).convert(
            str(out), quantization="int8" if dtype == "int8" else dtype)
    return out


def ct2_generate(generator):
    """generate(ids, n) of a CTranslate2 Generator: greedy (top-1 sampling), exactly n new tokens, the prompt
    forwarded at once (include_prompt_in_result=False); returns the new token ids."""
    def generate(ids, n):
        results = generator.generate_batch([[f"t{i}" for i in row] for row in ids.tolist()], max_length=n,
                                           min_length=n, sampling_topk=1, include_prompt_in_result=False)
        return torch.tensor([r.sequences_ids[0] for r in results])
    return generate


def ct2_generator(folder: Path, dtype: str, threads: int):
    """A CTranslate2 Generator of the saved model in `dtype`, or None (with the reason printed) when the package is
    not installed or its build cannot run that compute type here."""
    try:
        import ctranslate2
    except ImportError:
        return None
    try:
        return ctranslate2.Generator(str(ct2_folder(folder, dtype)), device="cpu", compute_type=CT2_TYPES[dtype],
                                     intra_threads=threads)
    except (ValueError, RuntimeError) as e:
        print(f"CTranslate2 {dtype}: not run ({e})", flush=True)
        return None


def ours_and_hf(hf, dtype: str):
    """(ours, Hugging Face's) models in `dtype`."""
    if dtype == "int8":
        return (quantize(DecoderLM.from_hf(hf)),
                torch.ao.quantization.quantize_dynamic(copy.deepcopy(hf), {torch.nn.Linear}, dtype=torch.qint8))
    theirs = hf if dtype == "float32" else copy.deepcopy(hf).to(getattr(torch, dtype))
    return DecoderLM.from_hf(theirs), theirs


def variants(hf, folder: Path, device, dtypes, new_tokens, uncached_new_tokens=None):
    """(variant, dtype, new tokens, generate(ids, n)) of every engine in each dtype."""
    rows = []
    for dtype in dtypes:
        ours, theirs = ours_and_hf(hf, dtype)
        rows += [("ours", dtype, new_tokens, ours.generate)]
        if uncached_new_tokens and dtype == "float32":
            rows += [("ours, no cache", dtype, uncached_new_tokens,
                      lambda ids, n, m=ours: m.generate(ids, n, use_cache=False))]
        rows += [("Hugging Face", dtype, new_tokens, hf_generate(theirs))]
        generator = ct2_generator(folder, dtype, torch.get_num_threads()) if device == "cpu" else None
        if generator is not None:
            rows += [("CTranslate2", dtype, new_tokens, ct2_generate(generator))]
    return rows


def run(variants, device, batch_sizes, prompt_len, vocab_size, runs, uncached_runs=1):
    """Rows (batch, variant, dtype, new tokens, tokens/s): median of `runs` calls per variant, round-robin, so that
    load changes on a shared machine hit every variant alike (variants named "... no cache" run `uncached_runs`)."""
    rows = []
    for batch in batch_sizes:
        torch.manual_seed(batch)
        ids = torch.randint(0, vocab_size, (batch, prompt_len), device=device)
        times = [[] for _ in variants]
        with torch.no_grad():
            for *_, fn in variants:
                fn(ids, 4)  # warm-up
            for i in range(runs):
                for (name, _, n, fn), t in zip(variants, times):
                    if "no cache" not in name or i < uncached_runs:
                        t.append(timed(lambda: fn(ids, n), device))
        for (name, dtype, n, _), t in zip(variants, times):
            rows.append((batch, name, dtype, n, batch * n / statistics.median(t)))
            print(f"| {batch} | {name} | {dtype} | {n} | {rows[-1][-1]:.1f} |", flush=True)
    return rows


def first_difference(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first new-token position where any row of a and b differ, or None when they are equal."""
    diff = (a != b).any(0).nonzero()
    return None if diff.numel() == 0 else int(diff[0])


def same_tokens(hf, device, batch_sizes, prompt_len, new_tokens) -> dict[int, int | None]:
    """Per batch size: the first position where our float32 greedy tokens differ from Hugging Face's (None: equal)."""
    ours, result = DecoderLM.from_hf(hf), {}
    for batch in batch_sizes:
        torch.manual_seed(batch)
        ids = torch.randint(0, hf.config.vocab_size, (batch, prompt_len), device=device)
        with torch.no_grad():
            a, b = ours.generate(ids, new_tokens), hf_generate(hf)(ids, new_tokens)
        result[batch] = first_difference(a[:, prompt_len:], b[:, prompt_len:])
    return result


MEMORY_SCRIPT = """
import json, sys, threading, time, torch
def rss():
    return int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('RssAnon:'))) * 1024
peak, done = [0], threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss())
        time.sleep(0.001)
engine, folder, dtype, threads, batch, prompt_len, new_tokens = sys.argv[1:]
threads, batch, prompt_len, new_tokens = int(threads), int(batch), int(prompt_len), int(new_tokens)
torch.set_num_threads(threads)
from pytransformer.bench.generate import ct2_folder, ct2_generate, hf_generate
ids = torch.randint(0, 1000, (batch, prompt_len))
if engine == 'CTranslate2':
    import ctranslate2
    from pathlib import Path
    path = ct2_folder(Path(folder), dtype)
before = rss()
sampler = threading.Thread(target=sample)
sampler.start()
if engine == 'ours':
    from pytransformer.models import DecoderLM
    model = DecoderLM.from_pretrained(folder, dtype=torch.float32 if dtype == 'int8' else getattr(torch, dtype),
                                      quantize=dtype == 'int8')
    generate = model.generate
elif engine == 'Hugging Face':
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32 if dtype == 'int8'
                                                              else getattr(torch, dtype)).eval()
    if dtype == 'int8':
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    generate = hf_generate(model)
else:
    generate = ct2_generate(ctranslate2.Generator(str(path), device='cpu',
                                                  compute_type={'int8': 'int8_float32'}.get(dtype, dtype),
                                                  intra_threads=threads))
loaded = rss()
with torch.no_grad():
    generate(ids, new_tokens)
done.set()
sampler.join()
print(json.dumps({'after_load': loaded - before, 'peak': max(peak[0], rss()) - before}))
"""


def resident_memory(folder: Path, engines, batch: int, prompt_len: int, new_tokens: int):
    """(engine, dtype, anonymous resident bytes after loading the model from `folder`, and their peak while loading
    and generating `new_tokens` tokens for `batch` prompts), each engine in a fresh process (Linux: RssAnon sampled
    every millisecond, counted from just before the load; a file's mapped pages are page cache, not counted)."""
    rows = []
    for engine, dtype in engines:
        out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, engine, str(folder), dtype,
                              str(torch.get_num_threads()), str(batch), str(prompt_len), str(new_tokens)],
                             capture_output=True, text=True)
        if out.returncode:
            print(f"memory of {engine} {dtype}: failed\n{out.stderr[-2000:]}", flush=True)
            continue
        m = json.loads(out.stdout.splitlines()[-1])
        rows.append((engine, dtype, m["after_load"], m["peak"]))
    return rows


def markdown(rows, device, command, model_desc, prompt_len, runs, tokens=None, memory=(), memory_run="") -> str:
    lines = [f"- device: {device_name(device)}", f"- torch: {torch.__version__}",
             f"- date: {datetime.date.today().isoformat()}", f"- command: `{command}`",
             f"- model: {model_desc}; prompt {prompt_len} tokens, greedy, median of {runs} round-robin runs", "",
             "| batch | variant | dtype | new tokens | tokens/s | ours vs this |", "|---|---|---|---|---|---|"]
    ours = {(b, dtype): r for b, name, dtype, _, r in rows if name == "ours"}
    lines += [f"| {b} | {name} | {dtype} | {n} | {r:.1f} | {ours[b, dtype] / r:.2f}x |" for b, name, dtype, n, r in rows]
    if tokens:
        lines += ["", "Greedy float32 tokens against Hugging Face's: " + "; ".join(
            f"batch {b}: {'identical' if pos is None else f'first difference at new token {pos}'}"
            for b, pos in tokens.items())]
    if memory:
        lines += ["", f"Resident memory, each engine in a fresh process: anonymous resident memory (RssAnon, sampled "
                  f"every millisecond) counted from just before loading the model from the float32 save_pretrained "
                  f"folder (CTranslate2: its converted folder); the peak spans the load and {memory_run}. Mapped "
                  "files are page cache and not counted.", "",
                  "| engine | dtype | after load (MiB) | peak (MiB) |", "|---|---|---|---|"]
        lines += [f"| {e} | {d} | {a / 2**20:.0f} | {p / 2**20:.0f} |" for e, d, a, p in memory]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m pytransformer bench-generate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16", "int8"], default=["float32", "int8"])
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--uncached-new-tokens", type=int, default=None,
                   help="also time ours without the KV cache (float32) for this many new tokens (its cost per token "
                        "grows with length, so a shorter run overstates its tokens/s)")
    p.add_argument("--runs", type=int, default=5, help="timed generate calls per variant, round-robin (median)")
    p.add_argument("--uncached-runs", type=int, default=1, help="timed calls of the (slow) uncached variant")
    p.add_argument("--no-memory", action="store_true", help="skip the resident-memory measurement")
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    try:
        hf = hf_model(args.model, args.device)
    except ImportError:
        p.error("the generation benchmark needs transformers and tokenizers (pip install transformers tokenizers)")
    shape = "GPT-2 small shape" if args.model == "gpt2" else f"Llama shape ({LLAMA_SHAPE})"
    desc = f"{shape}, {count_parameters(hf) / 1e6:.1f}M parameters, random weights"
    print(f"device: {device_name(args.device)}\n| batch | variant | dtype | new tokens | tokens/s |\n"
          "|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_folder(hf, folder)
        runs = variants(hf, folder, args.device, args.dtypes, args.new_tokens, args.uncached_new_tokens)
        rows = run(runs, args.device, args.batch_sizes, args.prompt_len, hf.config.vocab_size, args.runs,
                   args.uncached_runs)
        del runs
        tokens = same_tokens(hf, args.device, args.batch_sizes, args.prompt_len, args.new_tokens)
        memory, memory_run = (), ""
        if sys.platform == "linux" and args.device == "cpu" and not args.no_memory:
            batch, new = max(args.batch_sizes), 32
            engines = [(e, d) for d in args.dtypes for e in ("ours", "Hugging Face", "CTranslate2")
                       if any(name == e and dtype == d for _, name, dtype, _, _ in rows)]
            memory = resident_memory(folder, engines, batch, args.prompt_len, new)
            memory_run = f"generating {new} tokens for {batch} prompts of {args.prompt_len}"
    print(markdown([], args.device, "", desc, args.prompt_len, args.runs, tokens, memory, memory_run), flush=True)
    if args.record:
        with open(args.record, "w") as f:
            f.write("# Generation benchmark\n\n" + markdown(rows, args.device, " ".join(["python"] + sys.argv), desc,
                                                           args.prompt_len, args.runs, tokens, memory, memory_run))


if __name__ == "__main__":
    main()
