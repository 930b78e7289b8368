#pragma once
// Tensor-core attention for float16/bfloat16 (FlashAttention-2 style), instantiated per head dim in
// attention_hdim<D>.cu. Contract (shapes, conventions, alignment): attention_launch.h; masks: attention.h.
//
// Every product is warp-level mma.sync m16n8k16 (mma.cuh) on tiles in shared memory (rows padded by 16 bytes, so
// that the 8 row addresses of an ldmatrix fall in distinct banks), float32 accumulators in registers; operands
// arrive by cp.async (zero-filled past the ends of the tensors and past D / Dv, so padding contributes zeros).
// Scores are handled in log2 units: x = s * scale * log2(e) (+ float mask * log2(e)), p = exp2(x - max).
//
//   forward      block = kFwdBlockM queries of one (b, h), 16 * kFwdRowTiles per warp (the row tiles share each
//                K / V fragment a warp loads); loops over key tiles with an online
//                softmax; K of the next tile is loaded while P V runs, V while Q K^T runs.
//   backward     block = kBwdBlockN keys of one (b, K/V head) over 8 warps (FA2's layout): a warp has 16 or 32 keys
//                (kBwdRowTiles) and shares them with one other warp; each of the two computes S^T, P^T and dS^T for
//                half of the query tile (through shared memory for the products after) and dK, dV (registers) for
//                half of the head dim; loops over the GQA group's query heads and the query tiles that see the keys,
//                recomputing P^T from lse:
//                  S^T = K Q^T,  P^T = exp2(x - lse),  dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T (dP^T - delta),
//                  dK += dS^T Q,  and (atomic mode) dQ += dS K through shared memory and float32 atomics.
//   backward dQ  deterministic mode: block = kDqBlockM queries, loops over key tiles: dQ = sum dS K, no atomics.
#include <c10/cuda/CUDAException.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "attention_launch.h"
#include "common.cuh"
#include "mma.cuh"

namespace pytransformer::cuda {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Rows [0, kRows) x columns [0, kCols) of a tile into shared memory (row pitch ld_s) from global rows g + r * ld_g,
// asynchronously; rows >= rows_valid and columns >= cols_valid (a multiple of 8) are zero-filled. A thread keeps one
// 16-byte column chunk and walks down the rows with one running pointer (threads past the last whole row of chunks
// idle), so that no per-chunk 64-bit address stays live across the caller's loop.
template <int kRows, int kCols, int kThreads, typename T>
__device__ __forceinline__ void load_tile(T* s, int ld_s, const T* g, int64_t ld_g, int64_t rows_valid,
                                          int64_t cols_valid) {
  constexpr int kChunksPerRow = kCols / 8, kRowsPerPass = kThreads / kChunksPerRow;
  constexpr int kPasses = (kRows + kRowsPerPass - 1) / kRowsPerPass;
  static_assert(kRowsPerPass > 0);
  const int r0 = threadIdx.x / kChunksPerRow, col = threadIdx.x % kChunksPerRow * 8;
  if (r0 >= kRowsPerPass) return;
  const bool col_valid = col < cols_valid;
  const T* src = g + r0 * ld_g + col;
#pragma unroll
  for (int pass = 0; pass < kPasses; ++pass, src += kRowsPerPass * ld_g) {
    const int r = r0 + pass * kRowsPerPass;
    if (kRows % kRowsPerPass != 0 && r >= kRows) break;
    const bool valid = col_valid && r < rows_valid;
    cp_async_16(s + r * ld_s + col, valid ? src : g, valid);
  }
}

template <typename T>
__device__ __forceinline__ const T* operand_row(const void* base, const int64_t (&stride)[3], int64_t b, int64_t h,
                                                int64_t i) {
  return static_cast<const T*>(base) + b * stride[0] + h * stride[1] + i * stride[2];
}

// Keys past the row's end: min(Lk, key_lengths[b]).
__device__ __forceinline__ int64_t key_end(const AttentionParams& p, int64_t b) {
  return p.key_lengths && p.key_lengths[b] < p.len_k ? p.key_lengths[b] : p.len_k;
}

// Whether the tile of queries [i0, i1) x keys [j0, j1) needs no per-element masking.
__device__ __forceinline__ bool tile_is_clean(const AttentionParams& p, int64_t b, int64_t i0, int64_t i1, int64_t j0,
                                              int64_t j1) {
  return p.mask_kind == MaskKind::kNone && j1 <= key_end(p, b) && !block_partially_hidden(p, i0, i1, j0, j1);
}

// Score s of query i, key j in log2 units, or -inf where the key is hidden (queries past Lq see nothing). Positions
// are 32-bit (the glue sends only Lq, Lk < 2^30 here); `mask` points at the (b, h) plane of the mask.
__device__ __forceinline__ float masked_score(const AttentionParams& p, const void* mask, float s, float scale_log2,
                                              int i, int j, int keys_end) {
  const int pos = i + static_cast<int>(p.len_k - p.len_q);
  if (i >= p.len_q || j >= keys_end || (p.causal && (j > pos || (p.window > 0 && j <= pos - p.window))))
    return -INFINITY;
  float x = s * scale_log2;
  if (p.mask_kind != MaskKind::kNone) {
    const int64_t at = i * p.mask_stride[2] + j * p.mask_stride[3];
    if (p.mask_kind == MaskKind::kBool) {
      if (!static_cast<const bool*>(mask)[at]) return -INFINITY;
    } else {
      const float m = static_cast<const float*>(mask)[at];
      if (m == -INFINITY) return -INFINITY;  // not added: a NaN or inf score of a hidden key stays hidden
      x += m * kLog2e;
    }
  }
  return x;
}

// ---- Hidden keys and mma.sync ----
// A hidden key's weight is exactly 0, but inside mma.sync 0 x NaN and 0 x inf are NaN: a NaN or inf in the V row (or
// the K row, in dS K; or in q or dO) of a hidden key reaches every row that shares its tiles. Such a value always
// leaves the row's result non-finite, so each kernel notes that a value it writes is not finite (store_tile; then
// *p.non_finite = 1), and the glue runs the SIMT kernels after it as a fix-up pass over such rows, which keeps hidden
// keys out (attention_simt.cuh). The atomic dQ, summed across blocks, is checked where it is converted into grad_q.

// A warp's score tile acc [16 rows][kNT * 8 columns] (rows row0.., columns col0..) to log2 units, masked unless
// `clean`; returns the factor that the caller's exponent still applies: exp2(fmaf(acc, factor, -max)). A clean tile
// with a positive scale stays raw (factor scale_log2: the scale goes into that FMA, and commutes with a row max);
// the others are scaled here (factor 1). kKeysAreRows: rows are keys and columns queries (the backward's S^T), else
// the other way round.
template <bool kKeysAreRows, int kNT>
__device__ __forceinline__ float scale_and_mask(float (*acc)[4], const AttentionParams& p, int64_t b, int64_t h,
                                                int64_t row0, int64_t col0, bool clean, float scale_log2) {
  if (clean && scale_log2 > 0.f) return scale_log2;
  if (clean) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] *= scale_log2;
    return 1.f;
  }
  const int lane = lane_id(), g = lane / 4, t = lane % 4;
  const int keys_end = static_cast<int>(key_end(p, b));
  const void* mask = p.mask_kind == MaskKind::kNone
                         ? nullptr
                         : static_cast<const char*>(p.mask) + (b * p.mask_stride[0] + h * p.mask_stride[1]) *
                                                                  (p.mask_kind == MaskKind::kBool ? 1 : 4);
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = static_cast<int>(row0) + g + 8 * (e / 2), c = static_cast<int>(col0) + nt * 8 + 2 * t + e % 2;
      acc[nt][e] = masked_score(p, mask, acc[nt][e], scale_log2, kKeysAreRows ? c : r, kKeysAreRows ? r : c, keys_end);
    }
  return 1.f;
}

