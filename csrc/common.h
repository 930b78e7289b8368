#pragma once
// Argument checks shared by every op's CPU and CUDA glue. Errors are ValueError (TORCH_CHECK_VALUE) naming the
// argument and what was expected, so that bad input never reaches a kernel.
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <optional>

namespace pytransformer {

constexpr int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

inline void check_float_dtype(const at::Tensor& t, const char* name) {
  auto s = t.scalar_type();
  TORCH_CHECK_VALUE(s == at::kFloat || s == at::kHalf || s == at::kBFloat16 || s == at::kDouble, name,
                    ": expected a float32, float16, bfloat16 or float64 tensor, got ", s);
  TORCH_CHECK_VALUE(!(s == at::kDouble && t.is_cuda()), name, ": float64 is supported on the CPU only");
}

inline void check_dim(const at::Tensor& t, const char* name, int64_t dim, const char* shape) {
  TORCH_CHECK_VALUE(t.dim() == dim, name, ": expected a ", dim, "-d tensor ", shape, ", got shape ", t.sizes());
}

// `t` must sit on `ref`'s device (and, for floating tensors, have its dtype when `same_dtype`).
inline void check_like(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
                       bool same_dtype = true) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), name, ": expected a tensor on ", ref.device(), " like ", ref_name,
                    ", got one on ", t.device());
  TORCH_CHECK_VALUE(!same_dtype || t.scalar_type() == ref.scalar_type(), name, ": expected dtype ",
                    ref.scalar_type(), " like ", ref_name, ", got ", t.scalar_type());
}

// An optional per-feature vector (norm weight or bias) of shape [n] like `x`.
inline void check_feature_vector(const std::optional<at::Tensor>& t, const char* name, const at::Tensor& x) {
  if (!t) return;
  check_like(*t, name, x, "x");
  TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == x.size(-1), name, ": expected shape [", x.size(-1),
                    "] (the last dim of x), got ", t->sizes());
}

}  // namespace pytransformer
