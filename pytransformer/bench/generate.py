"""Generation throughput (greedy tokens/s) of DecoderLM against Hugging Face `generate` on the same device in the same
run, timed in turns:

- `--model gpt2`: a GPT-2-small-shaped model (random weights, float32): ours with the KV cache, ours without it, and
  Hugging Face GPT-2.
- `--model llama`: a Llama-shaped model (124M parameters, GQA 4:1, untied head) converted from a random Hugging Face
  LlamaForCausalLM, in each of `--dtypes`: float32, bfloat16 (weights and activations), int8 (ours: weight-only int8;
  Hugging Face: torch's dynamic int8 quantization of its nn.Linear layers). The record also says whether our float32
  greedy tokens equal Hugging Face's, and the memory of loading the model from a save_pretrained folder.
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

import torch

from .. import quantize
from ..models import DecoderLM, count_parameters, gpt2_small
from . import device_name, sync

# 12 layers, d_model 768, 12 query heads sharing 3 KV heads, SwiGLU 2048, vocabulary 32000: 124M parameters
LLAMA_SHAPE = dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                   num_attention_heads=12, num_key_value_heads=3, tie_word_embeddings=False)


def timed(fn, device) -> float:
    """Wall time of one fn() call in seconds."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def hf_generate(hf):
    """generate(ids, n) of a Hugging Face model: greedy, exactly n new tokens."""
    return lambda ids, n: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, pad_token_id=0)


def gpt2_variants(device, new_tokens, uncached_new_tokens, with_hf=True):
    """(variant, dtype, new tokens, generate(ids, n)) of the GPT-2-small-shaped model, and its vocabulary size."""
    torch.manual_seed(0)
    model = DecoderLM(gpt2_small(dropout=0.0)).to(device).eval()
    variants = [("ours, KV cache", "float32", new_tokens, model.generate),
                ("ours, no cache", "float32", uncached_new_tokens, lambda ids, n: model.generate(ids, n, use_cache=False))]
    if with_hf:
        try:
            import transformers
        except ImportError:
            print("transformers is not installed: no Hugging Face baseline", flush=True)
        else:
            hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(pad_token_id=0)).to(device).eval()
            variants.append(("Hugging Face", "float32", new_tokens, hf_generate(hf)))
    return variants, model.config.vocab_size


def hf_llama(device):
    """A random Hugging Face LlamaForCausalLM of LLAMA_SHAPE (float32, eval)."""
    import transformers
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA_SHAPE)).to(device).eval()


def llama_variants(hf, device, dtypes, new_tokens):
    """(variant, dtype, new tokens, generate(ids, n)): ours and Hugging Face's for each dtype."""
    variants = []
    for dtype in dtypes:
        if dtype == "int8":
            ours = quantize(DecoderLM.from_hf(hf))
            theirs = torch.ao.quantization.quantize_dynamic(copy.deepcopy(hf), {torch.nn.Linear}, dtype=torch.qint8)
        else:
            theirs = hf if dtype == "float32" else copy.deepcopy(hf).to(getattr(torch, dtype))
            ours = DecoderLM.from_hf(theirs)
        variants += [("ours", dtype, new_tokens, ours.generate), ("Hugging Face", dtype, new_tokens, hf_generate(theirs))]
    return variants


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
        ids = torch.randint(0, LLAMA_SHAPE["vocab_size"], (batch, prompt_len), device=device)
        with torch.no_grad():
            a, b = ours.generate(ids, new_tokens), hf_generate(hf)(ids, new_tokens)
        result[batch] = first_difference(a[:, prompt_len:], b[:, prompt_len:])
    return result


LOAD_SCRIPT = """
import gc, json, sys, threading, time, torch
def status(key):
    return int(next(l.split()[1] for l in open('/proc/self/status') if l.startswith(key))) * 1024
def sample(peak, done):
    while not done.is_set():
        peak[0] = max(peak[0], status('RssAnon:'))
        time.sleep(0.001)
loader, folder, dtype = sys.argv[1], sys.argv[2], getattr(torch, sys.argv[3])
if loader == 'ours':
    from pytransformer.models import DecoderLM
    load = lambda: DecoderLM.from_pretrained(folder, dtype=dtype)
else:
    import transformers
    load = lambda: transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
def measure():
    before, peak, done = status('RssAnon:'), [0], threading.Event()
    sampler = threading.Thread(target=sample, args=(peak, done))
    sampler.start()
    model = load()
    done.set()
    sampler.join()
    return model, status('RssAnon:') - before, max(peak[0], status('RssAnon:')) - before
model, after, peak = measure()
del model
gc.collect()
print(json.dumps({'after': after, 'peak': peak, 'again': measure()[1]}))
"""


