#pragma once
// The launch functions of the layer_norm / rms_norm kernels (norm_kernel.cuh) as the glue (norm.cpp) calls them, and
// their parameters: T is the storage type (float, __half, __nv_bfloat16), instantiated in norm_kernel.cu.
#include "launch.h"

namespace pytransformer::cuda {

template <typename T>
struct NormFwdParams {
  const T* x;       // [rows, n]
  const T* weight;  // [n] or null
  const T* bias;    // [n] or null
  T* y;             // [rows, n]
  float* mean;      // [rows] or null (RMSNorm)
  float* rstd;      // [rows]
  int64_t rows, n;
  float eps;
  bool center;
};

template <typename T>
struct NormBwdParams {
  const T* grad_out;    // [rows, n]
  const T* x;           // [rows, n]
  const float* mean;    // [rows] or null (RMSNorm: 0)
  const float* rstd;    // [rows]
  const T* weight;      // [n] or null
  T* grad_x;            // [rows, n]
  float* weight_parts;  // [gridDim.x, n] partial sums of grad_out * xhat, or null
  float* bias_parts;    // [gridDim.x, n] partial sums of grad_out, or null
  int64_t rows, n;
  bool center;
};

// Stream-ordered; the caller has checked the arguments and set the device. can_vec: x, y, weight and bias (grad_out,
// x, weight and grad_x for the backward) are 16-byte aligned (n % kPackElems<T> == 0 is checked there).
template <typename T>
void launch_norm_fwd(const NormFwdParams<T>& p, bool can_vec, cudaStream_t stream);
// Computes grad_x and, when out_weight / out_bias are not null, grad_weight / grad_bias into them ([n]); the partial
// sums over blocks go in a buffer from alloc_parts.
template <typename T>
void launch_norm_bwd(NormBwdParams<T> p, bool can_vec, T* out_weight, T* out_bias, cudaStream_t stream,
                     FloatAlloc alloc_parts);

}  // namespace pytransformer::cuda
