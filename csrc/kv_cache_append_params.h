#pragma once
// kv_cache_append's kernel parameters, shared by the CPU and CUDA kernels (conventions: kv_cache_append.h). Only
// standard headers: the CUDA kernel unit (cuda/kv_cache_append_kernel.cu) compiles without parsing torch's.
#include <cstdint>

namespace pytransformer {

// Where row b of kv_cache_append writes: cache positions positions[b] .. positions[b] + new_len - 1.
struct KvCacheAppendParams {
  int64_t batch, kv_heads, new_len, head_dim, v_head_dim, capacity;
  int64_t k_cache_stride[4], v_cache_stride[4], k_new_stride[4], v_new_stride[4];  // [B, Hkv, L, D] element strides
};

}  // namespace pytransformer
