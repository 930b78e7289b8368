// CUDA glue of decode_attention: the shared checks of decode_attention.h, cache_lengths checked on the host unless the
// stream is capturing a CUDA graph (then the kernel gives zeros for a row whose length is out of range: see glue.h),
// then the split and combine kernels of decode_attention_launch.h on the current stream of q's device. The caches
// are read in place (a cache with a strided last dim is copied, like on the CPU).
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cmath>

#include "../decode_attention.h"
#include "decode_attention_launch.h"
#include "glue.h"

namespace pytransformer::cuda {
namespace {

at::Tensor decode_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                            const at::Tensor& cache_lengths, double scale, std::optional<int64_t> window,
                            std::optional<int64_t> max_length) {
  const at::Tensor q = unit_last_stride(q_in), k = unit_last_stride(k_in), v = unit_last_stride(v_in);
  const DecodeAttentionParams p = check_decode_attention_args(q, k, v, cache_lengths, scale, window);
  TORCH_CHECK_VALUE(p.head_dim <= kDecodeMaxHeadDim && p.v_head_dim <= kDecodeMaxHeadDim,
                    "q: the CUDA decode_attention supports head dims D, Dv <= ", kDecodeMaxHeadDim, ", got D = ",
                    p.head_dim, ", Dv = ", p.v_head_dim);
  c10::cuda::CUDAGuard guard(q.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (max_length) {
    check_length_bound(*max_length, p);  // no device read (see glue.h)
  } else {
    check_on_host_unless_capturing(cache_lengths, stream, [&](const int64_t* n) { check_cache_lengths(n, p); });
  }
  at::Tensor out = at::empty({p.batch, p.q_heads, p.q_len, p.v_head_dim}, q.options());  // [B, Hq, T, Dv]
  if (out.numel() == 0) return out;
  at::Tensor lengths_keep, parts;  // kept alive until the launches are queued
  const IndexVector lengths = index_vector(cache_lengths, lengths_keep);
  dispatch_float_types(q.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    DecodeArgs<T> a{p,
                    reinterpret_cast<const T*>(q.const_data_ptr()),
                    reinterpret_cast<const T*>(k.const_data_ptr()),
                    reinterpret_cast<const T*>(v.const_data_ptr()),
                    reinterpret_cast<T*>(out.mutable_data_ptr()),
                    nullptr,
                    nullptr,
                    lengths,
                    static_cast<float>(scale * M_LOG2E),
                    0,
                    0,
                    0};
    launch_decode_attention(a, rows_packable(k) && rows_packable(v), stream, [&](int64_t floats) {
      parts = at::empty({floats}, q.options().dtype(at::kFloat));
      return parts.mutable_data_ptr<float>();
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CUDA, m) { m.impl("decode_attention", &decode_attention); }

}  // namespace pytransformer::cuda