// A warp's product over kRT row tiles of 16: acc [kRT * 16][kNT * 8] (row tile rt at acc[rt * kNT..]) += A B over kKS
// k-steps of 16. a_frag(a, rt, ks) loads A's fragment of row tile rt and k-step ks, b_frags(b, ks, n0) B's fragments
// of the n-tiles n0 and n0 + 8 of that k-step, which all the row tiles use.
template <int kRT, int kNT, int kKS, typename T, class AFrag, class BFrags>
__device__ __forceinline__ void warp_gemm(float (*acc)[4], AFrag&& a_frag, BFrags&& b_frags) {
  static_assert(kNT % 2 == 0);
#pragma unroll
  for (int ks = 0; ks < kKS; ++ks) {
    Frag a[kRT];
#pragma unroll
    for (int rt = 0; rt < kRT; ++rt) a_frag(a[rt], rt, ks);
#pragma unroll
    for (int np = 0; np < kNT / 2; ++np) {
      Frag bb;
      b_frags(bb, ks, np * 16);
#pragma unroll
      for (int rt = 0; rt < kRT; ++rt) {
        mma_16816<T>(acc[rt * kNT + 2 * np], a[rt], bb);
        mma_16816<T>(acc[rt * kNT + 2 * np + 1], a[rt], bb + 2);
      }
    }
  }
}

// acc [kRT * 16][kNT * 8] += A B^T, A = sA rows a_row0.. + 16 * kRT, columns 0..16 * kKS, B = sB rows 0..kNT * 8
// (row-major [n][k]).
template <int kRT, int kNT, int kKS, typename T>
__device__ __forceinline__ void warp_gemm_nt(float (*acc)[4], const T* sA, int lda, int a_row0, const T* sB, int ldb) {
  warp_gemm<kRT, kNT, kKS, T>(
      acc, [&](Frag& a, int rt, int ks) { load_a(a, sA, lda, a_row0 + 16 * rt, ks * 16); },
      [&](Frag& b, int ks, int n0) { load_b_nk(b, sB, ldb, n0, ks * 16); });
}

// acc [kRT * 16][kNT * 8] += A B, A = sA rows a_row0.. + 16 * kRT, columns 0..16 * kKS, B = sB rows 0..16 * kKS,
// columns b_col0.. (both row-major: [m][k] and [k][n]).
template <int kRT, int kNT, int kKS, typename T>
__device__ __forceinline__ void warp_gemm_nn(float (*acc)[4], const T* sA, int lda, int a_row0, const T* sB, int ldb,
                                             int b_col0) {
  warp_gemm<kRT, kNT, kKS, T>(
      acc, [&](Frag& a, int rt, int ks) { load_a(a, sA, lda, a_row0 + 16 * rt, ks * 16); },
      [&](Frag& b, int ks, int n0) { load_b_kn(b, sB, ldb, ks * 16, b_col0 + n0); });
}

// The A fragment of k-step ks from a warp's float32 accumulator tile of 16 rows (its columns become A's k dimension).
template <typename T>
__device__ __forceinline__ void acc_to_a(Frag& a, const float (*acc)[4], int ks) {
  a[0] = pack2<T>(acc[2 * ks][0], acc[2 * ks][1]);
  a[1] = pack2<T>(acc[2 * ks][2], acc[2 * ks][3]);
  a[2] = pack2<T>(acc[2 * ks + 1][0], acc[2 * ks + 1][1]);
  a[3] = pack2<T>(acc[2 * ks + 1][2], acc[2 * ks + 1][3]);
}

// acc [kRT * 16][kNT * 8] += P B, P = the warp's accumulator tiles p [kRT * 16][kKS * 16] (row tile rt at
// p[rt * 2 * kKS..], rounded to T), B = sB rows 0..16 * kKS, columns b_col0.. (row-major [k][n]).
template <int kRT, int kNT, int kKS, typename T>
__device__ __forceinline__ void warp_gemm_pn(float (*acc)[4], const float (*p)[4], const T* sB, int ldb, int b_col0) {
  warp_gemm<kRT, kNT, kKS, T>(
      acc, [&](Frag& a, int rt, int ks) { acc_to_a<T>(a, p + rt * 2 * kKS, ks); },
      [&](Frag& b, int ks, int n0) { load_b_kn(b, sB, ldb, ks * 16, b_col0 + n0); });
}

