#pragma once
// kv_cache_append: argument checks shared by the CPU and CUDA glue; the kernels' parameters are
// kv_cache_append_params.h. Shapes: caches [B, Hkv, capacity, D] (values [B, Hkv, capacity, Dv]), new keys/values
// [B, Hkv, T, D|Dv], positions int [B]. Strides are in elements.
#include "common.h"
#include "kv_cache_append_params.h"

#include <cstdint>

namespace pytransformer {

// The CPU kernel (csrc/cpu/kv_cache_append_kernel.cpp): caches and new rows laid out as `p` says, elements of
// `element_size` bytes copied bit for bit; positions [B] int64, already checked.
using KvCacheAppendCpuFn = void (*)(const KvCacheAppendParams& p, int64_t element_size, void* k_cache, void* v_cache,
                                    const void* k_new, const void* v_new, const int64_t* positions);

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

// max_position, the caller's host-side bound of positions (every positions[b] <= max_position): rows that far in must
// fit. Checked instead of the values themselves where reading them would cost a device-to-host copy (CUDA).
inline void check_append_bound(int64_t max_position, const KvCacheAppendParams& p) {
  TORCH_CHECK_VALUE(max_position >= 0 && max_position <= p.capacity - p.new_len, "max_position: a row at position ",
                    max_position, " would write cache positions ", max_position, "..", max_position + p.new_len - 1,
                    ", outside the cache capacity ", p.capacity, " (expected 0 <= max_position <= capacity - T = ",
                    p.capacity - p.new_len, ")");
}

}  // namespace pytransformer
