#pragma once
// layer_norm and rms_norm: one kernel family, `center` selects LayerNorm (subtract the mean) or RMSNorm.
// Rows are the flattened leading dims of x [*, N]; statistics are saved per row in the accumulation type
// (float32, or float64 for float64 input) for the backward.
#include "common.h"

namespace pytransformer {

// What the norm kernels read and write (no tensors: pointers and sizes). x, y, grad_out, grad_x: [rows, n]
// contiguous in `dtype`; weight, bias, grad_weight, grad_bias: [n] in `dtype`, or nullptr (absent / not wanted);
// mean, rstd: [rows] in the accumulation type (float32, float64 for float64). `center`: LayerNorm (subtract the mean)
// or RMSNorm (mean is nullptr in the backward).
struct NormFwdParams {
  at::ScalarType dtype;
  int64_t rows, n;
  bool center;
  double eps;
  const void *x, *weight, *bias;
  void *y, *mean, *rstd;
};

struct NormBwdParams {
  at::ScalarType dtype;
  int64_t rows, n;
  bool center;
  const void *grad_out, *x, *mean, *rstd, *weight;
  void *grad_x, *grad_weight, *grad_bias;
};

// Checks the arguments and returns x as contiguous [rows, N].
inline at::Tensor check_norm_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                  const std::optional<at::Tensor>& bias, double eps) {
  check_float_dtype(x, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) > 0, "x: expected shape [..., N] with N >= 1, got ", x.sizes());
  check_feature_vector(weight, "weight", x);
  check_feature_vector(bias, "bias", x);
  TORCH_CHECK_VALUE(eps >= 0, "eps: expected a non-negative value, got ", eps);
  return x.contiguous().view({-1, x.size(-1)});
}

inline at::ScalarType stats_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// Saved statistics have x's leading shape.
inline at::Tensor empty_stats(const at::Tensor& x) {
  return x.new_empty(x.sizes().slice(0, x.dim() - 1), x.options().dtype(stats_dtype(x)));
}

// Saved statistics (mean or rstd): one value per row of x, in stats_dtype(x), on x's device.
inline void check_norm_stats(const at::Tensor& stats, const char* name, const at::Tensor& x) {
  check_like(stats, name, x, "x", /*same_dtype=*/false);
  TORCH_CHECK_VALUE(stats.scalar_type() == stats_dtype(x), name, ": expected dtype ", stats_dtype(x), ", got ",
                    stats.scalar_type());
  TORCH_CHECK_VALUE(stats.numel() * x.size(-1) == x.numel(), name, ": expected one value per row of x (shape ",
                    x.sizes().slice(0, x.dim() - 1), "), got shape ", stats.sizes());
}

// `mean` is checked when given (LayerNorm).
inline void check_norm_backward_args(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& rstd,
                                     const at::Tensor& mean = at::Tensor()) {
  check_like(grad_out, "grad_out", x, "x");
  TORCH_CHECK_VALUE(grad_out.sizes() == x.sizes(), "grad_out: expected shape ", x.sizes(), ", got ", grad_out.sizes());
  check_norm_stats(rstd, "rstd", x);
  if (mean.defined()) check_norm_stats(mean, "mean", x);
}

// Registers layer_norm, rms_norm and their backward ops for one device from its
//   forward(x, weight, bias, eps, center) -> (out, mean, rstd)
//   backward(grad_out, x, mean, rstd, weight, has_bias, center) -> (grad_x, grad_weight, grad_bias)
// (RMSNorm: center = false, no bias, and an undefined mean in the backward). Library is torch::Library: a parameter,
// so that the kernel units, which include this header, need not parse torch/library.h (the glue includes it).
template <auto forward, auto backward, class Library>
void register_norm_impls(Library& m) {
  using OptTensor = std::optional<at::Tensor>;
  m.impl("layer_norm", [](const at::Tensor& x, const OptTensor& w, const OptTensor& b, double eps) {
    return forward(x, w, b, eps, true);
  });
  m.impl("layer_norm_backward", [](const at::Tensor& g, const at::Tensor& x, const at::Tensor& mean,
                                   const at::Tensor& rstd, const OptTensor& w, bool has_bias) {
    return backward(g, x, mean, rstd, w, has_bias, true);
  });
  m.impl("rms_norm", [](const at::Tensor& x, const OptTensor& w, double eps) {
    auto [y, mean, rstd] = forward(x, w, std::nullopt, eps, false);
    return std::make_tuple(y, rstd);
  });
  m.impl("rms_norm_backward", [](const at::Tensor& g, const at::Tensor& x, const at::Tensor& rstd, const OptTensor& w) {
    auto [dx, dw, db] = backward(g, x, at::Tensor(), rstd, w, false, false);
    return std::make_tuple(dx, dw);
  });
}

}  // namespace pytransformer
