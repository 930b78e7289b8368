// CUDA glue of layer_norm and rms_norm: the shared argument checks of norm.h, then the kernels of norm_launch.h on
// the current stream of x's device.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <initializer_list>

#include "../norm.h"
#include "norm_launch.h"

namespace pytransformer::cuda {
namespace {

template <typename T>
const T* data_or_null(const at::Tensor& t) {
  return t.defined() ? reinterpret_cast<const T*>(t.const_data_ptr()) : nullptr;
}

// Whether every defined tensor's data is 16-byte aligned (the rows then are too when n is a multiple of the pack).
bool all_aligned16(std::initializer_list<at::Tensor> ts) {
  for (const at::Tensor& t : ts)
    if (t.defined() && !aligned16(t.const_data_ptr())) return false;
  return true;
}

// Returns (out, mean (undefined when !center), rstd).
std::tuple<at::Tensor, at::Tensor, at::Tensor> forward(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                                       const std::optional<at::Tensor>& bias, double eps, bool center) {
  at::Tensor x2 = check_norm_args(x, weight, bias, eps);  // [rows, n]
  c10::cuda::CUDAGuard guard(x.device());
  at::Tensor w = weight ? weight->contiguous() : at::Tensor(), b = bias ? bias->contiguous() : at::Tensor();
  at::Tensor y = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor mean = center ? empty_stats(x) : at::Tensor(), rstd = empty_stats(x);
  if (x2.size(0) == 0) return {y, mean, rstd};
  dispatch_float_types(x.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    NormFwdParams<T> p{reinterpret_cast<const T*>(x2.const_data_ptr()),
                       data_or_null<T>(w),
                       data_or_null<T>(b),
                       reinterpret_cast<T*>(y.mutable_data_ptr()),
                       center ? mean.mutable_data_ptr<float>() : nullptr,
                       rstd.mutable_data_ptr<float>(),
                       x2.size(0),
                       x2.size(1),
                       static_cast<float>(eps),
                       center};
    launch_norm_fwd(p, all_aligned16({x2, w, b, y}), c10::cuda::getCurrentCUDAStream());
  });
  return {y, mean, rstd};
}

// Returns (grad_x, grad_weight ([n] with a weight, else [0]), grad_bias ([n] when has_bias, else [0])).
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& x,
                                                        const at::Tensor& mean, const at::Tensor& rstd,
                                                        const std::optional<at::Tensor>& weight, bool has_bias,
                                                        bool center) {
  at::Tensor x2 = check_norm_args(x, weight, std::nullopt, 0.0);  // [rows, n]
  check_norm_backward_args(grad_out, x, rstd, mean);
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t n = x2.size(1);
  at::Tensor g2 = grad_out.contiguous().view(x2.sizes()), w = weight ? weight->contiguous() : at::Tensor();
  at::Tensor mean1 = center ? mean.contiguous() : at::Tensor(), rstd1 = rstd.contiguous();
  at::Tensor dx = at::empty_like(x, at::MemoryFormat::Contiguous);
  at::Tensor dw = at::empty({weight ? n : 0}, x.options()), db = at::empty({has_bias ? n : 0}, x.options());
  if (x2.size(0) == 0) {  // sums over no rows
    dw.zero_(), db.zero_();
    return {dx, dw, db};
  }
  dispatch_float_types(x.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    NormBwdParams<T> p{reinterpret_cast<const T*>(g2.const_data_ptr()),
                       reinterpret_cast<const T*>(x2.const_data_ptr()),
                       center ? mean1.const_data_ptr<float>() : nullptr,
                       rstd1.const_data_ptr<float>(),
                       data_or_null<T>(w),
                       reinterpret_cast<T*>(dx.mutable_data_ptr()),
                       nullptr,
                       nullptr,
                       x2.size(0),
                       n,
                       center};
    at::Tensor parts;  // kept alive until the launches are queued; the caching allocator orders reuse on the stream
    auto alloc_parts = [&](int64_t floats) {
      parts = at::empty({floats}, x.options().dtype(at::kFloat));
      return parts.mutable_data_ptr<float>();
    };
    launch_norm_bwd(p, all_aligned16({g2, x2, w, dx}), weight ? reinterpret_cast<T*>(dw.mutable_data_ptr()) : nullptr,
                    has_bias ? reinterpret_cast<T*>(db.mutable_data_ptr()) : nullptr,
                    c10::cuda::getCurrentCUDAStream(), alloc_parts);
  });
  return {dx, dw, db};
}

}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CUDA, m) { register_norm_impls<&forward, &backward>(m); }

}  // namespace pytransformer::cuda
