#pragma once
// masked_softmax: out = softmax(scale * scores + mask) over the last dim of scores [..., Lk], shared by the CPU and
// CUDA glue. A bool mask (True = keep) removes entries instead of being added; a float mask has scores' dtype.
// Masks broadcast against scores and are read in place through the strides of an expanded view (stride 0 on
// broadcast dims). `causal` keeps key j of row i (of the last two dims [Lq, Lk]) when j <= i + Lk - Lq.
// A row with no visible entry (all removed, or all -inf) is written as zeros.
//
// How the glue reads the arguments (see csrc/cpu/masked_softmax.cpp):
//   at::Tensor m = check_masked_softmax_args(scores, mask, scale, causal);   // [*scores.shape] view, or undefined
//   MaskLayout ml = mask_layout(m);              // row r = r-th row of scores.view(-1, Lk), row-major
//   const mask_t* mrow = m.const_data_ptr<mask_t>() + mask_row_offset(ml, r);  // element j at mrow[j * ml.col_stride]
//   int64_t n = causal ? causal_cols(r, Lq, Lk) : Lk;                        // columns [0, n) may be visible
#include "common.h"
#include "masked_softmax_params.h"

#include <c10/util/SmallVector.h>
#include <cmath>

namespace pytransformer {

// Validates the arguments (ValueError naming the argument) and returns the mask expanded to scores' shape as a view
// (no copy; broadcast dims have stride 0), or an undefined tensor when there is no mask.
inline at::Tensor check_masked_softmax_args(const at::Tensor& scores, const std::optional<at::Tensor>& mask,
                                            double scale, bool causal) {
  check_float_dtype(scores, "scores");
  TORCH_CHECK_VALUE(scores.dim() >= 1, "scores: expected a tensor of shape [..., Lk], got a 0-d tensor");
  TORCH_CHECK_VALUE(!causal || scores.dim() >= 2, "scores: causal=True needs shape [..., Lq, Lk], got shape ",
                    scores.sizes());
  TORCH_CHECK_VALUE(std::isfinite(scale), "scale: expected a finite value, got ", scale);
  if (!mask) return at::Tensor();
  TORCH_CHECK_VALUE(mask->device() == scores.device(), "mask: expected a tensor on ", scores.device(),
                    " like scores, got one on ", mask->device());
  TORCH_CHECK_VALUE(mask->scalar_type() == at::kBool || mask->scalar_type() == scores.scalar_type(),
                    "mask: expected a bool mask or a float mask of dtype ", scores.scalar_type(),
                    " like scores, got ", mask->scalar_type());
  bool broadcastable = mask->dim() <= scores.dim();
  for (int64_t d = 1; broadcastable && d <= mask->dim(); ++d)
    broadcastable = mask->size(-d) == 1 || mask->size(-d) == scores.size(-d);
  TORCH_CHECK_VALUE(broadcastable, "mask: shape ", mask->sizes(), " is not broadcastable to scores' shape ",
                    scores.sizes());
  return mask->expand(scores.sizes());
}

// The layout of `mask` (the result of check_masked_softmax_args, or undefined: an empty layout). In the unlikely
// case that the leading dims do not coalesce into kMaxDims, `mask` is replaced by a contiguous copy.
inline MaskLayout mask_layout(at::Tensor& mask) {
  MaskLayout ml;
  if (!mask.defined()) return ml;
  const int64_t lead = mask.dim() - 1;
  ml.col_stride = mask.size(-1) == 1 ? 0 : mask.stride(-1);
  c10::SmallVector<int64_t, 8> sizes, strides;  // coalesced dims, innermost first
  for (int64_t d = lead - 1; d >= 0; --d) {
    if (mask.size(d) == 1) continue;
    if (!sizes.empty() && mask.stride(d) == strides.back() * sizes.back()) {
      sizes.back() *= mask.size(d);
    } else {
      sizes.push_back(mask.size(d)), strides.push_back(mask.stride(d));
    }
  }
  const int n = static_cast<int>(sizes.size());
  if (n > MaskLayout::kMaxDims) {
    mask = mask.contiguous();
    return mask_layout(mask);
  }
  ml.ndim = n;
  for (int d = 0; d < n; ++d) ml.sizes[d] = sizes[n - 1 - d], ml.strides[d] = strides[n - 1 - d];
  return ml;
}

// What the masked_softmax kernels read and write (no tensors). scores, out, grad_out, grad_scores: [rows, Lk]
// contiguous in `dtype`; lq: scores' second-to-last dim when causal, else 0; mask: nullptr, or the mask expanded to
// scores' shape (check_masked_softmax_args), bool or `dtype`, read through `mask_layout`.
struct MaskedSoftmaxFwdParams {
  at::ScalarType dtype;
  int64_t rows, lk, lq;
  double scale;
  const void* scores;
  const void* mask;
  bool mask_is_bool;
  MaskLayout mask_layout;
  void* out;
};

struct MaskedSoftmaxBwdParams {
  at::ScalarType dtype;
  int64_t rows, lk;
  double scale;
  const void *grad_out, *out;
  void* grad_scores;
};

inline void check_masked_softmax_backward_args(const at::Tensor& grad_out, const at::Tensor& out, double scale) {
  check_float_dtype(out, "out");
  check_like(grad_out, "grad_out", out, "out");
  TORCH_CHECK_VALUE(grad_out.sizes() == out.sizes(), "grad_out: expected shape ", out.sizes(), " like out, got ",
                    grad_out.sizes());
  TORCH_CHECK_VALUE(std::isfinite(scale), "scale: expected a finite value, got ", scale);
}

}  // namespace pytransformer