def load_memory(hf, dtypes) -> list[tuple[str, str, int, int, int, int]]:
    """(loader, dtype, checkpoint bytes, anonymous resident bytes after the load, their peak during it, and after a
    second load in the same process, without the first use's set-up) of
    DecoderLM.from_pretrained and transformers' from_pretrained on a float32 save_pretrained folder, each in a fresh
    process (Linux: RssAnon sampled every millisecond; the file's own pages, mapped by safetensors, are not counted)."""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        hf.save_pretrained(folder)
        size = sum(p.numel() * p.element_size() for p in hf.state_dict().values())
        for dtype in dtypes:
            for loader in ("ours", "Hugging Face"):
                out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, loader.split()[0], folder, dtype],
                                     capture_output=True, text=True, check=True)
                m = json.loads(out.stdout.splitlines()[-1])
                rows.append((loader, dtype, size, m["after"], m["peak"], m["again"]))
    return rows


def markdown(rows, device, command, model_desc, prompt_len, runs, tokens=None, memory=()) -> str:
    lines = [f"- device: {device_name(device)}", f"- torch: {torch.__version__}",
             f"- date: {datetime.date.today().isoformat()}", f"- command: `{command}`",
             f"- model: {model_desc}; prompt {prompt_len} tokens, greedy, median of {runs} round-robin runs", "",
             "| batch | variant | dtype | new tokens | tokens/s | ours vs this |", "|---|---|---|---|---|---|"]
    ours = {(b, dtype): r for b, name, dtype, _, r in rows if name.startswith("ours") and "no cache" not in name}
    lines += [f"| {b} | {name} | {dtype} | {n} | {r:.1f} | {ours[b, dtype] / r:.2f}x |" for b, name, dtype, n, r in rows]
    if tokens:
        lines += ["", "Greedy float32 tokens against Hugging Face's: " + "; ".join(
            f"batch {b}: {'identical' if pos is None else f'first difference at new token {pos}'}"
            for b, pos in tokens.items())]
    if memory:
        lines += ["", "Loading the model from a float32 save_pretrained folder, each in a fresh process: anonymous "
                  "resident memory (RssAnon, sampled every millisecond) counted from just before the load; the "
                  "safetensors file's own mapped pages are page cache and not counted.", "",
                  "| loader | dtype | checkpoint (MiB) | after load (MiB) | peak during load (MiB) | after a second load "
                  "(MiB) |", "|---|---|---|---|---|---|"]
        lines += [f"| {row[0]} | {row[1]} | " + " | ".join(f"{x / 2**20:.0f}" for x in row[2:]) + " |" for row in memory]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    p.add_argument("--dtypes", nargs="+", choices=["float32", "bfloat16", "int8"],
                   default=["float32", "bfloat16", "int8"], help="llama: the dtypes to compare")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--uncached-new-tokens", type=int, default=None,
                   help="gpt2: fewer new tokens for the uncached run (its cost per token grows with length, so a "
                        "shorter run overstates its tokens/s)")
    p.add_argument("--runs", type=int, default=3, help="timed generate calls per variant, round-robin (median)")
    p.add_argument("--uncached-runs", type=int, default=1, help="gpt2: timed calls of the (slow) uncached variant")
    p.add_argument("--no-hf", action="store_true", help="gpt2: without the Hugging Face baseline")
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    print(f"device: {device_name(args.device)}\n| batch | variant | dtype | new tokens | tokens/s |\n|---|---|---|---|---|",
          flush=True)
    tokens, memory = None, ()
    if args.model == "gpt2":
        variants, vocab = gpt2_variants(args.device, args.new_tokens, args.uncached_new_tokens or args.new_tokens,
                                        not args.no_hf)
        desc = "GPT-2 small shape (124.4M parameters, random weights)"
    else:
        try:
            hf = hf_llama(args.device)
        except ImportError:
            p.error("--model llama needs transformers (pip install transformers)")
        variants, vocab = llama_variants(hf, args.device, args.dtypes, args.new_tokens), LLAMA_SHAPE["vocab_size"]
        desc = (f"Llama shape ({count_parameters(hf) / 1e6:.1f}M parameters: {LLAMA_SHAPE}, random weights, "
                "converted with DecoderLM.from_hf)")
    rows = run(variants, args.device, args.batch_sizes, args.prompt_len, vocab, args.runs, args.uncached_runs)
    if args.model == "llama":
        tokens = same_tokens(hf, args.device, args.batch_sizes, args.prompt_len, args.new_tokens)
        memory = load_memory(hf, [d for d in args.dtypes if d != "int8"]) if sys.platform == "linux" else ()
        print(markdown([], args.device, "", desc, args.prompt_len, args.runs, tokens, memory), flush=True)
    if args.record:
        with open(args.record, "w") as f:
            f.write("# Generation benchmark\n\n" + markdown(rows, args.device, " ".join(["python"] + sys.argv), desc,
                                                           args.prompt_len, args.runs, tokens, memory))


if __name__ == "__main__":
    main()
