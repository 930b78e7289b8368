// CUDA glue of int8_linear: the shared argument checks of int8_linear.h, then the kernels of int8_linear_launch.h on
// the current stream of x's device.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <vector>

#include "../int8_linear.h"
#include "int8_linear_launch.h"

namespace pytransformer::cuda {
namespace {

FloatVec float_vec(const at::Tensor& t) {
  return {t.defined() ? t.const_data_ptr() : nullptr, t.defined() ? t.scalar_type() : c10::ScalarType::Float};
}

at::Tensor int8_linear_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                            const std::optional<at::Tensor>& bias, int64_t x_bits) {
  const Int8LinearParams dims = check_int8_linear_args(x, weight, scale, bias, x_bits);
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor x2 = x.reshape({dims.rows, dims.in_features}).contiguous();  // [M, K]
  if (x_bits == 8) x2 = round_x_to_8_bits(x2);
  const at::Tensor w = weight.contiguous(), s = scale.contiguous();          // [N, K], [N]
  const at::Tensor b = bias ? bias->contiguous() : at::Tensor();              // [N] or undefined
  at::Tensor out = at::empty({dims.rows, dims.out_features}, x.options());    // [M, N]
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = dims.out_features;
  if (out.numel() == 0) return out.view(shape);
  dispatch_float_types(x.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const Int8LinearArgs<T> p{reinterpret_cast<const T*>(x2.const_data_ptr()),
                              w.const_data_ptr<int8_t>(),
                              float_vec(s),
                              float_vec(b),
                              reinterpret_cast<T*>(out.mutable_data_ptr()),
                              nullptr,
                              dims};
    at::Tensor parts;  // kept alive until the launches are queued; the caching allocator orders reuse on the stream
    launch_int8_linear(p, c10::cuda::getCurrentCUDAStream(), [&](int64_t floats) {
      parts = at::empty({floats}, x.options().dtype(at::kFloat));
      return parts.mutable_data_ptr<float>();
    });
  });
  return out.view(shape);
}

}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CUDA, m) { m.impl("int8_linear", &int8_linear_cuda); }

}  // namespace pytransformer::cuda
