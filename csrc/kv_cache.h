#pragma once
// kv_cache_append and decode_attention: argument checks and the plain parameter structs that the CPU and CUDA glue
// share. Shapes: caches [B, Hkv, capacity, D] (values [B, Hkv, capacity, Dv]), new keys/values [B, Hkv, T, D|Dv],
// queries [B, Hq, T, D], positions / cache_lengths int [B]. Strides are in elements; kernels read rows of the last
// dim, so decode_attention's tensors must have a unit last-dim stride (the glue ensures it).
#include "common.h"

#include <ATen/MemoryOverlap.h>
#include <ATen/core/Tensor.h>

#include <cmath>
#include <sstream>
#include <vector>

namespace pytransformer {

// Where row b of kv_cache_append writes: cache positions positions[b] .. positions[b] + new_len - 1.
struct KvCacheAppendParams {
  int64_t batch, kv_heads, new_len, head_dim, v_head_dim, capacity;
  int64_t k_cache_stride[4], v_cache_stride[4], k_new_stride[4], v_new_stride[4];  // [B, Hkv, L, D] element strides
};

// Query t of row b sits at position cache_lengths[b] - q_len + t and sees keys p - window < j <= p.
struct DecodeAttentionParams {
  int64_t batch, q_heads, kv_heads, q_len, head_dim, v_head_dim, capacity;
  int64_t window;  // 0: no window (causal only)
  double scale;
  int64_t q_stride[3], k_stride[3], v_stride[3];  // [B, H, L] element strides; the last dim is contiguous
};

// `t` must have the sizes `expected` (-1: any), named by `dims` (e.g. "[B, Hkv, T, D]") in the message:
// "k_new: expected [B, Hkv, T, D] = [2, 4, *, 64], got [2, 4, 3, 32]".
inline void check_sizes(const at::Tensor& t, const char* name, const char* dims, std::vector<int64_t> expected) {
  check_dim(t, name, static_cast<int64_t>(expected.size()), dims);
  bool ok = true;
  std::ostringstream want;
  want << "[";
  for (size_t i = 0; i < expected.size(); ++i) {
    ok = ok && (expected[i] < 0 || expected[i] == t.size(i));
    want << (i ? ", " : "");
    if (expected[i] < 0) want << "*"; else want << expected[i];
  }
  want << "]";
  TORCH_CHECK_VALUE(ok, name, ": expected ", dims, " = ", want.str(), ", got ", t.sizes());
}

inline void check_index_vector(const at::Tensor& t, const char* name, const at::Tensor& ref, const char* ref_name,
                               int64_t batch) {
  TORCH_CHECK_VALUE(at::isIntegralType(t.scalar_type(), /*includeBool=*/false), name,
                    ": expected an integer tensor [B], got dtype ", t.scalar_type());
  check_like(t, name, ref, ref_name, /*same_dtype=*/false);
  check_sizes(t, name, "[B]", {batch});
}

// Whether a and b share memory (as far as ATen can tell: strided views of one storage may go undetected).
inline bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  const auto status = at::get_overlap_status(a, b);
  return status == at::MemOverlapStatus::Full || status == at::MemOverlapStatus::Partial;
}

// `t` itself when its rows (last dim) are contiguous, as the decode kernels need; else a contiguous copy (a cache laid
// out with a strided last dim is copied, every usual layout is read in place).
inline at::Tensor unit_last_stride(const at::Tensor& t) {
  return t.dim() == 0 || t.size(-1) <= 1 || t.stride(-1) == 1 ? t : t.contiguous();
}

template <size_t N>
void copy_strides(const at::Tensor& t, int64_t (&out)[N]) {
  for (size_t i = 0; i < N; ++i) out[i] = t.stride(i);
}

// Checks shapes, dtypes and devices (not the values of `positions`, see check_append_positions).
inline KvCacheAppendParams check_kv_cache_append_args(const at::Tensor& k_cache, const at::Tensor& v_cache,
                                                      const at::Tensor& k_new, const at::Tensor& v_new,
                                                      const at::Tensor& positions) {
  check_float_dtype(k_cache, "k_cache");
  check_dim(k_cache, "k_cache", 4, "[B, Hkv, capacity, D]");
  const int64_t B = k_cache.size(0), H = k_cache.size(1), cap = k_cache.size(2), D = k_cache.size(3);
  check_like(v_cache, "v_cache", k_cache, "k_cache");
  check_sizes(v_cache, "v_cache", "[B, Hkv, capacity, Dv]", {B, H, cap, -1});
  check_like(k_new, "k_new", k_cache, "k_cache");
  check_sizes(k_new, "k_new", "[B, Hkv, T, D]", {B, H, -1, D});
  check_like(v_new, "v_new", k_cache, "k_cache");
  check_sizes(v_new, "v_new", "[B, Hkv, T, Dv]", {B, H, k_new.size(2), v_cache.size(3)});
  check_index_vector(positions, "positions", k_cache, "k_cache", B);
  TORCH_CHECK_VALUE(at::has_internal_overlap(k_cache) != at::MemOverlap::Yes,
                    "k_cache: expected a tensor whose elements do not overlap (not an expanded view)");
  TORCH_CHECK_VALUE(at::has_internal_overlap(v_cache) != at::MemOverlap::Yes,
                    "v_cache: expected a tensor whose elements do not overlap (not an expanded view)");
  TORCH_CHECK_VALUE(!overlaps(k_cache, v_cache), "v_cache: expected memory separate from k_cache");
  for (const auto& [t, name] : {std::pair{&k_new, "k_new"}, std::pair{&v_new, "v_new"}})
    TORCH_CHECK_VALUE(!overlaps(k_cache, *t) && !overlaps(v_cache, *t), name,
                      ": expected memory separate from the caches");
  KvCacheAppendParams p{B, H, k_new.size(2), D, v_cache.size(3), cap, {}, {}, {}, {}};
  copy_strides(k_cache, p.k_cache_stride);
  copy_strides(v_cache, p.v_cache_stride);
  copy_strides(k_new, p.k_new_stride);
  copy_strides(v_new, p.v_new_stride);
  return p;
}

// Every row must fit: 0 <= positions[b] and positions[b] + T <= capacity (checked before anything is written).
inline void check_append_positions(const int64_t* positions, const KvCacheAppendParams& p) {
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t pos = positions[b];
    TORCH_CHECK_VALUE(pos >= 0 && pos <= p.capacity - p.new_len, "positions: row ", b, " would write cache positions ",
                      pos, "..", pos + p.new_len - 1, ", outside the cache capacity ", p.capacity,
                      " (expected 0 <= positions[b] <= capacity - T = ", p.capacity - p.new_len, ")");
  }
}

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
  TORCH_CHECK_VALUE(!window || *window >= 1, "window: expected None or a positive int, got ", window.value_or(0));
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

}  // namespace pytransformer
