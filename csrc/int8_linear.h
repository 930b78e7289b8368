#pragma once
// int8_linear: out [..., N] = (x [..., K] @ weight^T) * scale + bias with an int8 weight [N, K] and per-output-channel
// float scales [N] (weight-only quantization: activations stay floating point). Argument checks shared by the glue.
#include "common.h"

#include <c10/util/accumulate.h>

namespace pytransformer {

struct Int8LinearParams {
  int64_t rows, out_features, in_features;  // M (x's leading dims flattened), N, K
};

// The CPU kernels (csrc/cpu/int8_linear_kernel.cpp) compute in the accumulation type `acc` (float32, float64 for
// float64 x); every array is contiguous. Few rows: out [M, N] = (x [M, K] @ weight^T) * scale [N] + bias [N] (bias may
// be nullptr). Many rows: deq [n, K] = weight[:n] * scale[:n, None], a block of dequantized weight rows for a GEMM.
using Int8GemvCpuFn = void (*)(const Int8LinearParams& p, at::ScalarType acc, const void* x, const int8_t* weight,
                               const void* scale, const void* bias, void* out);
using Int8DequantizeCpuFn = void (*)(at::ScalarType acc, int64_t n, int64_t in_features, const int8_t* weight,
                                     const void* scale, void* deq);

inline Int8LinearParams check_int8_linear_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                                               const std::optional<at::Tensor>& bias) {
  check_float_dtype(x, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected a tensor [..., K], got a 0-d tensor");
  const int64_t K = x.size(-1);
  check_like(weight, "weight", x, "x", /*same_dtype=*/false);
  TORCH_CHECK_VALUE(weight.scalar_type() == at::kChar, "weight: expected an int8 tensor [N, K], got dtype ",
                    weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == K, "weight: expected int8 [N, K] with K = ", K,
                    " (the last dim of x), got shape ", weight.sizes());
  const int64_t N = weight.size(0);
  for (const auto& [t, name] : {std::pair{&scale, "scale"}, std::pair{bias ? &*bias : nullptr, "bias"}}) {
    if (!t) continue;
    check_float_dtype(*t, name);
    check_like(*t, name, x, "x", /*same_dtype=*/false);
    TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == N, name, ": expected shape [N] = [", N,
                      "] (the rows of weight), got ", t->sizes());
  }
  return {c10::multiply_integers(x.sizes().slice(0, x.dim() - 1)), N, K};
}

}  // namespace pytransformer