// Sum over the 4 threads of a quad (the threads that hold one row of an accumulator tile).
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ __forceinline__ float quad_max(float v) {
  v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return max_nan(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// Writes a warp's tile acc [16][kNT * 8] * scale to rows row0.. (< rows) and columns < cols of a T matrix with row
// pitch ld (two elements per store: cols is a multiple of 8); returns whether a value it wrote is an inf or a NaN (in
// float32: a finite value that T rounds to inf is not one).
template <int kNT, typename T>
__device__ __forceinline__ bool store_tile(T* out, int64_t ld, const float (*acc)[4], int64_t row0, int64_t rows,
                                           int64_t cols, float scale) {
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  bool any_non_finite = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + g + 8 * r;
    if (row >= rows) continue;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int col = nt * 8 + 2 * t;
      if (col < cols) {
        const float a = acc[nt][2 * r] * scale, b = acc[nt][2 * r + 1] * scale;
        any_non_finite |= non_finite(a) || non_finite(b);
        *reinterpret_cast<uint32_t*>(out + row * ld + col) = pack2<T>(a, b);
      }
    }
  }
  return any_non_finite;
}

// The backward's statistics of query i of head h: lse in log2 units (+inf for rows past Lq or that saw no key, so
// that their P is zero) and delta (0 past Lq).
__device__ __forceinline__ void row_stats(const AttentionParams& p, const float* delta, int64_t b, int64_t h,
                                          int64_t i, float& lse, float& dlt) {
  if (i >= p.len_q) {
    lse = INFINITY, dlt = 0.f;
    return;
  }
  const int64_t row = (b * p.heads_q + h) * p.len_q + i;
  const float v = static_cast<const float*>(p.lse)[row];
  lse = v == -INFINITY ? INFINITY : v * kLog2e;
  dlt = delta[row];
}

// ---------------------------------------------------------------------------------------------------------------

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(MmaTiles<kHeadDim>::kFwdWarps * 32)
    attention_mma_fwd_kernel(const AttentionParams p) {
#if PT_TENSOR_CORES  // (mma.cuh) an empty body before sm_80
  using Tiles = MmaTiles<kHeadDim>;
  constexpr int kM = Tiles::kFwdBlockM, kN = Tiles::kFwdBlockN, kLd = Tiles::kLd, kRT = Tiles::kFwdRowTiles;
  constexpr int kThreads = Tiles::kFwdWarps * 32, kNT = kN / 8, kDT = kHeadDim / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [kM][kLd]
  T* sK = sQ + kM * kLd;                   // [kN][kLd]
  T* sV = sK + kN * kLd;                   // [kN][kLd]

  const int64_t m_blocks = (p.len_q + kM - 1) / kM;
  const int64_t m0 = (m_blocks - 1 - blockIdx.x % m_blocks) * kM;  // the costliest (causal) blocks first
  const int64_t h = blockIdx.x / m_blocks % p.heads_q, b = blockIdx.x / (m_blocks * p.heads_q);
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const int64_t nq = p.len_q - m0 < kM ? p.len_q - m0 : kM;
  const KeyRange keys = visible_keys(p, b, m0, m0 + nq);
  const int64_t keys_end = key_end(p, b);  // K and V rows from here on load as zeros: padding never reaches P V
  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  const T* k = operand_row<T>(p.k, p.k_stride, b, hk, 0);
  const T* v = operand_row<T>(p.v, p.v_stride, b, hk, 0);

  // The warp's kRT row tiles of 16 queries, rows row0..; the thread holds rows g and g + 8 of each (index 2 rt + r).
  const int row0 = warp * 16 * kRT;
  float o[kRT * kDT][4] = {};
  float row_max[2 * kRT], row_sum[2 * kRT];
#pragma unroll
  for (int i = 0; i < 2 * kRT; ++i) row_max[i] = -INFINITY, row_sum[i] = 0.f;
  if (keys.lo < keys.hi) {
    const int64_t n_first = keys.lo / kN * kN, tiles = (keys.hi - n_first + kN - 1) / kN;
    load_tile<kM, kHeadDim, kThreads>(sQ, kLd, operand_row<T>(p.q, p.q_stride, b, h, m0), p.q_stride[2], nq, p.dim);
    load_tile<kN, kHeadDim, kThreads>(sK, kLd, k + n_first * p.k_stride[2], p.k_stride[2], keys_end - n_first, p.dim);
    cp_async_commit();
    for (int64_t it = 0; it < tiles; ++it) {
      const int64_t n0 = n_first + it * kN;
      cp_async_wait<0>();
      __syncthreads();  // K (and Q) landed; every warp is done with the previous V
      load_tile<kN, kHeadDim, kThreads>(sV, kLd, v + n0 * p.v_stride[2], p.v_stride[2], keys_end - n0, p.dim_v);
      cp_async_commit();

      float s[kRT * kNT][4] = {};
      warp_gemm_nt<kRT, kNT, kHeadDim / 16>(s, sQ, kLd, row0, sK, kLd);
      const bool clean = tile_is_clean(p, b, m0, m0 + kM, n0, n0 + kN);
      float factor = 1.f;  // the same for every row tile (one `clean`)
#pragma unroll
      for (int rt = 0; rt < kRT; ++rt)
        factor = scale_and_mask<false, kNT>(s + rt * kNT, p, b, h, m0 + row0 + 16 * rt, n0, clean, scale_log2);
      // Online softmax for the thread's rows (row_max in log2 units).
#pragma unroll
      for (int i = 0; i < 2 * kRT; ++i) {
        float(*srow)[4] = s + i / 2 * kNT;
        const int r = i % 2;
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) tile_max = max_nan(tile_max, max_nan(srow[nt][2 * r], srow[nt][2 * r + 1]));
        const float mx = max_nan(row_max[i], quad_max(tile_max) * factor);
        const float base = mx == -INFINITY ? 0.f : mx;  // a row with nothing visible yet keeps p = 0
        const float alpha = exp2f(row_max[i] - base);
        row_max[i] = mx;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) {
            srow[nt][e] = exp2f(fmaf(srow[nt][e], factor, -base));
            sum += srow[nt][e];
          }
        row_sum[i] = row_sum[i] * alpha + sum;  // per-thread partial sums; the quad's are added at the end
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt) o[i / 2 * kDT + dt][2 * r] *= alpha, o[i / 2 * kDT + dt][2 * r + 1] *= alpha;
      }
      cp_async_wait<0>();
      __syncthreads();  // V landed; every warp is done with K
      if (it + 1 < tiles) {
        load_tile<kN, kHeadDim, kThreads>(sK, kLd, k + (n0 + kN) * p.k_stride[2], p.k_stride[2], keys_end - n0 - kN,
                                          p.dim);
        cp_async_commit();
      }
      // P rounded to T as A fragments now, so that the float32 scores are dead during P V. The fragments are copied
      // by a loop: std::copy would lower to __builtin_memmove, which nvcc drops from device code.
      Frag pf[kRT][kN / 16];
