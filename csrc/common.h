#pragma once
// Argument checks shared by every op's CPU and CUDA glue. Errors are ValueError (TORCH_CHECK_VALUE) naming the
// argument and what was expected, so that bad input never reaches a kernel.
#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <optional>
#include <sstream>
#include <vector>

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

// `t` must have the sizes `expected` (-1: any), named by `dims` (e.g. "[B, Hkv, T, D]") in the message:
// "k_new: expected [B, Hkv, T, D] = [2, 4, *, 64], got [2, 4, 3, 32]".
// The message is formatted only on a mismatch: the decode ops check several tensors a call, every generated token.
inline void check_sizes(const at::Tensor& t, const char* name, const char* dims, std::vector<int64_t> expected) {
  check_dim(t, name, static_cast<int64_t>(expected.size()), dims);
  bool ok = true;
  for (size_t i = 0; i < expected.size(); ++i) ok = ok && (expected[i] < 0 || expected[i] == t.size(i));
  if (ok) return;
  std::ostringstream want;
  want << "[";
  for (size_t i = 0; i < expected.size(); ++i) {
    want << (i ? ", " : "");
    if (expected[i] < 0) want << "*"; else want << expected[i];
  }
  want << "]";
  TORCH_CHECK_VALUE(false, name, ": expected ", dims, " = ", want.str(), ", got ", t.sizes());
}

inline void check_index_vector(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
                               int64_t batch) {
  TORCH_CHECK_VALUE(at::isIntegralType(t.scalar_type(), /*includeBool=*/false), name,
                    ": expected an integer tensor [B], got dtype ", t.scalar_type());
  check_like(t, name, ref, ref_name, /*same_dtype=*/false);
  check_sizes(t, name, "[B]", {batch});
}

// Whether a and b share memory (as far as ATen can tell: strided views of one storage may go undetected).
inline bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  const auto status = at::get_overlap_status(a, b);
  return status == at::MemOverlapStatus::Full || status == at::MemOverlapStatus::Partial;
}

template <size_t N>
void copy_strides(const at::Tensor& t, int64_t (&out)[N]) {
  for (size_t i = 0; i < N; ++i) out[i] = t.stride(i);
}

}  // namespace pytransformer
