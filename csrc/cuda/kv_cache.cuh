#pragma once
// Pieces shared by the CUDA kv_cache_append and decode_attention: the int index vectors (positions, cache_lengths)
// read on the device as given (int32 or int64, any stride), and the host-side check of their values.
//
// CUDA graphs. The CPU glue checks positions / cache_lengths on the host. On CUDA that read is a device-to-host copy,
// which synchronises and is impossible while the stream is being captured into a CUDA graph. So the values are checked
// on the host (one small copy, then the ValueError of csrc/kv_cache.h, before anything is written) only when the
// stream is not capturing; the kernels check them again on the device, always: an append row whose positions do not
// fit writes nothing, a decode row whose length is out of range gives zeros. Under capture a bad call therefore
// raises nothing; the rows with good values are still written.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace pytransformer::cuda {

// An integer vector [B] in device memory: int32 or int64 elements `stride` apart.
struct IndexVector {
  const void* data;
  int64_t stride;
  bool is_int64;

  __device__ __forceinline__ int64_t at(int64_t i) const {
    return is_int64 ? static_cast<const int64_t*>(data)[i * stride] : static_cast<const int32_t*>(data)[i * stride];
  }
};

// `t` (an integer tensor [B] on the device) as an IndexVector; other integer dtypes are converted to int64 first
// (a device kernel: capture-safe). `keep` holds the tensor read, alive until the launch is queued.
inline IndexVector index_vector(const at::Tensor& t, at::Tensor& keep) {
  keep = t.scalar_type() == at::kInt || t.scalar_type() == at::kLong ? t : t.to(at::kLong);
  return {keep.const_data_ptr(), keep.stride(0), keep.scalar_type() == at::kLong};
}

// Whether work queued on `stream` is being captured into a CUDA graph.
inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  C10_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Calls check(const int64_t* values) on a host copy of the integer vector `t`, unless `stream` is capturing (see the
// top of this file: the kernels then check the values themselves).
template <class Check>
void check_on_host_unless_capturing(const at::Tensor& t, cudaStream_t stream, Check&& check) {
  if (capturing(stream)) return;
  const at::Tensor host = t.to(at::kCPU, at::kLong).contiguous();  // [B]; waits for the stream
  check(host.const_data_ptr<int64_t>());
}

}  // namespace pytransformer::cuda