#pragma unroll
      for (int rt = 0; rt < kRT; ++rt)
#pragma unroll
        for (int ks = 0; ks < kN / 16; ++ks) acc_to_a<T>(pf[rt][ks], s + rt * kNT, ks);
      warp_gemm<kRT, kDT, kN / 16, T>(
          o,
          [&](Frag& a, int rt, int ks) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = pf[rt][ks][i];
          },
          [&](Frag& b, int ks, int n0) { load_b_kn(b, sV, kLd, ks * 16, n0); });
    }
  }
#pragma unroll
  for (int i = 0; i < 2 * kRT; ++i) {
    const int r = i % 2;
    row_sum[i] = quad_sum(row_sum[i]);
    const float inv = row_sum[i] > 0.f ? 1.f / row_sum[i] : 0.f;
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt) o[i / 2 * kDT + dt][2 * r] *= inv, o[i / 2 * kDT + dt][2 * r + 1] *= inv;
    const int64_t q_row = m0 + row0 + 16 * (i / 2) + g + 8 * r;
    if (t == 0 && q_row < p.len_q)
      static_cast<float*>(p.lse)[(b * p.heads_q + h) * p.len_q + q_row] =
          row_sum[i] > 0.f ? (row_max[i] + log2f(row_sum[i])) * kLn2 : -INFINITY;
  }
  T* out = static_cast<T*>(p.out) + b * p.o_stride[0] + h * p.o_stride[1] + m0 * p.o_stride[2];
  bool non_finite_out = false;  // (see "Hidden keys and mma.sync")
#pragma unroll
  for (int rt = 0; rt < kRT; ++rt)
    non_finite_out |= store_tile<kDT>(out, p.o_stride[2], o + rt * kDT, row0 + 16 * rt, nq, p.dim_v, 1.f);
  if (non_finite_out && p.non_finite) *p.non_finite = 1;
#endif
}

// ---------------------------------------------------------------------------------------------------------------

// Column slices of the atomic dQ product dS K: the most (at most `slices`, dividing it) whose width kHeadDim / n is
// a multiple of 16 (two mma n-tiles).
constexpr int dq_column_slices(int slices, int head_dim) {
  for (int n = slices; n > 1; --n)
    if (slices % n == 0 && head_dim % (16 * n) == 0) return n;
  return 1;
}

// Query row tiles a warp takes in that product: 2 (a 32-row warp tile: 4 ldmatrix per 8 mma instead of 5) where
// the warps then still split the head dim into one slice each, else 1.
constexpr int dq_row_tiles(int warps, int row_tiles, int head_dim) {
  const int slices = row_tiles % 2 == 0 ? warps / (row_tiles / 2) : 0;
  return slices > 0 && warps % (row_tiles / 2) == 0 && dq_column_slices(slices, head_dim) == slices ? 2 : 1;
}

#ifdef PT_ATTENTION_BWD_DEBUG
// Debug switch, off unless defined before this header is included (tools/gpu_probes/attention_probe.cu does): block 0
// of the dK/dV kernel writes its first step's parameters (BwdDebugHeader) and its S^T (log2 units, scaled and masked),
// P^T, dP^T and dS^T tiles to attention_bwd_debug, which the caller points at kBwdDebugHeader + kBwdDebugPlanes *
// kBwdBlockN * kBwdBlockM floats: plane [kBwdBlockN keys][kBwdBlockM queries] of the block. Off, it adds no code.
enum BwdDebugHeader { kDbgN0, kDbgM0, kDbgHead, kDbgFactor, kDbgScaleLog2, kDbgLenQ, kDbgLenK, kDbgDim, kDbgDimV,
                      kDbgHeadsQ, kDbgHeadsKv, kDbgCausal, kDbgWindow, kDbgBlockN, kDbgBlockM, kBwdDebugHeader };
enum BwdDebugPlane { kDbgS, kDbgP, kDbgDP, kDbgDS, kBwdDebugPlanes };
static __device__ float* attention_bwd_debug;

// A warp's tile acc [16 * kRT keys (rows key_row0..)][8 * kMT queries (columns q_col0..)] times factor into `plane`.
template <int kHeadDim>
__device__ void bwd_debug_tile(BwdDebugPlane plane, const float (*acc)[4], float factor, int key_row0, int q_col0,
                               const AttentionParams& p, int64_t n0, int64_t m0, int64_t h, float scale_log2) {
  using Tiles = MmaTiles<kHeadDim>;
  constexpr int kN = Tiles::kBwdBlockN, kM = Tiles::kBwdBlockM, kRT = Tiles::kBwdRowTiles;
  constexpr int kMT = kM / 8 / Tiles::kBwdDSplit;
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  float* out = attention_bwd_debug;
  if (plane == kDbgS && threadIdx.x == 0) {
    const float header[kBwdDebugHeader] = {
        float(n0),      float(m0),        float(h),          factor,         scale_log2,
        float(p.len_q), float(p.len_k),   float(p.dim),      float(p.dim_v), float(p.heads_q),
        float(p.heads_kv), float(p.causal), float(p.window), float(kN),      float(kM)};
    for (int i = 0; i < kBwdDebugHeader; ++i) out[i] = header[i];
  }
  float* tile = out + kBwdDebugHeader + plane * kN * kM;
  for (int i = 0; i < kRT * kMT; ++i)
    for (int e = 0; e < 4; ++e) {
      const int key = key_row0 + 16 * (i / kMT) + g + 8 * (e / 2), query = q_col0 + i % kMT * 8 + 2 * t + e % 2;
      tile[key * kM + query] = acc[i][e] * factor;
    }
}
#define PT_BWD_DEBUG_TILE(plane, acc, factor)                                                                  \
  do {                                                                                                         \
    if (blockIdx.x == 0 && first_step)                                                                         \
      bwd_debug_tile<kHeadDim>(plane, acc, factor, key_row0, q_col0, p, n0, m0, h, scale_log2);                \
  } while (0)
