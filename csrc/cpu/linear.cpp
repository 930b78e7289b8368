// CPU glue of linear: argument checks, then per call by the number of rows of x either the weight-streaming kernel of
// the best ISA level (linear_kernel.cpp) or ATen's GEMM, and registration.
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>

#include <vector>

#include "../linear.h"
#include "isa.h"

namespace pytransformer::cpu {
KernelTable<LinearGemvCpuFn> linear_gemv_kernel;

namespace {
// The most rows of x a call of the float32 and float16 kernel takes: more go by in calls of this many rows.
constexpr int64_t kRowBlock = 32;
// float32 x in rows of more than kLongK features goes to ATen's GEMM above kLongKRows rows (see use_gemv).
constexpr int64_t kLongK = 6144, kLongKRows = 128;

// Whether `rows` rows of x of `in_features` take the weight-streaming kernel (decoding), by dtype; more rows (prefill)
// go to ATen's GEMM. Measured on an AVX-512 EPYC with AVX-512 BF16, weights cycled from memory
// (benchmarks/bench_linear.py has the crossover rows). float32: every row count (but long rows, below), up to kRowBlock
// rows a call. The kernel took 0.6-0.7x the time of ATen's GEMM at every row count tried, 1 to 512, in one call; in
// calls of 32 rows, 2 threads, Zen 5 (where ATen's float32 GEMM reaches 40-44% of the FMA peak), the weight cached
// across calls as a forward's rows have it, 128-4096 rows of x: GPT-2's layers and LM head 0.48-0.89x its time (2048 x
// 3072 x 768: 28.6-29.8 ms against 53.7-56.1), 1024 rows of 4096 x 4096 0.89x, 512 of 11008 x 4096 0.85x; in calls of
// 16 rows 0.61-1.09x. Except for long rows: with more than kLongK features, 32 rows of x (over 768 KiB) no longer stay
// in L2 beside the weights, and from about a hundred rows ATen's GEMM is as fast or faster (2 threads, Zen 5, one
// weight reused, N 4096, median of 5, ours / ATen, over two states of the host whose GEMM speed differed by up to 30%:
// K 7168 128 rows 0.90x, 512 0.95x, 1024 1.01x; K 8192 128 rows 0.73-0.95x, 192 1.01-1.04x, 384 0.95-1.10x, 1024 1.04x;
// K 11008 128 rows 0.77-1.04x, 192 1.08x, 256 0.97-1.14x, 512 1.07x, 1024 1.14x, 4096 1.16x; N 1024 K 11008 1024 rows
// 1.12x; at K 6144 and below 0.85-0.97x at 128-8192 rows), so there float32 takes the kernel up to kLongKRows rows.
// float16: the kernel at every row count (ATen's float16 GEMM was 4-7x slower still; 512 rows of 4096 x 11008 3.7x).
// bfloat16 with AVX-512 BF16 dot products (has_avx512_bf16): up to 8 rows always (one pass over 2 weight rows at a
// time), then up to 28 while x is at most 64 KiB in rows of at most 4 KiB (K <= 2048). 2 threads, in turns with
// F.linear: 12-16 rows at K 2048 0.71-0.89x its time, 16-21 rows at K 1536 0.80-0.83x, 24-28 rows at K 768-1024
// 0.76-0.91x; 10 rows at K 3072 (60 KiB, rows of 6 KiB) 1.05-1.08x. 32 rows depend on the memory bandwidth (the kernel
// streams the weights, the GEMM computes): at K 768-1024 0.83-0.96x at 77 GB/s, 1.02-1.18x at 45 GB/s. Widening
// bfloat16 instead, it was as fast from 2 rows and slower from 4: 2 rows.
bool use_gemv(at::ScalarType dtype, int64_t rows, int64_t in_features) {
  if (dtype == at::kFloat) return in_features <= kLongK || rows <= kLongKRows;
  if (dtype != at::kBFloat16) return true;
  if (!has_avx512_bf16()) return rows <= 2;
  return rows <= 8 || (rows <= 28 && in_features <= 2048 && rows * in_features * 2 <= (int64_t(64) << 10));
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const LinearParams p = check_linear_args(x, weight, bias);
  // float64 (gradcheck) and many rows: ATen, which also takes non-contiguous x and weight as they are.
  if (x.scalar_type() == at::kDouble || !use_gemv(x.scalar_type(), p.rows, p.in_features))
    return at::linear(x, weight, bias);
  // The kernel takes contiguous arrays in x's dtype (a non-contiguous weight is copied).
  const at::Tensor x2 = x.reshape({p.rows, p.in_features}).contiguous();  // [M, K]
  const at::Tensor w = weight.contiguous();                              // [N, K]
  const at::Tensor b = bias ? bias->contiguous() : at::Tensor();         // [N] or undefined
  at::Tensor out = at::empty({p.rows, p.out_features}, x2.options());    // [M, N]
  const auto* xp = static_cast<const char*>(x2.const_data_ptr());
  auto* op = static_cast<char*>(out.mutable_data_ptr());
  if (out.numel() > 0)
    for_row_blocks(p.rows, kRowBlock, [&](int64_t m0, int64_t mb) {  // rows [m0, m0 + mb) of x and out
      linear_gemv_kernel.get()({mb, p.out_features, p.in_features}, x.scalar_type(),
                               xp + m0 * p.in_features * x2.element_size(), w.const_data_ptr(),
                               b.defined() ? b.const_data_ptr() : nullptr,
                               op + m0 * p.out_features * out.element_size());
    });
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = p.out_features;
  return out.view(shape);
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) { m.impl("linear", &linear_cpu); }

}  // namespace pytransformer::cpu
