#pragma once
// decode_attention's kernel parameters, shared by the CPU and CUDA kernels (conventions: decode_attention.h). Only
// standard headers: the CUDA kernel unit (cuda/decode_attention_kernel.cu) compiles without parsing torch's.
#include <cstdint>

namespace pytransformer {

// Query t of row b sits at position cache_lengths[b] - q_len + t and sees keys p - window < j <= p.
struct DecodeAttentionParams {
  int64_t batch, q_heads, kv_heads, q_len, head_dim, v_head_dim, capacity;
  int64_t window;  // 0: no window (causal only)
  double scale;
  int64_t q_stride[3], k_stride[3], v_stride[3];  // [B, H, L] element strides; the last dim is contiguous
};

}  // namespace pytransformer