#else
#define PT_BWD_DEBUG_TILE(plane, acc, factor) \
  do {                                        \
  } while (0)
#endif

// The dK/dV kernel's first products for one warp: P^T and dS^T of its keys n0 + key_row0.. (kRT row tiles of 16) and
// its queries m0 + q_col0.. (kMT n-tiles of 8), in registers: S^T = K Q^T (log2 units, masked unless `clean`),
// P^T = exp2(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - delta). sLse and sDelta start at the warp's query column.
template <typename T, int kHeadDim>
__device__ __forceinline__ void bwd_probs_and_ds(float (*pt)[4], float (*ds)[4], const T* sK, const T* sV,
                                                 const T* sQ, const T* sdO, const float* sLse, const float* sDelta,
                                                 const AttentionParams& p, int64_t b, int64_t h, int64_t n0,
                                                 int64_t m0, int key_row0, int q_col0, bool clean, float scale_log2,
                                                 bool first_step) {
  using Tiles = MmaTiles<kHeadDim>;
  constexpr int kRT = Tiles::kBwdRowTiles, kMT = Tiles::kBwdBlockM / 8 / Tiles::kBwdDSplit, kLd = Tiles::kLd;
  const int t = threadIdx.x % 4;
  warp_gemm_nt<kRT, kMT, kHeadDim / 16>(pt, sK, kLd, key_row0, sQ + q_col0 * kLd, kLd);
  float factor = 1.f;  // the same for every row tile (one `clean`)
#pragma unroll
  for (int rt = 0; rt < kRT; ++rt)
    factor = scale_and_mask<true, kMT>(pt + rt * kMT, p, b, h, n0 + key_row0 + 16 * rt, m0 + q_col0, clean,
                                       scale_log2);
  PT_BWD_DEBUG_TILE(kDbgS, pt, factor);
#pragma unroll
  for (int i = 0; i < kRT * kMT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) pt[i][e] = exp2f(fmaf(pt[i][e], factor, -sLse[i % kMT * 8 + 2 * t + e % 2]));
  PT_BWD_DEBUG_TILE(kDbgP, pt, 1.f);
  warp_gemm_nt<kRT, kMT, kHeadDim / 16>(ds, sV, kLd, key_row0, sdO + q_col0 * kLd, kLd);
  PT_BWD_DEBUG_TILE(kDbgDP, ds, 1.f);
#pragma unroll
  for (int i = 0; i < kRT * kMT; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) ds[i][e] = pt[i][e] * (ds[i][e] - sDelta[i % kMT * 8 + 2 * t + e % 2]);
  PT_BWD_DEBUG_TILE(kDbgDS, ds, 1.f);
}

// The dK/dV kernel's atomic dQ: dQ [kM queries from m0][D] += scale * dS K, from dS^T and K in shared memory, added
// to the float32 dq_accum. Warp w computes the kRTq query row tiles of group w % kQG in the column slice w / kQG
// (kSlices slices of the head dim when there are more warps than row groups; warps past kQG * kSlices idle when the
// head dim does not split evenly into slices of 16 columns). warp, g, t are the caller's: recomputed here from
// threadIdx, they tip the head-dim-128 kernel (255 registers) into local memory, which tools/ptxas_gate.py rejects.
template <typename T, int kHeadDim>
__device__ __forceinline__ void bwd_atomic_dq(float* dq_accum, const T* sdS, const T* sK, const AttentionParams& p,
                                              int64_t b, int64_t h, int64_t m0, int warp, int g, int t) {
  using Tiles = MmaTiles<kHeadDim>;
  constexpr int kWarps = Tiles::kBwdWarps, kN = Tiles::kBwdBlockN, kM = Tiles::kBwdBlockM;
  constexpr int kLd = Tiles::kLd, kLdS = Tiles::kLdS;
  constexpr int kQT = kM / 16, kRTq = dq_row_tiles(kWarps, kQT, kHeadDim), kQG = kQT / kRTq;
  constexpr int kSlices = dq_column_slices(kWarps / kQG, kHeadDim), kCols = kHeadDim / kSlices;
  static_assert(kWarps % kQG == 0);
  const int qg = warp % kQG, col0 = warp / kQG * kCols;
  if (warp < kQG * kSlices) {
    float dq[kRTq * kCols / 8][4] = {};
    warp_gemm<kRTq, kCols / 8, kN / 16, T>(
        dq, [&](Frag& a, int rt, int ks) { load_a_t(a, sdS, kLdS, ks * 16, (qg * kRTq + rt) * 16); },
        [&](Frag& b, int ks, int n0) { load_b_kn(b, sK, kLd, ks * 16, col0 + n0); });
    const float scale = static_cast<float>(p.scale);
    float* dq_rows = dq_accum + ((b * p.heads_q + h) * p.len_q + m0) * p.dim;
#pragma unroll
    for (int i = 0; i < 2 * kRTq; ++i) {
      const int64_t row = (qg * kRTq + i / 2) * 16 + g + 8 * (i % 2);
      if (m0 + row >= p.len_q) continue;
#pragma unroll
      for (int nt = 0; nt < kCols / 8; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = col0 + nt * 8 + 2 * t + e;
          if (col < p.dim)
            atomicAdd(dq_rows + row * p.dim + col, dq[i / 2 * (kCols / 8) + nt][2 * (i % 2) + e] * scale);
        }
    }
  }
}

