// CPU glue of masked_softmax: argument checks, allocation, the kernel of the best ISA level
// (masked_softmax_kernel.cpp), registration.
#include <ATen/ops/empty_like.h>
#include <torch/library.h>

#include "../masked_softmax.h"
#include "isa.h"

namespace pytransformer::cpu {
KernelTable<void (*)(const MaskedSoftmaxFwdParams&)> masked_softmax_fwd_kernel;
KernelTable<void (*)(const MaskedSoftmaxBwdParams&)> masked_softmax_bwd_kernel;

namespace {
at::Tensor forward(const at::Tensor& scores, const std::optional<at::Tensor>& mask, double scale, bool causal) {
  at::Tensor m = check_masked_softmax_args(scores, mask, scale, causal);
  const MaskLayout ml = mask_layout(m);
  at::Tensor out = at::empty_like(scores, at::MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  const int64_t lk = scores.size(-1);
  at::Tensor x = scores.contiguous();
  masked_softmax_fwd_kernel.get()({scores.scalar_type(), x.numel() / lk, lk, causal ? scores.size(-2) : 0, scale,
                                   x.const_data_ptr(), m.defined() ? m.const_data_ptr() : nullptr,
                                   m.defined() && m.scalar_type() == at::kBool, ml, out.mutable_data_ptr()});
  return out;
}

at::Tensor backward(const at::Tensor& grad_out, const at::Tensor& out, double scale) {
  check_masked_softmax_backward_args(grad_out, out, scale);
  at::Tensor grad = at::empty_like(out, at::MemoryFormat::Contiguous);
  if (grad.numel() == 0) return grad;
  const int64_t lk = out.size(-1);
  at::Tensor g = grad_out.contiguous(), y = out.contiguous();
  masked_softmax_bwd_kernel.get()({out.scalar_type(), out.numel() / lk, lk, scale, g.const_data_ptr(),
                                   y.const_data_ptr(), grad.mutable_data_ptr()});
  return grad;
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) {
  m.impl("masked_softmax", &forward);
  m.impl("masked_softmax_backward", &backward);
}
}  // namespace pytransformer::cpu
