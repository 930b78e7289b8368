#pragma once
// decode_attention: argument checks shared by the CPU and CUDA glue; the kernels' parameters are
// decode_attention_params.h. Shapes: queries [B, Hq, T, D], caches [B, Hkv, capacity, D] (values [B, Hkv, capacity,
// Dv]), cache_lengths int [B]. Strides are in elements; kernels read rows of the last dim, so the tensors must have a
// unit last-dim stride (the glue ensures it).
#include "attention.h"  // check_positive_window
#include "common.h"
#include "decode_attention_params.h"

#include <cmath>
#include <cstdint>

namespace pytransformer {

// `t` itself when its rows (last dim) are contiguous, as the decode kernels need; else a contiguous copy (a cache laid
// out with a strided last dim is copied, every usual layout is read in place).
inline at::Tensor unit_last_stride(const at::Tensor& t) {
  return t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

// The CPU kernel (csrc/cpu/decode_attention_kernel.cpp): q, k_cache, v_cache laid out as `p` says, in `dtype`;
// cache_lengths [B] int64; out [B, Hq, T, Dv] contiguous.
using DecodeAttentionCpuFn = void (*)(const DecodeAttentionParams& p, at::ScalarType dtype, const void* q,
                                      const void* k_cache, const void* v_cache, const int64_t* cache_lengths,
                                      void* out);

// Checks shapes, dtypes, devices, heads and window (not the values of cache_lengths, see check_cache_lengths).
// The strides are those of the tensors given; the glue passes tensors with a unit last-dim stride.
inline DecodeAttentionParams check_decode_attention_args(const at::Tensor& q, const at::Tensor& k_cache,
                                                         const at::Tensor& v_cache, const at::Tensor& cache_lengths,
                                                         double scale, std::optional<int64_t> window) {
  check_float_dtype(q, "q");
  check_dim(q, "q", 4, "[B, Hq, T, D]");
  const int64_t B = q.size(0), Hq = q.size(1), T = q.size(2), D = q.size(3);
  TORCH_CHECK_VALUE(T >= 1, "q: expected [B, Hq, T, D] with T >= 1 new tokens, got ", q.sizes());
  check_like(k_cache, "k_cache", q, "q");
  check_sizes(k_cache, "k_cache", "[B, Hkv, capacity, D]", {B, -1, -1, D});
  const int64_t Hkv = k_cache.size(1), cap = k_cache.size(2);
  check_like(v_cache, "v_cache", q, "q");
  check_sizes(v_cache, "v_cache", "[B, Hkv, capacity, Dv]", {B, Hkv, cap, -1});
  TORCH_CHECK_VALUE(Hkv >= 1 && Hq % Hkv == 0, "q: the number of query heads Hq = ", Hq,
                    " must be a multiple of the number of cache heads Hkv = ", Hkv);
  check_index_vector(cache_lengths, "cache_lengths", q, "q", B);
  check_positive_window(window);
  TORCH_CHECK_VALUE(std::isfinite(scale), "scale: expected a finite value, got ", scale);
  DecodeAttentionParams p{B, Hq, Hkv, T, D, v_cache.size(3), cap, window.value_or(0), scale, {}, {}, {}};
  copy_strides(q, p.q_stride);
  copy_strides(k_cache, p.k_stride);
  copy_strides(v_cache, p.v_stride);
  return p;
}

// Each length is 0 (an unused row: its output is zeros) or in [T, capacity] (it counts the T new tokens).
inline void check_cache_lengths(const int64_t* lengths, const DecodeAttentionParams& p) {
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t n = lengths[b];
    TORCH_CHECK_VALUE(n == 0 || (n >= p.q_len && n <= p.capacity), "cache_lengths: row ", b, " has length ", n,
                      "; expected 0 (unused row) or T <= length <= capacity with T = ", p.q_len,
                      ", capacity = ", p.capacity);
  }
}

// max_length, the caller's host-side bound of cache_lengths (every cache_lengths[b] <= max_length): within the
// capacity. Checked instead of the values themselves where reading them would cost a device-to-host copy (CUDA).
inline void check_length_bound(int64_t max_length, const DecodeAttentionParams& p) {
  TORCH_CHECK_VALUE(max_length >= 0 && max_length <= p.capacity, "max_length: expected 0 <= max_length <= capacity = ",
                    p.capacity, ", got ", max_length);
}

}  // namespace pytransformer