template <typename T, int kHeadDim, bool kAtomicDq>
__global__ void __launch_bounds__(MmaTiles<kHeadDim>::kBwdWarps * 32)
    attention_mma_bwd_kernel(const AttentionBackwardParams bp, const float* delta, float* dq_accum) {
#if PT_TENSOR_CORES  // (mma.cuh) an empty body before sm_80
  using Tiles = MmaTiles<kHeadDim>;
  constexpr int kWarps = Tiles::kBwdWarps, kThreads = kWarps * 32, kSplit = Tiles::kBwdDSplit;
  constexpr int kN = Tiles::kBwdBlockN, kM = Tiles::kBwdBlockM, kLd = Tiles::kLd, kLdS = Tiles::kLdS;
  // A warp: keys key_row0.. (kRT row tiles of 16); its S^T, P^T, dS^T over query columns q_col0.. (kMT n-tiles) and
  // its dK, dV over head-dim columns d_col0.. (kDT n-tiles). Row tile rt of a warp tile is at [rt * kMT..] or
  // [rt * kDT..].
  constexpr int kRT = Tiles::kBwdRowTiles, kKeyGroups = kN / (16 * kRT);
  constexpr int kMT = kM / 8 / kSplit, kDT = kHeadDim / 8 / kSplit;
  static_assert(kKeyGroups * kSplit == kWarps);
  const AttentionParams& p = bp.fwd;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);    // [kN][kLd]
  T* sV = sK + kN * kLd;                     // [kN][kLd]
  T* sQ_stages = sV + kN * kLd;              // [2][kM][kLd]
  T* sdO = sQ_stages + 2 * kM * kLd;         // [kM][kLd]
  float* sLse_stages = reinterpret_cast<float*>(sdO + kM * kLd);  // [2][kM]
  float* sDelta_stages = sLse_stages + 2 * kM;                     // [2][kM]
  T* sdS = reinterpret_cast<T*>(sDelta_stages + 2 * kM);           // [kN][kLdS]
  T* sPt = sdS + kN * kLdS;                                         // [kN][kLdS]

  const int64_t n_blocks = (p.len_k + kN - 1) / kN;
  const int64_t n0 = blockIdx.x % n_blocks * kN, hk = blockIdx.x / n_blocks % p.heads_kv;
  const int64_t b = blockIdx.x / (n_blocks * p.heads_kv), group = p.heads_q / p.heads_kv;
  const int warp = threadIdx.x / 32, key_row0 = warp % kKeyGroups * 16 * kRT, part = warp / kKeyGroups;
  const int q_col0 = part * (kM / kSplit), d_col0 = part * (kHeadDim / kSplit);
  const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  // Queries [i_lo, i_hi) that may see a key of [n0, n0 + kN) (before key padding and masks): visible_queries of its
  // first and last key, written out (through visible_queries the head-dim-128 kernel spills).
  const int64_t shift = p.len_k - p.len_q;
  int64_t i_lo = 0, i_hi = n0 < key_end(p, b) ? p.len_q : 0;
  if (p.causal) i_lo = n0 - shift > 0 ? n0 - shift : 0;
  if (p.window > 0 && n0 + kN - 1 - shift + p.window < i_hi) i_hi = n0 + kN - 1 - shift + p.window;
  // Steps: (query head of the GQA group, query tile) pairs, heads outermost. Step s works on Q stage s % 2 while
  // step s + 1's Q tile arrives by cp.async into the other stage and its lse and delta wait in registers; dO has one
  // buffer, whose next tile is loaded once every warp is done with dV += P^T dO (during dK and dQ).
  const int64_t m_first = i_lo / kM * kM, m_tiles = i_lo < i_hi ? (i_hi - m_first + kM - 1) / kM : 0;
  const int64_t steps = group * m_tiles;
  auto load_q = [&](int stage, int64_t h, int64_t m0) {
    load_tile<kM, kHeadDim, kThreads>(sQ_stages + stage * kM * kLd, kLd, operand_row<T>(p.q, p.q_stride, b, h, m0),
                                      p.q_stride[2], p.len_q - m0, p.dim);
  };
  auto load_do = [&](int64_t h, int64_t m0) {
    load_tile<kM, kHeadDim, kThreads>(sdO, kLd, operand_row<T>(bp.grad_out, bp.go_stride, b, h, m0), bp.go_stride[2],
                                      p.len_q - m0, p.dim_v);
  };
  // A warp's [16 * kRT keys][kMT * 8 queries] tile into shared memory, rounded to T.
  auto stash = [&](T* s, const float (*acc)[4]) {
#pragma unroll
    for (int rt = 0; rt < kRT; ++rt)
#pragma unroll
      for (int nt = 0; nt < kMT; ++nt)
#pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<uint32_t*>(s + (key_row0 + 16 * rt + g + 8 * r) * kLdS + q_col0 + nt * 8 + 2 * t) =
              pack2<T>(acc[rt * kMT + nt][2 * r], acc[rt * kMT + nt][2 * r + 1]);
  };
  static_assert(kThreads >= kM);  // thread i < kM fetches lse and delta of query row i of a step

  float dk[kRT * kDT][4] = {}, dv[kRT * kDT][4] = {};
  if (steps > 0) {
    load_tile<kN, kHeadDim, kThreads>(sK, kLd, operand_row<T>(p.k, p.k_stride, b, hk, n0), p.k_stride[2],
                                      key_end(p, b) - n0, p.dim);  // padding rows as zeros (the atomic dQ's dS K)
    load_tile<kN, kHeadDim, kThreads>(sV, kLd, operand_row<T>(p.v, p.v_stride, b, hk, n0), p.v_stride[2],
                                      key_end(p, b) - n0, p.dim_v);
    int64_t h = hk * group, m0 = m_first;  // this step's query head and tile
    load_q(0, h, m0);
    load_do(h, m0);
    cp_async_commit();
    if (threadIdx.x < kM)
      row_stats(p, delta, b, h, m0 + threadIdx.x, sLse_stages[threadIdx.x], sDelta_stages[threadIdx.x]);
    for (int64_t step = 0; step < steps; ++step) {
      const int stage = step % 2;
      int64_t next_h = h, next_m0 = m0 + kM;
      if (next_m0 >= i_hi) next_m0 = m_first, ++next_h;
      const bool has_next = step + 1 < steps;
      const T* sQ = sQ_stages + stage * kM * kLd;
      const float* sLse = sLse_stages + stage * kM + q_col0;
      const float* sDelta = sDelta_stages + stage * kM + q_col0;
      __syncthreads();  // every warp is done with the previous step (its Q stage is the next step's; dS^T, P^T)
      if (has_next) load_q(1 - stage, next_h, next_m0);
      cp_async_commit();
      float next_lse = 0.f, next_delta = 0.f;
      if (has_next && threadIdx.x < kM) row_stats(p, delta, b, next_h, next_m0 + threadIdx.x, next_lse, next_delta);
      cp_async_wait<1>();  // this step's Q and dO landed
      __syncthreads();

      const bool clean = tile_is_clean(p, b, m0, m0 + kM, n0, n0 + kN);
      float pt[kRT * kMT][4] = {}, ds[kRT * kMT][4] = {};
      bwd_probs_and_ds<T, kHeadDim>(pt, ds, sK, sV, sQ, sdO, sLse, sDelta, p, b, h, n0, m0, key_row0, q_col0, clean,
                                    scale_log2, step == 0);
      stash(sPt, pt);
      stash(sdS, ds);
      __syncthreads();
      warp_gemm_nn<kRT, kDT, kM / 16>(dv, sPt, kLdS, key_row0, sdO, kLd, d_col0);  // dV += P^T dO
      __syncthreads();  // every warp is done with dO
      if (has_next) load_do(next_h, next_m0);
      cp_async_commit();
      warp_gemm_nn<kRT, kDT, kM / 16>(dk, sdS, kLdS, key_row0, sQ, kLd, d_col0);  // dK += dS^T Q
      if constexpr (kAtomicDq) bwd_atomic_dq<T, kHeadDim>(dq_accum, sdS, sK, p, b, h, m0, warp, g, t);
      if (has_next && threadIdx.x < kM) {  // the other stage is free since this step's first barrier
        sLse_stages[(1 - stage) * kM + threadIdx.x] = next_lse;
        sDelta_stages[(1 - stage) * kM + threadIdx.x] = next_delta;
      }
      h = next_h, m0 = next_m0;
    }
  }
  const int64_t rows = p.len_k - n0;
  T* gk = static_cast<T*>(bp.grad_k) + b * bp.gk_stride[0] + hk * bp.gk_stride[1] + n0 * bp.gk_stride[2] + d_col0;
  T* gv = static_cast<T*>(bp.grad_v) + b * bp.gv_stride[0] + hk * bp.gv_stride[1] + n0 * bp.gv_stride[2] + d_col0;
  bool non_finite_out = false;  // (see "Hidden keys and mma.sync")
