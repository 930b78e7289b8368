"""KV-cache decoding: decode_attention vs F.scaled_dot_product_attention (the faster of SDPA on K/V already expanded
to all query heads, the repeat_interleave done outside the timing, and SDPA with enable_gqa=True on the cache itself),
and kv_cache_append vs a sliced copy_."""
import argparse
import sys

import torch
import torch.nn.functional as F

from .. import ops
from . import Row, interleaved_median_times, new_report, record

# (B, Hq, Hkv, cache length, D): the first is the acceptance case (one query over a 4096-token cache).
DECODE_CASES = [(1, 32, 8, 4096, 128), (8, 32, 8, 1024, 128), (1, 32, 32, 4096, 128), (1, 32, 8, 16384, 128)]
# On CUDA also the acceptance case of the CUDA kernel: B=8, Hq=32, Hkv=8, an 8192-token cache (bfloat16 run).
CUDA_DECODE_CASES = [(8, 32, 8, 8192, 128)]
# (B, Hkv, T, D): a 2048-token prefill (the CUDA acceptance case in bfloat16) and one decode step.
APPEND_CASES = [(8, 8, 2048, 128), (8, 8, 1, 128)]


def bench_decode(report, case, dtype, device, runs=30):
    """One query per row over full caches of `length` tokens; bytes = the K and V cache bytes read."""
    b, hq, hkv, length, d = case
    q = torch.randn(b, hq, 1, d, dtype=dtype, device=device)
    k, v = (torch.randn(b, hkv, length, d, dtype=dtype, device=device) for _ in range(2))
    lengths = torch.full((b,), length, dtype=torch.int32, device=device)
    k_all, v_all = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    with torch.no_grad():
        ours, expanded, gqa = interleaved_median_times([
            lambda: ops.decode_attention(q, k, v, lengths), lambda: F.scaled_dot_product_attention(q, k_all, v_all),
            lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)], device, runs)
    report.add(Row("decode_attention", f"B{b} Hq{hq} Hkv{hkv} L{length} D{d} {str(dtype)[6:]}", ours, min(expanded, gqa),
                   bytes=(k.numel() + v.numel()) * k.element_size(), variant=f"Hq/Hkv={hq // hkv}"))


def bench_append(report, case, dtype, device, runs=30):
    """Append T tokens at position 0 of caches with room for 2T; bytes = read + written."""
    b, hkv, t, d = case
    k_cache, v_cache = (torch.zeros(b, hkv, 2 * t, d, dtype=dtype, device=device) for _ in range(2))
    k_new, v_new = (torch.randn(b, hkv, t, d, dtype=dtype, device=device) for _ in range(2))
    positions = torch.zeros(b, dtype=torch.int32, device=device)

    def torch_copy():
        k_cache[:, :, :t].copy_(k_new)
        v_cache[:, :, :t].copy_(v_new)

    times = interleaved_median_times([lambda: ops.kv_cache_append(k_cache, v_cache, k_new, v_new, positions),
                                      torch_copy], device, runs)
    report.add(Row("kv_cache_append", f"B{b} Hkv{hkv} T{t} D{d} {str(dtype)[6:]}", *times,
                   bytes=2 * (k_new.numel() + v_new.numel()) * k_new.element_size()))


def bench(report, device, dtype=torch.float32, decode_cases=None, append_cases=APPEND_CASES, runs=30):
    if decode_cases is None:
        decode_cases = DECODE_CASES + (CUDA_DECODE_CASES if torch.device(device).type == "cuda" else [])
    for case in decode_cases:
        bench_decode(report, case, dtype, device, runs)
    for case in append_cases:
        bench_append(report, case, dtype, device, runs)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--record", help="write the table as markdown to this file")
    args = p.parse_args(argv)
    report = new_report(args.device)
    bench(report, args.device, getattr(torch, args.dtype), runs=args.runs)
    if args.record:
        record(report, args.record, "KV-cache decoding benchmark", sys.argv)
