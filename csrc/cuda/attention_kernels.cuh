#pragma once
// The CUDA attention kernels as the glue (attention.cu) calls them: a SIMT family for every dtype and head dim
// (attention_simt.cuh) and a tensor-core family for float16/bfloat16 (attention_mma.cuh, instantiated once per
// head dim in attention_hdim<D>.cu so that builds run in parallel).
//
// CUDA conventions on top of attention.h: lse is float32 [B, Hq, Lq], contiguous, natural log (-inf for a row that
// sees no key; its output row is zeros). Float masks are float32. The backward reads delta, float32 [B, Hq, Lq]
// contiguous = rowsum(grad_out * out), and writes grad_k / grad_v per K/V head, [B, Hkv, Lk, D|Dv] through
// gk_stride / gv_stride (the kernels sum each GQA group themselves: no per-query-head copies).
#include <cuda_runtime.h>

#include "../attention.h"

namespace pytransformer::cuda {

// ---- SIMT: float32, float16, bfloat16; D and Dv up to kSimtMaxHeadDim; rows with a unit last-dim stride ----
constexpr int kSimtMaxHeadDim = 512;
template <typename T>
void attention_simt_fwd(const AttentionParams& p, cudaStream_t stream);
template <typename T>
void attention_simt_bwd(const AttentionBackwardParams& p, const float* delta, cudaStream_t stream);

// ---- tensor cores: T = __half or __nv_bfloat16; D and Dv multiples of 8 and at most kHeadDim; every row of q, k,
// v, out, grad_out, grad_q, grad_k, grad_v 16-byte aligned (base pointers and row strides) ----
constexpr int kMmaHeadDims[] = {32, 64, 96, 128, 160, 192, 224, 256};
template <typename T, int kHeadDim>
void attention_mma_fwd(const AttentionParams& p, cudaStream_t stream);
// dq_accum: float32 [B, Hq, Lq, D] contiguous and zeroed; the kernel adds grad_q into it with atomics (the glue
// converts it into grad_q). nullptr: deterministic mode, a second kernel writes grad_q itself without atomics.
template <typename T, int kHeadDim>
void attention_mma_bwd(const AttentionBackwardParams& p, const float* delta, float* dq_accum, cudaStream_t stream);

}  // namespace pytransformer::cuda