#pragma unroll
  for (int rt = 0; rt < kRT; ++rt) {
    non_finite_out |= store_tile<kDT>(gk, bp.gk_stride[2], dk + rt * kDT, key_row0 + 16 * rt, rows, p.dim - d_col0,
                                      static_cast<float>(p.scale));
    non_finite_out |=
        store_tile<kDT>(gv, bp.gv_stride[2], dv + rt * kDT, key_row0 + 16 * rt, rows, p.dim_v - d_col0, 1.f);
  }
  if (non_finite_out && p.non_finite) *p.non_finite = 1;
#endif
}

// ---------------------------------------------------------------------------------------------------------------

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(MmaTiles<kHeadDim>::kDqWarps * 32)
    attention_mma_bwd_dq_kernel(const AttentionBackwardParams bp, const float* delta) {
#if PT_TENSOR_CORES  // (mma.cuh) an empty body before sm_80
  using Tiles = MmaTiles<kHeadDim>;
  constexpr int kM = Tiles::kDqBlockM, kN = Tiles::kFwdBlockN, kLd = Tiles::kLd;
  constexpr int kThreads = Tiles::kDqWarps * 32, kNT = kN / 8, kDT = kHeadDim / 8;
  const AttentionParams& p = bp.fwd;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);  // [kM][kLd]
  T* sdO = sQ + kM * kLd;                  // [kM][kLd]
  T* sKV = sdO + kM * kLd;                 // [2 stages][K, V][kN][kLd]

  const int64_t m_blocks = (p.len_q + kM - 1) / kM;
  const int64_t m0 = (m_blocks - 1 - blockIdx.x % m_blocks) * kM;
  const int64_t h = blockIdx.x / m_blocks % p.heads_q, b = blockIdx.x / (m_blocks * p.heads_q);
  const int64_t hk = h / (p.heads_q / p.heads_kv);
  const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4;
  const int64_t nq = p.len_q - m0 < kM ? p.len_q - m0 : kM;
  const KeyRange keys = visible_keys(p, b, m0, m0 + nq);
  const float scale_log2 = static_cast<float>(p.scale) * kLog2e;
  const T* k = operand_row<T>(p.k, p.k_stride, b, hk, 0);
  const T* v = operand_row<T>(p.v, p.v_stride, b, hk, 0);
  float lse[2], dlt[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) row_stats(p, delta, b, h, m0 + warp * 16 + g + 8 * r, lse[r], dlt[r]);

  float dq[kDT][4] = {};
  if (keys.lo < keys.hi) {
    load_tile<kM, kHeadDim, kThreads>(sQ, kLd, operand_row<T>(p.q, p.q_stride, b, h, m0), p.q_stride[2], nq, p.dim);
    load_tile<kM, kHeadDim, kThreads>(sdO, kLd, operand_row<T>(bp.grad_out, bp.go_stride, b, h, m0), bp.go_stride[2],
                                      nq, p.dim_v);
    // Key tile it works on stage it % 2 while tile it + 1's K and V arrive in the other stage.
    auto load_k_v = [&](int stage, int64_t n0) {
      T* sK = sKV + stage * 2 * kN * kLd;
      // rows past the row's keys load as zeros: padding never reaches dS K
      load_tile<kN, kHeadDim, kThreads>(sK, kLd, k + n0 * p.k_stride[2], p.k_stride[2], key_end(p, b) - n0, p.dim);
      load_tile<kN, kHeadDim, kThreads>(sK + kN * kLd, kLd, v + n0 * p.v_stride[2], p.v_stride[2], key_end(p, b) - n0,
                                        p.dim_v);
    };
    const int64_t n_first = keys.lo / kN * kN;
    load_k_v(0, n_first);
    cp_async_commit();
    for (int64_t n0 = n_first; n0 < keys.hi; n0 += kN) {
      const int stage = (n0 - n_first) / kN % 2;
      const T* sK = sKV + stage * 2 * kN * kLd;
      const T* sV = sK + kN * kLd;
      __syncthreads();  // every warp is done with the previous tile (its stage is the next tile's)
      if (n0 + kN < keys.hi) load_k_v(1 - stage, n0 + kN);
      cp_async_commit();
      cp_async_wait<1>();  // this tile (and Q, dO) landed
      __syncthreads();
      float s[kNT][4] = {}, ds[kNT][4] = {};
      warp_gemm_nt<1, kNT, kHeadDim / 16>(s, sQ, kLd, warp * 16, sK, kLd);
      const float factor = scale_and_mask<false, kNT>(
          s, p, b, h, m0 + warp * 16, n0, tile_is_clean(p, b, m0, m0 + kM, n0, n0 + kN), scale_log2);
      warp_gemm_nt<1, kNT, kHeadDim / 16>(ds, sdO, kLd, warp * 16, sV, kLd);  // dP = dO V^T
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float pe = exp2f(fmaf(s[nt][e], factor, -lse[e / 2]));
          ds[nt][e] = pe == 0.f ? 0.f : pe * (ds[nt][e] - dlt[e / 2]);  // a hidden key's dP may be NaN
        }
      warp_gemm_pn<1, kDT, kN / 16>(dq, ds, sK, kLd, 0);  // dQ += dS K
    }
  }
  T* gq = static_cast<T*>(bp.grad_q) + b * bp.gq_stride[0] + h * bp.gq_stride[1] + m0 * bp.gq_stride[2];
  // (see "Hidden keys and mma.sync")
  if (store_tile<kDT>(gq, bp.gq_stride[2], dq, warp * 16, nq, p.dim, static_cast<float>(p.scale)) && p.non_finite)
    *p.non_finite = 1;
