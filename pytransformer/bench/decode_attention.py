"""decode_attention vs F.scaled_dot_product_attention at one query per row: the decoding step of GPT-2 small and of a
Llama-style ~124M model (GQA 12:3) at batch 1 and 8 over 256 cached tokens, and long caches of larger models.

Decoding reads the whole visible KV cache of every layer once per token, after the layers' weights have passed through
the CPU's caches, so on the CPU each case cycles through copies of its caches that together exceed the last-level
cache many times (COLD_BYTES), and both ops read them from memory; the anchor is SDPA with enable_gqa=True on the same
caches. "Of ceiling" there holds our time to the bandwidth of PyTorch's own read of the same bytes (a sum of the
keys and values of a copy), timed in turns with the two ops, so that the bandwidth a shared host gives at that moment
is in both. On a GPU (one copy, its cache is small) the anchor is the faster of SDPA with enable_gqa=True and SDPA on
K/V already expanded to every query head (the expansion done outside the timing), against the copy bandwidth."""
import itertools

import torch
import torch.nn.functional as F

from .. import ops
from . import COLD_BYTES, Row, cold_copies, interleaved_median_times, script_main

# (name, B, Hq, Hkv, cache length, D)
DECODE_CASES = [("gpt2", 1, 12, 12, 256, 64), ("gpt2", 8, 12, 12, 256, 64), ("llama124m", 1, 12, 3, 256, 64),
                ("llama124m", 8, 12, 3, 256, 64), ("gqa", 1, 32, 8, 4096, 128), ("gqa", 8, 32, 8, 1024, 128),
                ("mha", 1, 32, 32, 4096, 128), ("gqa", 1, 32, 8, 16384, 128)]
# On CUDA also the acceptance case of the CUDA kernel: B=8, Hq=32, Hkv=8, an 8192-token cache (bfloat16 run).
CUDA_DECODE_CASES = [("gqa", 8, 32, 8, 8192, 128)]


def bench_decode(report, case, dtype, device, runs=30, cold_bytes=COLD_BYTES):
    """One query per row over caches of `length` tokens, each op cycling through cache copies spanning `cold_bytes`
    (0: one copy); bytes = the K and V cache bytes read."""
    name, b, hq, hkv, length, d = case
    q = torch.randn(b, hq, 1, d, dtype=dtype, device=device)
    pairs = cold_copies((2, b, hkv, length, d), dtype, device, cold_bytes)  # each copy: its K and V
    lengths = torch.full((b,), length, dtype=torch.int32, device=device)
    # SDPA starts half way round the cycle and the read anchor a quarter: each reads a copy the others have not just
    # read (for a single copy, there is nothing to offset).
    half, quarter = len(pairs) // 2, len(pairs) // 4
    ours = itertools.cycle([lambda c=c: ops.decode_attention(q, c[0], c[1], lengths) for c in pairs])
    gqa = itertools.cycle([lambda c=c: F.scaled_dot_product_attention(q, c[0], c[1], enable_gqa=True)
                           for c in pairs[half:] + pairs[:half]])
    fns = [lambda: next(ours)(), lambda: next(gqa)()]
    if cold_bytes:
        read = itertools.cycle([lambda c=c: c.sum() for c in pairs[quarter:] + pairs[:quarter]])
        fns.append(lambda: next(read)())
    else:
        k_all, v_all = (t.repeat_interleave(hq // hkv, 1) for t in pairs[0])
        fns.append(lambda: F.scaled_dot_product_attention(q, k_all, v_all))
    with torch.no_grad():
        t_ours, t_gqa, t_third = interleaved_median_times(fns, device, runs)
    nbytes = pairs[0].numel() * pairs[0].element_size()
    report.add(Row("decode_attention", f"{name} B{b} Hq{hq} Hkv{hkv} L{length} D{d} {str(dtype)[6:]}", t_ours,
                   t_gqa if cold_bytes else min(t_gqa, t_third), bytes=nbytes, variant=f"Hq/Hkv={hq // hkv}",
                   ceiling_bytes_s=nbytes / t_third if cold_bytes else 0.0))


def bench(report, device, dtype=torch.float32, cases=None, runs=30, cold_bytes=None):
    """Every case (default DECODE_CASES, and CUDA_DECODE_CASES on a GPU); caches cycle through `cold_bytes` (default
    COLD_BYTES on the CPU, one copy on a GPU, whose cache is small)."""
    if cases is None:
        cases = DECODE_CASES + (CUDA_DECODE_CASES if torch.device(device).type == "cuda" else [])
    if cold_bytes is None:
        cold_bytes = COLD_BYTES if torch.device(device).type == "cpu" else 0
    if cold_bytes:
        report.notes.append(f"decode_attention, of ceiling: of a PyTorch sum over the same cache bytes, timed in turns "
                            f"with the case (each cycles through cache copies spanning {cold_bytes >> 20} MiB)")
    for case in cases:
        bench_decode(report, case, dtype, device, runs, cold_bytes)


def main(argv=None):
    script_main(__doc__, "decode_attention benchmark", bench, argv)
