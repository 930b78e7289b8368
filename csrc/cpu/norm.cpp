// CPU glue of layer_norm and rms_norm: argument checks, allocation, the kernel of the best ISA level
// (norm_kernel.cpp), registration.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include "../norm.h"
#include "isa.h"

namespace pytransformer::cpu {
KernelTable<void (*)(const NormFwdParams&)> norm_fwd_kernel;
KernelTable<void (*)(const NormBwdParams&)> norm_bwd_kernel;

namespace {
// Contiguous (or undefined) copies of the optional per-feature vectors, kept alive while the kernel runs.
at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) { return t ? t->contiguous() : at::Tensor(); }

std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                                       const std::optional<at::Tensor>& bias, double eps, bool center) {
  at::Tensor x2 = check_norm_args(x, weight, bias, eps);  // [rows, N]
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous), mean = empty_stats(x), rstd = empty_stats(x);
  at::Tensor w = contiguous_or_undefined(weight), b = contiguous_or_undefined(bias);
  norm_fwd_kernel.get()({x.scalar_type(), x2.size(0), x2.size(1), center, eps, x2.const_data_ptr(),
                         w.defined() ? w.const_data_ptr() : nullptr, b.defined() ? b.const_data_ptr() : nullptr,
                         y.mutable_data_ptr(), mean.mutable_data_ptr(), rstd.mutable_data_ptr()});
  return {y, mean, rstd};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                        const at::Tensor& mean, const at::Tensor& rstd,
                                                        const std::optional<at::Tensor>& weight, bool has_bias,
                                                        bool center) {
  at::Tensor x2 = check_norm_args(x, weight, std::nullopt, 0.0);  // [rows, N]
  check_norm_backward_args(grad_out, x, rstd, mean);
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor dw = at::empty({weight ? x.size(-1) : 0}, x.options());
  at::Tensor db = at::empty({has_bias ? x.size(-1) : 0}, x.options());
  at::Tensor g = grad_out.contiguous(), w = contiguous_or_undefined(weight), rs = rstd.contiguous();
  at::Tensor mu = mean.defined() ? mean.contiguous() : at::Tensor();  // RMSNorm has no mean
  norm_bwd_kernel.get()({x.scalar_type(), x2.size(0), x2.size(1), center, g.const_data_ptr(), x2.const_data_ptr(),
                         mu.defined() ? mu.const_data_ptr() : nullptr, rs.const_data_ptr(),
                         w.defined() ? w.const_data_ptr() : nullptr, dx.mutable_data_ptr(),
                         weight ? dw.mutable_data_ptr() : nullptr, has_bias ? db.mutable_data_ptr() : nullptr});
  return {dx, dw, db};
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) { register_norm_impls<&forward, &backward>(m); }
}  // namespace pytransformer::cpu
