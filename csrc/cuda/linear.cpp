// CUDA glue of linear: the shared argument checks of linear.h, then ATen's linear (cuBLAS) on x's device, so that the
// op runs on every device. There is no CUDA kernel of ours for this op (the weight-streaming kernel is the CPU's).
#include <ATen/ops/linear.h>
#include <torch/library.h>

#include "../linear.h"

namespace pytransformer::cuda {
namespace {

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  check_linear_args(x, weight, bias);
  return at::linear(x, weight, bias);
}

}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CUDA, m) { m.impl("linear", &linear_cuda); }

}  // namespace pytransformer::cuda
