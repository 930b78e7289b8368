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
// go to ATen's GEMM, from the row count where the GEMM measured as fast (an AVX-512 EPYC with AVX-512 BF16;
// benchmarks/bench_linear.py has the crossover rows, benchmarks/results/cpu_kernel_notes_2026-11-28.md, use_gemv, the
// measurements):
// - float32: every row count, up to kRowBlock rows a call (the kernel is faster than ATen's GEMM even with the weight
//   cached across calls), except for rows of more than kLongK features: there 32 rows of x no longer stay in L2 beside
//   the weights, and above kLongKRows rows ATen's GEMM is as fast or faster;
// - float16: every row count (ATen's float16 GEMM is several times slower still);
// - bfloat16 with AVX-512 BF16 dot products (has_avx512_bf16): up to 8 rows always (one pass over 2 weight rows at a
//   time), then up to 28 while x is at most 64 KiB in rows of at most 4 KiB (K <= 2048); widening bfloat16 instead,
//   up to 2 rows.
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
