#pragma once
// The launch function of the int8_linear kernels (int8_linear_kernel.cuh) as the glue (int8_linear.cpp) calls it, and
// its parameters: T is the storage type of x and out (float, __half, __nv_bfloat16), instantiated in
// int8_linear_kernel.cu.
#include "../int8_linear_params.h"
#include "launch.h"

namespace pytransformer::cuda {

// A float32 / float16 / bfloat16 vector whose dtype is known at run time (scale and bias may differ from x's dtype);
// an absent vector reads as zeros (value_at, int8_linear_kernel.cuh).
struct FloatVec {
  const void* data;  // [N] or null
  c10::ScalarType dtype;
};

template <typename T>
struct Int8LinearArgs {
  const T* x;             // [M, K]
  const int8_t* weight;   // [N, K]
  FloatVec scale, bias;   // [N]; bias may be absent
  T* out;                 // [M, N]
  float* parts;           // [split, M, N] split-K partial sums, or null
  Int8LinearParams dims;  // M, N, K
};

// Stream-ordered; the caller has checked the arguments, set the device and handles M, N = 0. Split-K partial sums go
// in a buffer from alloc_parts.
template <typename T>
void launch_int8_linear(const Int8LinearArgs<T>& p, cudaStream_t stream, FloatAlloc alloc_parts);

}  // namespace pytransformer::cuda
