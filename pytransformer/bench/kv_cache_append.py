"""kv_cache_append vs a sliced copy_ of the new rows into the caches."""
import torch

from .. import ops
from . import Row, interleaved_median_times, script_main

# (B, Hkv, T, D): a 2048-token prefill (the CUDA acceptance case in bfloat16) and one decode step.
APPEND_CASES = [(8, 8, 2048, 128), (8, 8, 1, 128)]


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


def bench(report, device, dtype=torch.float32, cases=APPEND_CASES, runs=30):
    for case in cases:
        bench_append(report, case, dtype, device, runs)


def main(argv=None):
    script_main(__doc__, "kv_cache_append benchmark", bench, argv)
