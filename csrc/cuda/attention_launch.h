#pragma once
// The CUDA attention kernels as the glue (attention.cpp) calls them: a SIMT family for every dtype and head dim
// (attention_simt.cuh, instantiated in attention_simt.cu) and a tensor-core family for float16/bfloat16
// (attention_mma.cuh, instantiated once per head dim in attention_hdim<D>.cu so that builds run in parallel).
//
// CUDA conventions on top of attention.h: lse is float32 [B, Hq, Lq], contiguous, natural log (-inf for a row that
// sees no key; its output row is zeros). Float masks are float32. The backward reads delta, float32 [B, Hq, Lq]
// contiguous = rowsum(grad_out * out), and writes grad_k / grad_v per K/V head, [B, Hkv, Lk, D|Dv] through
// gk_stride / gv_stride (the kernels sum each GQA group themselves: no per-query-head copies).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>

#include "../attention_params.h"

namespace pytransformer::cuda {

// ---- SIMT: float32, float16, bfloat16; D and Dv up to kSimtMaxHeadDim; rows with a unit last-dim stride ----
constexpr int kSimtMaxHeadDim = 512;
// With p.non_finite, each is the fix-up pass after the tensor-core kernel of the same parameters: it writes again the
// rows whose result is not finite, once the tensor-core kernels set *p.non_finite (attention_mma.cuh, "Hidden keys
// and mma.sync"). attention_simt_bwd is attention_simt_dq with no dq_accum, then attention_simt_dkv.
template <typename T>
void attention_simt_fwd(const AttentionParams& p, cudaStream_t stream);
template <typename T>
void attention_simt_bwd(const AttentionBackwardParams& p, const float* delta, cudaStream_t stream);
// dq_accum: the tensor-core backward's atomic dQ sums (below), converted into grad_q, where a row whose sums are not
// finite is summed again.
template <typename T>
void attention_simt_dq(const AttentionBackwardParams& p, const float* delta, const float* dq_accum,
                       cudaStream_t stream);
template <typename T>
void attention_simt_dkv(const AttentionBackwardParams& p, const float* delta, cudaStream_t stream);
// delta = rowsum(grad_out * out) over the [B, Hq, Lq] rows of p.fwd, float32 contiguous: what the backward kernels
// read.
template <typename T>
void attention_delta(const AttentionBackwardParams& p, float* delta, cudaStream_t stream);

// ---- tensor cores: T = __half or __nv_bfloat16; D and Dv multiples of 8 and at most kHeadDim; every row of q, k,
// v, out, grad_out, grad_q, grad_k, grad_v 16-byte aligned (base pointers and row strides) ----
constexpr int kMmaHeadDims[] = {32, 64, 96, 128, 160, 192, 224, 256};
constexpr size_t kMmaElemBytes = 2;

// Tile shapes of the tensor-core kernels for one head dim (kHeadDim: the instantiation's head dim, >= D and Dv) and
// the dynamic shared memory each kernel takes (the glue compares it with the device's limit before choosing them).
template <int kHeadDim>
struct MmaTiles {
  static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256);
  static constexpr int kLd = kHeadDim + 8;  // shared-memory row: +16 bytes, conflict-free ldmatrix (kHeadDim % 16 == 0)
  static constexpr int kFwdWarps = 4;
  static constexpr int kFwdRowTiles = kHeadDim <= 128 ? 2 : 1;  // 16-query row tiles a warp (as FA2: 128-row blocks)
  static constexpr int kFwdBlockM = 16 * kFwdRowTiles * kFwdWarps;
  static constexpr int kFwdBlockN = kHeadDim <= 128 ? 64 : 32;
  static constexpr int kDqWarps = 4;  // the deterministic dQ kernel: 16 queries a warp, key tiles of kFwdBlockN
  static constexpr int kDqBlockM = 16 * kDqWarps;
  // Backward dK/dV (FA2's warp layout): 8 warps, each with 16 * kBwdRowTiles keys; the kBwdDSplit (2) warps that
  // share those keys split the query tile for S^T, P^T, dS^T (exchanged through shared memory) and the head dim for
  // dK, dV (so that both fit a thread's registers).
  static constexpr int kBwdWarps = 8;
  static constexpr int kBwdDSplit = 2;
  static constexpr int kBwdRowTiles = kHeadDim <= 128 ? 2 : 1;
  static constexpr int kBwdBlockN = 16 * kBwdRowTiles * kBwdWarps / kBwdDSplit;
  static constexpr int kBwdBlockM = kHeadDim <= 192 ? 64 : 32;  // 32: fits sm_80's 163 KB
  static constexpr int kLdS = kBwdBlockM + 8;  // the dS^T and P^T tiles [kBwdBlockN][kBwdBlockM] in shared memory
  // forward: Q, K, V tiles; backward dK/dV: K, V, two stages of the Q, lse and delta tiles, dO, dS^T, P^T; dQ
  // kernel: Q, dO and two stages of the K, V tiles.
  static constexpr size_t kFwdSmem = size_t(kFwdBlockM + 2 * kFwdBlockN) * kLd * kMmaElemBytes;
  static constexpr size_t kBwdDkDvSmem = size_t(2 * kBwdBlockN + 3 * kBwdBlockM) * kLd * kMmaElemBytes +
                                         4 * kBwdBlockM * sizeof(float) + 2 * size_t(kBwdBlockN) * kLdS * kMmaElemBytes;
  static constexpr size_t kDqSmem = size_t(2 * kDqBlockM + 4 * kFwdBlockN) * kLd * kMmaElemBytes;
  static constexpr size_t kBwdSmem = std::max(kBwdDkDvSmem, kDqSmem);  // the most of either mode
};
template <typename T, int kHeadDim>
void attention_mma_fwd(const AttentionParams& p, cudaStream_t stream);
// dq_accum: float32 [B, Hq, Lq, D] contiguous and zeroed; the kernel adds grad_q into it with atomics (the glue
// converts it into grad_q with attention_simt_dq). nullptr: deterministic mode, a second kernel writes grad_q itself
// without atomics.
template <typename T, int kHeadDim>
void attention_mma_bwd(const AttentionBackwardParams& p, const float* delta, float* dq_accum, cudaStream_t stream);

}  // namespace pytransformer::cuda
