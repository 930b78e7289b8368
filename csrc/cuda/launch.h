#pragma once
// What the CUDA glue (the <op>.cpp files, compiled by the C++ compiler) and the kernel units (the .cu files, compiled
// by nvcc) share: the storage types of a float tensor, integer vectors read on the device, alignment tests, device
// attributes, and the type of the allocation callbacks that launch functions take. Each op's launch functions are
// declared in <op>_launch.h with this header, defined in <op>_kernel.cuh and instantiated for every storage type in
// <op>_kernel.cu, so that the glue's host code, which reads tensors, is compiled once, by the same compiler and with
// the same flags as the CPU glue, and nvcc never parses ATen's operators. No device code here: both compilers read it.
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <c10/util/FunctionRef.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../host_namespace.h"

namespace pytransformer::cuda {

// A float32 device buffer of the given number of elements that stays valid for the work queued on the current stream
// (the glue allocates it from torch's caching allocator when a launch asks for scratch space).
using FloatAlloc = c10::function_ref<float*(int64_t)>;

// X(T) for each storage type T of the float kernels: the explicit instantiations of the <op>_kernel.cu units.
#define PT_FOR_FLOAT_TYPES(X) X(float) X(__half) X(__nv_bfloat16)

// Host code that both compilers compile: one copy per compiler (see host_namespace.h).
inline namespace PT_HOST_NAMESPACE {

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether every row base + b * stride[0] + h * stride[1] + i * stride[2] (elements of elem_bytes) starts on a 16-byte
// boundary.
inline bool rows_aligned16(const void* base, const int64_t (&stride)[3], int64_t elem_bytes) {
  bool ok = aligned16(base);
  for (int d = 0; d < 3; ++d) ok = ok && stride[d] * elem_bytes % 16 == 0;
  return ok;
}

// An attribute of the current device.
inline int device_attribute(cudaDeviceAttr attr) {
  int device = 0, value = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  C10_CUDA_CHECK(cudaDeviceGetAttribute(&value, attr, device));
  return value;
}

inline int multiprocessor_count() { return device_attribute(cudaDevAttrMultiProcessorCount); }

// Calls f(std::type_identity<T>) with T the CUDA storage type of a float32/float16/bfloat16 tensor.
template <class F>
void dispatch_float_types(c10::ScalarType dtype, F&& f) {
  switch (dtype) {
    case c10::ScalarType::Float: return f(std::type_identity<float>{});
    case c10::ScalarType::Half: return f(std::type_identity<__half>{});
    case c10::ScalarType::BFloat16: return f(std::type_identity<__nv_bfloat16>{});
    default: TORCH_CHECK_VALUE(false, "expected a float32, float16 or bfloat16 CUDA tensor, got ", dtype);
  }
}

}  // namespace PT_HOST_NAMESPACE

// An integer vector [B] in device memory (the KV-cache ops' positions and cache_lengths, as given: glue.h):
// int32 or int64 elements `stride` apart.
struct IndexVector {
  const void* data;
  int64_t stride;
  bool is_int64;

  __device__ __forceinline__ int64_t at(int64_t i) const {
    return is_int64 ? static_cast<const int64_t*>(data)[i * stride] : static_cast<const int32_t*>(data)[i * stride];
  }
};

}  // namespace pytransformer::cuda
