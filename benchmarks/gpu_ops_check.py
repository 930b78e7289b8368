"""CUDA check of the row kernels on shapes chosen to reach every path (pack/scalar loads, sub-warp, warp and block row
groups, rows streamed from memory, misaligned rows, masks of every kind, causal rows with nothing visible) and of
int8_linear (GEMV rows per block, split-K, tiled GEMM, 16-byte and byte weight loads), against float64 references.
Outputs are allocated over freed NaN-filled memory so unwritten elements show up as NaN.

Used by benchmarks/gpu_check.sh, also under compute-sanitizer (--quick). Exit code 1 if any case fails.
"""
import argparse
import sys

import torch

import pytransformer  # noqa: F401  registers torch.ops.pytransformer
from pytransformer.ops import reference

ops = torch.ops.pytransformer
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Relative error ||out - ref|| / ||ref|| allowed per dtype.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# Error of a float32 sum allowed relative to the magnitude of its terms.
SUM_TOL = 1e-6

# [rows, n]: n reaches each geometry of common.cuh for float32 (4-element packs) and 16-bit types (8-element packs):
# 1..32 threads a row, block rows (64..512 threads), streaming (> 512 threads' worth), and odd n (scalar loads).
NORM_SHAPES = [(1, 1), (5, 3), (7, 8), (33, 64), (300, 100), (64, 768), (600, 1000), (40, 1001), (16, 4096),
               (9, 5120), (3, 8196), (4, 16384), (3, 16388), (2, 32776), (2, 40001)]
NORM_SHAPES_QUICK = [(5, 3), (33, 64), (40, 1001), (16, 4096), (3, 8196), (2, 32776), (2, 40001)]
# [B, H, Lq, Lk]
SOFTMAX_SHAPES = [(1, 1, 1, 1), (2, 3, 5, 7), (2, 2, 16, 64), (1, 2, 33, 77), (2, 1, 8, 1000), (1, 1, 4, 4096),
                  (1, 1, 3, 8192), (1, 1, 3, 8196), (1, 1, 2, 16388), (1, 1, 2, 10001)]
SOFTMAX_SHAPES_QUICK = [(2, 3, 5, 7), (1, 2, 33, 77), (1, 1, 4, 4096), (1, 1, 2, 16388), (1, 1, 2, 10001)]
# int8_linear (M, K, N): M reaches each rows-per-block of the GEMV (1, 4, 16) and the tiled GEMM (M > 64); K = 16 and
# 4096 take 16-byte weight loads (4096: several K slices), K = 1, 15 and 4104 byte loads with a tail.
INT8_SHAPES = [(m, k, n) for m in (1, 3, 64, 200) for k in (1, 15, 16, 4096, 4104) for n in (1, 7, 512)]
INT8_SHAPES_QUICK = [(1, 4104, 512), (3, 15, 7), (1, 1, 1), (64, 16, 512), (16, 4096, 7), (200, 100, 130)]

failures = []


def poison(like: torch.Tensor, count: int = 4) -> None:
    """Leave freed blocks of the caching allocator filled with 0xff bytes (NaN as float32, float16 and bfloat16), so
    that outputs allocated next start as NaN."""
    bufs = [torch.full((like.numel() * 4 + 256,), 255, dtype=torch.uint8, device=like.device) for _ in range(count)]
    del bufs


