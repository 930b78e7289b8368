"""decode_attention vs F.scaled_dot_product_attention: the faster of SDPA on K/V already expanded to all query heads
(the repeat_interleave done outside the timing) and SDPA with enable_gqa=True on the cache itself."""
import torch
import torch.nn.functional as F

from .. import ops
from . import Row, interleaved_median_times, script_main

# (B, Hq, Hkv, cache length, D): the first is the acceptance case (one query over a 4096-token cache).
DECODE_CASES = [(1, 32, 8, 4096, 128), (8, 32, 8, 1024, 128), (1, 32, 32, 4096, 128), (1, 32, 8, 16384, 128)]
# On CUDA also the acceptance case of the CUDA kernel: B=8, Hq=32, Hkv=8, an 8192-token cache (bfloat16 run).
CUDA_DECODE_CASES = [(8, 32, 8, 8192, 128)]


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


def bench(report, device, dtype=torch.float32, cases=None, runs=30):
    if cases is None:
        cases = DECODE_CASES + (CUDA_DECODE_CASES if torch.device(device).type == "cuda" else [])
    for case in cases:
        bench_decode(report, case, dtype, device, runs)


def main(argv=None):
    script_main(__doc__, "decode_attention benchmark", bench, argv)
