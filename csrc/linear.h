#pragma once
// linear: out [..., N] = x [..., K] @ weight [N, K]^T + bias [N], the math of F.linear. Argument checks shared by the
// CPU and CUDA glue, and the CPU kernel's signature.
#include "common.h"

#include <c10/util/accumulate.h>

namespace pytransformer {

struct LinearParams {
  int64_t rows, out_features, in_features;  // M (x's leading dims flattened), N, K
};

// The CPU kernel (csrc/cpu/linear_kernel.cpp): out [M, N] = x [M, K] @ weight [N, K]^T + bias [N] (bias may be
// nullptr), every array contiguous and of `dtype`: float32, bfloat16 or float16 (accumulated in float32).
using LinearCpuFn = void (*)(const LinearParams& p, at::ScalarType dtype, const void* x, const void* weight,
                                 const void* bias, void* out);

inline LinearParams check_linear_args(const at::Tensor& x, const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias) {
  check_float_dtype(x, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected a tensor [..., K], got a 0-d tensor");
  const int64_t K = x.size(-1);
  check_like(weight, "weight", x, "x");
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == K, "weight: expected [N, K] with K = ", K,
                    " (the last dim of x), got shape ", weight.sizes());
  const int64_t N = weight.size(0);
  if (bias) {
    check_like(*bias, "bias", x, "x");
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == N, "bias: expected shape [N] = [", N,
                      "] (the rows of weight), got ", bias->sizes());
  }
  return {c10::multiply_integers(x.sizes().slice(0, x.dim() - 1)), N, K};
}

}  // namespace pytransformer
