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
// The most rows of x (decoding) that take the weight-streaming kernel, by dtype; more rows (prefill) go to ATen's GEMM.
// Measured on an AVX-512 EPYC with AVX-512 BF16, weights cycled from memory (benchmarks/bench_linear.py has the
// crossover rows). float32: the kernel took 0.6-0.7x the time of ATen's GEMM at every row count tried, 1 to 512, but it
// is not blocked for the caches along the rows of x, so prefill-sized inputs stay with the GEMM: 32 rows. float16: the
// same (ATen's float16 GEMM was 4-7x slower still). bfloat16: ATen's GEMM uses AVX-512 BF16 dot products; with them
// too (has_avx512_bf16) the kernel took 0.5-0.9x its time up to 8 rows (N 3072 K 768 and N 768 K 3072, weights from
// memory), while from 9 rows (weights in cache) it took as long as ATen's or 1.6x longer from one process to the next:
// 8 rows. Widening bfloat16 instead, it was as fast from 2 rows and slower from 4: 2 rows.
int64_t max_gemv_rows(at::ScalarType dtype) {
  if (dtype == at::kBFloat16) return has_avx512_bf16() ? 8 : 2;
  return 32;
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const LinearParams p = check_linear_args(x, weight, bias);
  // float64 (gradcheck) and many rows: ATen, which also takes non-contiguous x and weight as they are.
  if (x.scalar_type() == at::kDouble || p.rows > max_gemv_rows(x.scalar_type())) return at::linear(x, weight, bias);
  // The kernel takes contiguous arrays in x's dtype (a non-contiguous weight is copied).
  const at::Tensor x2 = x.reshape({p.rows, p.in_features}).contiguous();  // [M, K]
  const at::Tensor w = weight.contiguous();                              // [N, K]
  const at::Tensor b = bias ? bias->contiguous() : at::Tensor();         // [N] or undefined
  at::Tensor out = at::empty({p.rows, p.out_features}, x2.options());    // [M, N]
  if (out.numel() > 0)
    linear_gemv_kernel.get()(p, x.scalar_type(), x2.const_data_ptr(), w.const_data_ptr(),
                             b.defined() ? b.const_data_ptr() : nullptr, out.mutable_data_ptr());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = p.out_features;
  return out.view(shape);
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) { m.impl("linear", &linear_cpu); }

}  // namespace pytransformer::cpu
