"""Every op against its PyTorch counterpart in one report (what `python -m pytransformer bench` runs), at the sizes of
the per-family benchmark scripts; `quick` uses tiny sizes (a smoke test of the whole pipeline)."""
import torch

from . import (Report, attention, decode_attention, int8_linear, kv_cache_append, linear, masked_softmax,
               matmul_ceiling, new_report, norm)

FAMILIES = ("norm", "masked_softmax", "attention", "decode_attention", "kv_cache_append", "int8_linear", "linear")
# A CPU forward+backward at L=4096 takes about 10 s a call on two cores: the CPU run stops at L=1024.
CPU_MAX_ATTENTION_LENGTH = 1024


def run(device, dtype=torch.float32, families=FAMILIES, runs: int | None = None, quick: bool = False) -> Report:
    """Benchmark the op families on `device`; rows are printed as they come and collected in the returned report."""
    report = new_report(device, nbytes=1 << 20 if quick else 1 << 30)
    report.ceiling_flops_s = matmul_ceiling(device, dtype, n=256 if quick else 2048)
    print(f"matmul ceiling ({str(dtype)[6:]}): {report.ceiling_flops_s / 1e9:.1f} GFLOP/s", flush=True)
    cpu = torch.device(device).type == "cpu"

    def n(default):
        return runs or (2 if quick else default)
    if "norm" in families:
        norm.bench(report, device, dtype, shapes=[(64, 128)] if quick else norm.SHAPES, runs=n(30))
    if "masked_softmax" in families:
        masked_softmax.bench(report, device, dtype, shapes=[(1, 2, 16, 16)] if quick else masked_softmax.SHAPES,
                             runs=n(20))
    if "attention" in families:
        lengths = (16,) if quick else tuple(length for length in attention.LENGTHS
                                            if not cpu or length <= CPU_MAX_ATTENTION_LENGTH)
        attention.bench_attention(report, device, dtype, lengths=lengths, runs=n(10 if cpu else 20))
    if "decode_attention" in families:
        decode_attention.bench(report, device, dtype, cases=[("tiny", 1, 4, 2, 32, 16)] if quick else None,
                               runs=n(30), cold_bytes=0 if quick else None)
    if "kv_cache_append" in families:
        kv_cache_append.bench(report, device, dtype, cases=[(1, 2, 4, 16)] if quick else kv_cache_append.APPEND_CASES,
                              runs=n(30))
    if "int8_linear" in families:
        int8_linear.bench(report, device, cases=[(1, 64, 32, dtype)] if quick else int8_linear.OP_CASES, runs=n(20))
    if "linear" in families:
        if quick:
            tiny = ("tiny", "layer", 64, 32)
            linear.bench(report, device, shapes=[tiny], crossovers=[(tiny, ("float32", "bfloat16"), (17,))],
                         runs=n(15), cold_bytes=0)
        else:
            linear.bench(report, device, runs=n(15))
    return report
