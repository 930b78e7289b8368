#pragma once
// Host helpers of the CUDA glue (the <op>.cpp files) that read tensors; the kernel units never include them.
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAException.h>

#include <cstdint>
#include <vector>

#include "launch.h"

namespace pytransformer::cuda {

// Whether every [B, H, L] row of t ([B, H, L, n]) starts on a 16-byte boundary and is contiguous.
inline bool rows_aligned16(const at::Tensor& t) {
  int64_t stride[3];
  for (int d = 0; d < 3; ++d) stride[d] = t.size(d) > 1 ? t.stride(d) : 0;  // a dim of size 1 is never stepped
  return (t.size(3) <= 1 || t.stride(3) == 1) && rows_aligned16(t.const_data_ptr(), stride, t.element_size());
}

// Whether every row of t ([B, H, L, n]) can be read or written in 16-byte packs.
inline bool rows_packable(const at::Tensor& t) { return rows_aligned16(t) && t.size(3) % (16 / t.element_size()) == 0; }

// ---- KV cache (kv_cache_append, decode_attention) ----
// The two KV-cache ops' index vectors (positions, cache_lengths), read on the device as given (IndexVector, common.cuh:
// int32 or int64, any stride), and the host-side check of their values.
//
// Host checks and synchronisation. The CPU glue checks positions / cache_lengths on the host. On CUDA that read is a
// device-to-host copy, which waits for the stream (once per layer per generated token in a decode loop) and is
// impossible while the stream is being captured into a CUDA graph. So:
//   - with a host-side bound (max_position, max_length: the caller's guarantee, e.g. a cache that tracks its lengths
//     on the host), the bound is checked against the capacity on the host (the ValueError of csrc/kv_cache_append.h
//     or csrc/decode_attention.h, before anything is written) and the values are not read: no synchronisation;
//   - otherwise the values are copied and checked on the host, unless the stream is capturing;
//   - the kernels check them again on the device, always: an append row whose positions do not fit writes nothing, a
//     decode row whose length is out of range gives zeros. Under capture (or with a bound the values break) a bad
//     call therefore raises nothing; the rows with good values are still written.

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

// Calls check(const int64_t* values) on a host copy of the integer vector `t`, unless `stream` is capturing (see
// above: the kernels then check the values themselves). The copy waits for the stream: one device-to-host
// synchronisation, which the ops avoid when the caller passes a host-side bound instead (max_position, max_length).
template <class Check>
void check_on_host_unless_capturing(const at::Tensor& t, cudaStream_t stream, Check&& check) {
  if (capturing(stream)) return;
  const at::Tensor values = t.to(at::kLong).contiguous();  // [B], on the device
  std::vector<int64_t> host(values.numel());
  C10_CUDA_CHECK(cudaMemcpyAsync(host.data(), values.const_data_ptr(), host.size() * sizeof(int64_t),
                                 cudaMemcpyDeviceToHost, stream));
  C10_CUDA_CHECK(cudaStreamSynchronize(stream));
  check(host.data());
}

}  // namespace pytransformer::cuda
