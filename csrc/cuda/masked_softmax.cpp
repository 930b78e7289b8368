// CUDA glue of masked_softmax: the shared argument checks and mask layout of masked_softmax.h, then the kernels of
// masked_softmax_launch.h on the current stream of the scores' device.
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "../masked_softmax.h"
#include "masked_softmax_launch.h"

namespace pytransformer::cuda {
namespace {

at::Tensor forward(const at::Tensor& scores, const std::optional<at::Tensor>& mask, double scale, bool causal) {
  at::Tensor m = check_masked_softmax_args(scores, mask, scale, causal);  // expanded to scores' shape, or undefined
  const MaskLayout layout = mask_layout(m);
  c10::cuda::CUDAGuard guard(scores.device());
  at::Tensor out = at::empty_like(scores, at::MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  const int64_t lk = scores.size(-1);
  at::Tensor s2 = scores.contiguous().view({-1, lk});  // [rows, Lk]
  dispatch_float_types(scores.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    SoftmaxFwdParams<T> p{reinterpret_cast<const T*>(s2.const_data_ptr()),
                          reinterpret_cast<T*>(out.mutable_data_ptr()),
                          m.defined() ? m.const_data_ptr() : nullptr,
                          m.defined() && m.scalar_type() == at::kBool,
                          layout,
                          s2.size(0),
                          lk,
                          causal ? scores.size(-2) : 0,
                          static_cast<float>(scale)};
    launch_masked_softmax_fwd(p, aligned16(p.scores) && aligned16(p.out), c10::cuda::getCurrentCUDAStream());
  });
  return out;
}

at::Tensor backward(const at::Tensor& grad_out, const at::Tensor& out, double scale) {
  check_masked_softmax_backward_args(grad_out, out, scale);
  c10::cuda::CUDAGuard guard(out.device());
  at::Tensor grad = at::empty_like(out, at::MemoryFormat::Contiguous);
  if (grad.numel() == 0) return grad;
  const int64_t lk = out.size(-1);
  at::Tensor g2 = grad_out.contiguous().view({-1, lk}), out2 = out.contiguous().view({-1, lk});  // [rows, Lk]
  dispatch_float_types(out.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    SoftmaxBwdParams<T> p{reinterpret_cast<const T*>(g2.const_data_ptr()),
                          reinterpret_cast<const T*>(out2.const_data_ptr()),
                          reinterpret_cast<T*>(grad.mutable_data_ptr()),
                          out2.size(0),
                          lk,
                          static_cast<float>(scale)};
    launch_masked_softmax_bwd(p, aligned16(p.grad_out) && aligned16(p.out) && aligned16(p.grad),
                              c10::cuda::getCurrentCUDAStream());
  });
  return grad;
}

}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CUDA, m) {
  m.impl("masked_softmax", &forward);
  m.impl("masked_softmax_backward", &backward);
}

}  // namespace pytransformer::cuda