#endif
}

// ---------------------------------------------------------------------------------------------------------------

// Launches `kernel` over `blocks` blocks of `threads` with `smem` bytes of dynamic shared memory.
template <class Kernel, class... Args>
void launch_with_smem(Kernel kernel, int64_t blocks, int threads, size_t smem, cudaStream_t stream, Args... args) {
  TORCH_CHECK(blocks < (int64_t(1) << 31), "attention: too many blocks (", blocks, ")");
  if (blocks == 0) return;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <typename T, int kHeadDim>
void attention_mma_fwd(const AttentionParams& p, cudaStream_t stream) {
  using Tiles = MmaTiles<kHeadDim>;
  static_assert(sizeof(T) == kMmaElemBytes);
  const int64_t m_blocks = (p.len_q + Tiles::kFwdBlockM - 1) / Tiles::kFwdBlockM;
  launch_with_smem(attention_mma_fwd_kernel<T, kHeadDim>, m_blocks * p.heads_q * p.batch, Tiles::kFwdWarps * 32,
                   Tiles::kFwdSmem, stream, p);
}

template <typename T, int kHeadDim>
void attention_mma_bwd(const AttentionBackwardParams& bp, const float* delta, float* dq_accum, cudaStream_t stream) {
  using Tiles = MmaTiles<kHeadDim>;
  const AttentionParams& p = bp.fwd;
  static_assert(sizeof(T) == kMmaElemBytes);
  const int64_t n_blocks = (p.len_k + Tiles::kBwdBlockN - 1) / Tiles::kBwdBlockN;
  const int64_t blocks = n_blocks * p.heads_kv * p.batch;
  const auto dk_dv_kernel =
      dq_accum ? attention_mma_bwd_kernel<T, kHeadDim, true> : attention_mma_bwd_kernel<T, kHeadDim, false>;
  launch_with_smem(dk_dv_kernel, blocks, Tiles::kBwdWarps * 32, Tiles::kBwdDkDvSmem, stream, bp, delta, dq_accum);
  if (dq_accum) return;
  const int64_t m_blocks = (p.len_q + Tiles::kDqBlockM - 1) / Tiles::kDqBlockM;
  launch_with_smem(attention_mma_bwd_dq_kernel<T, kHeadDim>, m_blocks * p.heads_q * p.batch, Tiles::kDqWarps * 32,
                   Tiles::kDqSmem, stream, bp, delta);
}

}  // namespace pytransformer::cuda

// Explicit instantiations of the launchers for one head dim (used by attention_hdim<D>.cu).
#define PT_INSTANTIATE_ATTENTION_MMA(D)                                                                           \
  template void pytransformer::cuda::attention_mma_fwd<__half, D>(const pytransformer::AttentionParams&,         \
                                                                   cudaStream_t);                                \
  template void pytransformer::cuda::attention_mma_fwd<__nv_bfloat16, D>(const pytransformer::AttentionParams&, \
                                                                          cudaStream_t);                         \
  template void pytransformer::cuda::attention_mma_bwd<__half, D>(const pytransformer::AttentionBackwardParams&, \
                                                                   const float*, float*, cudaStream_t);          \
  template void pytransformer::cuda::attention_mma_bwd<__nv_bfloat16, D>(                                       \
      const pytransformer::AttentionBackwardParams&, const float*, float*, cudaStream_t);