def rel_err(out: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor | None = None) -> float:
    """||out - ref|| / ||magnitude|| (default: ref)."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if out.shape != ref.shape:
        return float("inf")
    if out.isnan().any() and not ref.isnan().any():
        return float("nan")
    magnitude = ref if magnitude is None else magnitude.double().cpu()
    return ((out - ref).norm() / magnitude.norm().clamp_min(1e-30)).item()


def check(name: str, out: torch.Tensor, ref: torch.Tensor, dtype, terms: torch.Tensor | None = None) -> None:
    """Passes within TOL[dtype] of ref, or, for sums given the sum of their terms' magnitudes `terms`, within float32
    rounding of those (a sum may cancel to far below its terms: one dot product of 4096 terms has no other outputs to
    average that out)."""
    err = rel_err(out, ref)
    ok = err <= TOL[dtype] or (terms is not None and rel_err(out, ref, terms) <= SUM_TOL)  # NaN fails
    print(f"{'ok  ' if ok else 'FAIL'} {name:70s} rel err {err:.2e}", flush=True)
    if not ok:
        failures.append(name)


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of t whose data starts one element past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    return out


def check_norms(shapes, dtypes, device) -> None:
    for rows, n in shapes:
        for dtype in dtypes:
            for variant in ("affine", "plain", "misaligned"):
                x64 = torch.randn(rows, n, dtype=torch.float64) * 3 + 1.5
                w64 = torch.randn(n, dtype=torch.float64) if variant != "plain" else None
                b64 = torch.randn(n, dtype=torch.float64) if variant != "plain" else None
                g64 = torch.randn(rows, n, dtype=torch.float64)
                to = (lambda t: None if t is None else t.to(device, dtype))  # noqa: E731
                x, w, b, g = to(x64), to(w64), to(b64), to(g64)
                if variant == "misaligned":
                    x, w, b, g = misaligned(x), misaligned(w), misaligned(b), misaligned(g)
                # float64 references of the values the kernel sees (inputs rounded to dtype)
                xr = x.double().cpu().requires_grad_()
                wr = None if w is None else w.double().cpu().requires_grad_()
                br = None if b is None else b.double().cpu().requires_grad_()
                gr = g.double().cpu()
                tag = f"[{rows}, {n}] {str(dtype)[6:]} {variant}"

                poison(x)
                y, mean, rstd = ops.layer_norm(x, w, b, 1e-5)
                ref = reference.layer_norm(xr, wr, br, 1e-5)
                check(f"layer_norm fwd {tag}", y, ref, dtype)
                check(f"layer_norm mean {tag}", mean, xr.detach().mean(-1), torch.float32)
                leaves = [t for t in (xr, wr, br) if t is not None]
                grads = torch.autograd.grad(ref, leaves, gr)
                poison(x)
                dx, dw, db = ops.layer_norm_backward(g, x, mean, rstd, w, b is not None)
                check(f"layer_norm bwd dx {tag}", dx, grads[0], dtype)
                if w is not None:
                    check(f"layer_norm bwd dw {tag}", dw, grads[1], dtype)
                    check(f"layer_norm bwd db {tag}", db, grads[2], dtype)

                poison(x)
                y, rstd = ops.rms_norm(x, w, 1e-6)
                ref = reference.rms_norm(xr, wr, 1e-6)
                check(f"rms_norm fwd {tag}", y, ref, dtype)
                leaves = [t for t in (xr, wr) if t is not None]
                grads = torch.autograd.grad(ref, leaves, gr)
                poison(x)
                dx, dw = ops.rms_norm_backward(g, x, rstd, w)
                if n > 1:  # n = 1: grad_x is eps-sized, 1 - xhat^2 cancels in any float32 evaluation
                    check(f"rms_norm bwd dx {tag}", dx, grads[0], dtype)
                if w is not None:
                    check(f"rms_norm bwd dw {tag}", dw, grads[1], dtype)


def masks(shape, dtype, device):
    """(name, mask) pairs: every mask kind and broadcast pattern."""
    b, h, lq, lk = shape
    keep = torch.rand(b, 1, lq, lk, device=device) > 0.3
    keep[..., 0, :] = False  # a fully removed row
    bias = torch.randn(b, h, lq, lk, device=device).to(dtype)
    bias[..., -1, : lk // 2] = float("-inf")
    return [
        ("none", None),
        ("bool [B,1,Lq,Lk]", keep),
        ("bool [Lk]", torch.rand(lk, device=device) > 0.5),
        ("bool [B,H,Lq,1]", torch.rand(b, h, lq, 1, device=device) > 0.2),
        ("bool transposed", (torch.rand(b, 1, lk, lq, device=device) > 0.3).transpose(-1, -2)),
        ("float [B,H,Lq,Lk]", bias),
        ("float [Lq,Lk]", torch.randn(lq, lk, device=device).to(dtype)),
    ]


def check_softmax(shapes, dtypes, device) -> None:
    for shape in shapes:
        for dtype in dtypes:
            for causal, lq_shift in ((False, 0), (True, 0), (True, 3)):
                # lq_shift > 0: more queries than keys, so the first causal rows see nothing
                b, h, lq, lk = shape
                lq += lq_shift
                for mask_name, mask in masks((b, h, lq, lk), dtype, device):
                    scores = (torch.randn(b, h, lq, lk, dtype=torch.float64) * 4).to(device, dtype)
                    scale = 0.7
                    tag = f"[{b}, {h}, {lq}, {lk}] {str(dtype)[6:]} causal={causal} mask={mask_name}"
                    mref = None if mask is None else (mask if mask.dtype == torch.bool else mask.double()).cpu()
                    ref = reference.masked_softmax(scores.double().cpu(), mref, scale=scale, causal=causal)
                    poison(scores)
                    out = ops.masked_softmax(scores, mask, scale, causal)
                    check(f"masked_softmax fwd {tag}", out, ref, dtype)
                    g = torch.randn_like(out)
                    o64, g64 = out.double().cpu(), g.double().cpu()
                    gref = scale * o64 * (g64 - (g64 * o64).sum(-1, keepdim=True))
                    poison(scores)
                    grad = ops.masked_softmax_backward(g, out, scale)
                    if gref.norm() > 0:
                        check(f"masked_softmax bwd {tag}", grad, gref, dtype)
                    elif grad.ne(0).any():
                        print(f"FAIL masked_softmax bwd {tag}: expected zeros", flush=True)
                        failures.append(tag)


def check_int8_linear(shapes, dtypes, device) -> None:
    for m, k, n in shapes:
        for dtype in dtypes:
            for variant in ("bias", "plain", "misaligned"):
                # "bias": scale and bias in x's dtype; "plain": no bias, a float32 scale; "misaligned": x, weight,
                # scale and a float32 bias each one element past a 16-byte boundary.
                x = torch.randn(m, k, dtype=torch.float64).to(device, dtype)
                weight = torch.randint(-128, 128, (n, k), dtype=torch.int8, device=device)
                sdtype = torch.float32 if variant == "plain" else dtype
                scale = (torch.rand(n, dtype=torch.float64) * 0.02 + 1e-3).to(device, sdtype)
                bias = None
                if variant != "plain":
                    bias = torch.randn(n, dtype=torch.float64).to(device, dtype if variant == "bias" else torch.float32)
                if variant == "misaligned":
                    x, weight, scale, bias = misaligned(x), misaligned(weight), misaligned(scale), misaligned(bias)
                x64, w64 = x.double().cpu(), weight.double().cpu() * scale.double().cpu()[:, None]
                b64 = torch.zeros(n, dtype=torch.float64) if bias is None else bias.double().cpu()
                ref = x64 @ w64.t() + b64  # [M, N]
                terms = x64.abs() @ w64.abs().t() + b64.abs()
                poison(x)
                out = ops.int8_linear(x, weight, scale, bias)
                check(f"int8_linear [M {m}, K {k}, N {n}] {str(dtype)[6:]} {variant}", out, ref, dtype, terms)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="fewer shapes and float32/bfloat16 only (for sanitizers)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    device = "cuda"
    dtypes = [torch.float32, torch.bfloat16] if args.quick else DTYPES
    check_norms(NORM_SHAPES_QUICK if args.quick else NORM_SHAPES, dtypes, device)
    if hasattr(ops, "masked_softmax"):
        check_softmax(SOFTMAX_SHAPES_QUICK if args.quick else SOFTMAX_SHAPES, dtypes, device)
    else:
        print("masked_softmax is not registered in this build: skipped")
    check_int8_linear(INT8_SHAPES_QUICK if args.quick else INT8_SHAPES, dtypes, device)
    torch.cuda.synchronize()
    print(f"\n{len(failures)} failures" + "".join(f"\n  {f}" for f in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
