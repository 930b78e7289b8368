#pragma once
// SIMT attention kernels (attention_launch.h): every storage type of common.cuh, any D and Dv up to
// kSimtMaxHeadDim, float32 arithmetic. A warp owns one row at a time and walks its partners in chunks of 32, one per
// lane: each lane computes its partner's score with a dot product over the whole row (its own row of K or Q, read
// 16 bytes at a time when the rows are aligned, against the warp's own row staged in shared memory as float32), then
// the chunk's weights go through shared memory and the lanes, which own the dims d = lane + 32 t, accumulate the
// weighted rows (coalesced reads). Only the ranges that causal, window and key_lengths leave visible are visited.
//   forward: a warp per query row; online softmax over key chunks (running max, per-lane partial sums).
//   dQ:      a warp per query row; dS = P (dP - delta), dQ = scale * sum_j dS_j k_j.
//   dK/dV:   a warp per key row of a K/V head, over the query heads of its GQA group and the queries that see it:
//            dV = sum_i P_i dO_i, dK = scale * sum_i dS_i q_i. Deterministic: every gradient row has one writer.
// Each kernel also has a fix-up pass (kPass = kFixup) that runs after the tensor-core kernel of the same parameters
// (attention_mma.cuh, "Hidden keys and mma.sync"): it does nothing unless that kernel set *p.non_finite, and then
// writes again only the rows whose result is not finite. The dQ kernel's kConvert pass turns the tensor-core
// backward's atomic dQ sums into grad_q, summing again the rows whose sums are not finite.
#include "attention_launch.h"
#include "common.cuh"

namespace pytransformer::cuda {

constexpr int kSimtWarps = 4;  // warps (rows in flight) per block
constexpr int kWarpSize = 32;

template <typename T>
__device__ __forceinline__ const T* simt_row(const void* base, const int64_t (&stride)[3], int64_t b, int64_t h,
                                             int64_t i) {
  return static_cast<const T*>(base) + b * stride[0] + h * stride[1] + i * stride[2];
}

template <typename T>
__device__ __forceinline__ T* simt_row(void* base, const int64_t (&stride)[3], int64_t b, int64_t h, int64_t i) {
  return static_cast<T*>(base) + b * stride[0] + h * stride[1] + i * stride[2];
}

// sum_d x[d] * row[d] over d < n: x float32 (shared memory, read as a broadcast), row in global memory, read kVec
// elements at a time (a 16-byte pack; the row must then be 16-byte aligned) with kVec independent sums.
template <typename T, int kVec>
__device__ __forceinline__ float dot_row(const float* x, const T* row, int n) {
  float acc[kVec] = {};
  int d = 0;
  if constexpr (kVec > 1) {
    const Pack<T, kVec>* packs = reinterpret_cast<const Pack<T, kVec>*>(row);
#pragma unroll 2
    for (; d + kVec <= n; d += kVec) {
      const Pack<T, kVec> v = packs[d / kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[e] = fmaf(x[d + e], to_float(v.v[e]), acc[e]);
    }
  }
  for (; d < n; ++d) acc[0] = fmaf(x[d], to_float(row[d]), acc[0]);
#pragma unroll
  for (int e = 1; e < kVec; ++e) acc[0] += acc[e];
  return acc[0];
}

// dst[d] = row[d] * scale for d < n, by the lanes of a warp.
template <typename T>
__device__ __forceinline__ void stage_row(float* dst, const T* row, int n, float scale, int lane) {
  for (int d = lane; d < n; d += kWarpSize) dst[d] = to_float(row[d]) * scale;
}

// acc[t] += w * row[lane + 32 t] for the dims d = lane + 32 t < n that this lane owns.
template <typename T, int kIters>
__device__ __forceinline__ void add_scaled_row(float (&acc)[kIters], float w, const T* row, int n, int lane) {
#pragma unroll
  for (int t = 0; t < kIters; ++t) {
    const int d = lane + kWarpSize * t;
    if (d < n) acc[t] = fmaf(w, to_float(row[d]), acc[t]);
  }
}

// row[lane + 32 t] = acc[t] * scale for the dims this lane owns.
template <typename T, int kIters>
__device__ __forceinline__ void store_row(T* row, const float (&acc)[kIters], float scale, int n, int lane) {
#pragma unroll
  for (int t = 0; t < kIters; ++t) {
    const int d = lane + kWarpSize * t;
    if (d < n) row[d] = from_float<T>(acc[t] * scale);
  }
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The mask's term of the score of query i, key j of (b, h): -inf where the mask hides the key (a bool False or a float
// -inf), else the float mask's value (0 without one). Callers skip the dot product of a hidden key, so that a NaN or
// inf in its row never reaches the score.
__device__ __forceinline__ float mask_term(const AttentionParams& p, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (p.mask_kind == MaskKind::kNone) return 0.f;
  const int64_t at = b * p.mask_stride[0] + h * p.mask_stride[1] + i * p.mask_stride[2] + j * p.mask_stride[3];
  if (p.mask_kind == MaskKind::kBool) return static_cast<const bool*>(p.mask)[at] ? 0.f : -INFINITY;
  return static_cast<const float*>(p.mask)[at];
}

// The passes of a SIMT kernel: every row; the fix-up after a tensor-core kernel; the conversion of atomic dQ sums.
enum class SimtPass { kFull, kFixup, kConvert };

// Whether a[0..n) and b[0..m) are all finite (read by the lanes of a warp; every lane gets the answer).
template <typename T>
__device__ __forceinline__ bool rows_finite(const T* a, int n, const T* b, int m, int lane) {
  float bad = 0.f;
#pragma unroll 1
  for (int d = lane; d < n || d < m; d += kWarpSize)
    if ((d < n && non_finite(to_float(a[d]))) || (d < m && non_finite(to_float(b[d])))) bad = 1.f;
  return warp_max(bad) == 0.f;
}

// Shared memory of a warp: up to two staged rows and two chunks of weights.
constexpr int kSimtSmemFloats = 2 * kSimtMaxHeadDim + 2 * kWarpSize;

template <typename T, int kVec, int kIters, SimtPass kPass>
__global__ void __launch_bounds__(kSimtWarps* kWarpSize) attention_simt_fwd_kernel(AttentionParams p) {
  __shared__ float smem[kSimtWarps][kSimtSmemFloats];
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float* qs = smem[warp];                    // [D] the query row times scale
  float* ws = smem[warp] + kSimtMaxHeadDim;  // [32] the chunk's exp(s - m)
  const int D = static_cast<int>(p.dim), Dv = static_cast<int>(p.dim_v);
  const int64_t group = p.heads_q / p.heads_kv, rows = p.batch * p.heads_q * p.len_q;
  if (kPass == SimtPass::kFixup && !*p.non_finite) return;
  // rows in the order [B, Hq, Lq]: the warps of a block mostly share a head, so their K/V reads hit the same lines
  for (int64_t row = int64_t(blockIdx.x) * kSimtWarps + warp; row < rows; row += int64_t(gridDim.x) * kSimtWarps) {
    const int64_t i = row % p.len_q, h = row / p.len_q % p.heads_q, b = row / (p.len_q * p.heads_q);
    if constexpr (kPass == SimtPass::kFixup) {
      const T* out = simt_row<T>(p.out, p.o_stride, b, h, i);
      if (rows_finite(out, Dv, out, 0, lane)) continue;
    }
    stage_row(qs, simt_row<T>(p.q, p.q_stride, b, h, i), D, static_cast<float>(p.scale), lane);
    __syncwarp();
    const T* k = simt_row<T>(p.k, p.k_stride, b, h / group, 0);
    const T* v = simt_row<T>(p.v, p.v_stride, b, h / group, 0);
    const KeyRange keys = visible_keys(p, b, i, i + 1);
    float m = -INFINITY;  // running max of the row (the same in every lane)
    float l = 0.f;        // this lane's part of the running sum of exp(s - m)
    float o[kIters] = {};
    for (int64_t j0 = keys.lo; j0 < keys.hi; j0 += kWarpSize) {
      const int64_t j = j0 + lane;
      float s = -INFINITY;
      if (j < keys.hi) {
        const float term = mask_term(p, b, h, i, j);
        if (term != -INFINITY) s = dot_row<T, kVec>(qs, k + j * p.k_stride[2], D) + term;
      }
      const float m_new = max_nan(m, warp_max(s));
      if (m_new == -INFINITY) continue;  // nothing visible so far (the whole warp skips)
      const float alpha = __expf(m - m_new), e = __expf(s - m_new);
      l = fmaf(l, alpha, e);
      m = m_new;
      ws[lane] = e;
      __syncwarp();
#pragma unroll
      for (int t = 0; t < kIters; ++t) o[t] *= alpha;
      const int nk = static_cast<int>(keys.hi - j0 < kWarpSize ? keys.hi - j0 : kWarpSize);
      for (int jj = 0; jj < nk; ++jj) {
        const float w = ws[jj];
        if (w != 0.f) add_scaled_row(o, w, v + (j0 + jj) * p.v_stride[2], Dv, lane);
      }
      __syncwarp();
    }
    l = warp_sum(l);
    store_row(simt_row<T>(p.out, p.o_stride, b, h, i), o, l > 0.f ? 1.f / l : 0.f, Dv, lane);
    if (lane == 0) static_cast<float*>(p.lse)[row] = l > 0.f ? m + logf(l) : -INFINITY;
    __syncwarp();  // qs is restaged for the next row
  }
}

template <typename T, int kVec, int kIters, SimtPass kPass>
__global__ void __launch_bounds__(kSimtWarps* kWarpSize)
    attention_simt_dq_kernel(AttentionBackwardParams bp, const float* delta, const float* dq_accum) {
  __shared__ float smem[kSimtWarps][kSimtSmemFloats];
  const AttentionParams& p = bp.fwd;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float* qs = smem[warp];                        // [D] the query row times scale
  float* gs = smem[warp] + kSimtMaxHeadDim;      // [Dv] its output gradient
  float* ws = smem[warp] + 2 * kSimtMaxHeadDim;  // [32] the chunk's dS
  const int D = static_cast<int>(p.dim), Dv = static_cast<int>(p.dim_v);
  const float scale = static_cast<float>(p.scale);
  const int64_t group = p.heads_q / p.heads_kv, rows = p.batch * p.heads_q * p.len_q;
  if (kPass == SimtPass::kFixup && !*p.non_finite) return;
  for (int64_t row = int64_t(blockIdx.x) * kSimtWarps + warp; row < rows; row += int64_t(gridDim.x) * kSimtWarps) {
    const int64_t i = row % p.len_q, h = row / p.len_q % p.heads_q, b = row / (p.len_q * p.heads_q);
    float dq[kIters] = {};
    if constexpr (kPass == SimtPass::kFixup) {
      const T* gq = simt_row<T>(bp.grad_q, bp.gq_stride, b, h, i);
      if (rows_finite(gq, D, gq, 0, lane)) continue;
    }
    if constexpr (kPass == SimtPass::kConvert) {  // dq_accum: [B, Hq, Lq, D] float32 contiguous, scaled
      float bad = 0.f;
#pragma unroll
      for (int t = 0; t < kIters; ++t) {
        const int d = lane + kWarpSize * t;
        if (d < D) {
          dq[t] = dq_accum[row * D + d];
          if (non_finite(dq[t])) bad = 1.f;
        }
      }
      if (warp_max(bad) == 0.f) {
        store_row(simt_row<T>(bp.grad_q, bp.gq_stride, b, h, i), dq, 1.f, D, lane);
        continue;
      }
#pragma unroll
      for (int t = 0; t < kIters; ++t) dq[t] = 0.f;
    }
    const float lse = static_cast<const float*>(p.lse)[row], dlt = delta[row];
    if (lse != -INFINITY) {  // a row that saw no key has zero gradient
      stage_row(qs, simt_row<T>(p.q, p.q_stride, b, h, i), D, scale, lane);
      stage_row(gs, simt_row<T>(bp.grad_out, bp.go_stride, b, h, i), Dv, 1.f, lane);
      __syncwarp();
      const T* k = simt_row<T>(p.k, p.k_stride, b, h / group, 0);
      const T* v = simt_row<T>(p.v, p.v_stride, b, h / group, 0);
      const KeyRange keys = visible_keys(p, b, i, i + 1);
      for (int64_t j0 = keys.lo; j0 < keys.hi; j0 += kWarpSize) {
        const int64_t j = j0 + lane;
        float ds = 0.f;
        if (j < keys.hi) {
          if (mask_term(p, b, h, i, j) != -INFINITY) {  // read again after the dot product, not held across it
            const float s = dot_row<T, kVec>(qs, k + j * p.k_stride[2], D) + mask_term(p, b, h, i, j);
            if (s != -INFINITY) ds = __expf(s - lse) * (dot_row<T, kVec>(gs, v + j * p.v_stride[2], Dv) - dlt);
          }
        }
        ws[lane] = ds;
        __syncwarp();
        const int nk = static_cast<int>(keys.hi - j0 < kWarpSize ? keys.hi - j0 : kWarpSize);
        for (int jj = 0; jj < nk; ++jj) {
          const float w = ws[jj];
          if (w != 0.f) add_scaled_row(dq, w, k + (j0 + jj) * p.k_stride[2], D, lane);
        }
        __syncwarp();
      }
    }
    store_row(simt_row<T>(bp.grad_q, bp.gq_stride, b, h, i), dq, scale, D, lane);
  }
}

template <typename T, int kVec, int kIters, SimtPass kPass>
__global__ void __launch_bounds__(kSimtWarps* kWarpSize)
    attention_simt_dkv_kernel(AttentionBackwardParams bp, const float* delta) {
  __shared__ float smem[kSimtWarps][kSimtSmemFloats];
  const AttentionParams& p = bp.fwd;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  float* ks = smem[warp];                                    // [D] the key row times scale
  float* vs = smem[warp] + kSimtMaxHeadDim;                  // [Dv] its value row
  float* ps = smem[warp] + 2 * kSimtMaxHeadDim;              // [32] the chunk's P
  float* ds = smem[warp] + 2 * kSimtMaxHeadDim + kWarpSize;  // [32] the chunk's dS
  const int D = static_cast<int>(p.dim), Dv = static_cast<int>(p.dim_v);
  const float scale = static_cast<float>(p.scale);
  const int64_t group = p.heads_q / p.heads_kv, rows = p.batch * p.heads_kv * p.len_k;
  if (kPass == SimtPass::kFixup && !*p.non_finite) return;
  for (int64_t row = int64_t(blockIdx.x) * kSimtWarps + warp; row < rows; row += int64_t(gridDim.x) * kSimtWarps) {
    const int64_t j = row % p.len_k, hk = row / p.len_k % p.heads_kv, b = row / (p.len_k * p.heads_kv);
    if constexpr (kPass == SimtPass::kFixup) {
      if (rows_finite(simt_row<T>(bp.grad_k, bp.gk_stride, b, hk, j), D, simt_row<T>(bp.grad_v, bp.gv_stride, b, hk, j),
                      Dv, lane))
        continue;
    }
    float dk[kIters] = {}, dv[kIters] = {};
    const KeyRange queries = visible_queries(p, j);
    if (!p.key_lengths || j < p.key_lengths[b]) {  // padding keys have zero gradient
      stage_row(ks, simt_row<T>(p.k, p.k_stride, b, hk, j), D, scale, lane);
      stage_row(vs, simt_row<T>(p.v, p.v_stride, b, hk, j), Dv, 1.f, lane);
      __syncwarp();
      for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
        const T* q = simt_row<T>(p.q, p.q_stride, b, h, 0);
        const T* go = simt_row<T>(bp.grad_out, bp.go_stride, b, h, 0);
        const float* lse = static_cast<const float*>(p.lse) + (b * p.heads_q + h) * p.len_q;
        const float* dlt = delta + (b * p.heads_q + h) * p.len_q;
        for (int64_t i0 = queries.lo; i0 < queries.hi; i0 += kWarpSize) {
          const int64_t i = i0 + lane;
          float pi = 0.f, dsi = 0.f;
          if (i < queries.hi && lse[i] != -INFINITY) {
            const float term = mask_term(p, b, h, i, j);
            if (term != -INFINITY) {
              const float s = dot_row<T, kVec>(ks, q + i * p.q_stride[2], D) + term;
              if (s != -INFINITY) {
                pi = __expf(s - lse[i]);
                dsi = pi * (dot_row<T, kVec>(vs, go + i * bp.go_stride[2], Dv) - dlt[i]);
              }
            }
          }
          ps[lane] = pi;
          ds[lane] = dsi;
          __syncwarp();
          const int nq = static_cast<int>(queries.hi - i0 < kWarpSize ? queries.hi - i0 : kWarpSize);
          for (int ii = 0; ii < nq; ++ii) {
            const float wp = ps[ii], wd = ds[ii];
            if (wp != 0.f) add_scaled_row(dv, wp, go + (i0 + ii) * bp.go_stride[2], Dv, lane);
            if (wd != 0.f) add_scaled_row(dk, wd, q + (i0 + ii) * p.q_stride[2], D, lane);
          }
          __syncwarp();
        }
      }
    }
    store_row(simt_row<T>(bp.grad_k, bp.gk_stride, b, hk, j), dk, scale, D, lane);
    store_row(simt_row<T>(bp.grad_v, bp.gv_stride, b, hk, j), dv, 1.f, Dv, lane);
  }
}

// ---- host side ----

// The grid of a pass over `rows` rows: a block a kSimtWarps rows, but for a fix-up pass a few blocks a multiprocessor,
// which loop over the rows: with nothing to fix, the pass is one read of the flag a block.
inline unsigned simt_grid(int64_t rows, SimtPass pass = SimtPass::kFull) {
  int64_t blocks = std::min<int64_t>((rows + kSimtWarps - 1) / kSimtWarps, int64_t(1) << 30);
  if (pass == SimtPass::kFixup) blocks = std::min<int64_t>(blocks, 4 * int64_t(multiprocessor_count()));
  return static_cast<unsigned>(blocks);
}

// Calls f(std::integral_constant<int, kVec>, std::integral_constant<int, kIters>): kVec the pack width when `packs`
// (else 1), kIters the dims a lane owns for rows of up to `dim` elements (a power of two, 1 .. 16). float16/bfloat16
// reach these kernels only when a head dim is past the tensor-core limit (attention.cpp), a rare case: they get the
// widest tile alone, which halves the kernels this file instantiates (and the build time).
template <typename T, class F>
void dispatch_simt(int64_t dim, bool packs, F&& f) {
  static_assert(kSimtMaxHeadDim == 16 * kWarpSize, "kIters cases below cover 1 .. 16 dims a lane");
  TORCH_CHECK(dim <= kSimtMaxHeadDim, "internal error: head dim ", dim, " exceeds the SIMT kernels' ",
              kSimtMaxHeadDim);
  auto with_vec = [&](auto vec) {
    if constexpr (!std::is_same_v<T, float>) {
      return f(vec, std::integral_constant<int, 16>{});
    } else {
      dispatch_chunks<1, 16>(next_pow2((dim + kWarpSize - 1) / kWarpSize), [&](auto iters) { f(vec, iters); });
    }
  };
  if (packs) {
    with_vec(std::integral_constant<int, kPackElems<T>>{});
  } else {
    with_vec(std::integral_constant<int, 1>{});
  }
}

// Calls f(kVec, kIters, kPass) as integral constants: dispatch_simt's for kFull; for the other passes, which follow
// the tensor-core kernels on their operands (float16/bfloat16, every row 16-byte aligned: mma_operand), the one
// instantiation they need (kConvert only where kWithConvert: the dQ kernel's).
template <typename T, bool kWithConvert, class F>
void dispatch_simt_pass(SimtPass pass, int64_t dim, bool packs, F&& f) {
  using Full = std::integral_constant<SimtPass, SimtPass::kFull>;
  if constexpr (!std::is_same_v<T, float>) {
    if (pass != SimtPass::kFull) {
      TORCH_CHECK(kWithConvert || pass == SimtPass::kFixup, "internal error: a SIMT conversion pass outside dQ");
      using Vec = std::integral_constant<int, kPackElems<T>>;
      using Iters = std::integral_constant<int, 16>;
      if constexpr (kWithConvert) {
        if (pass == SimtPass::kConvert)
          return f(Vec{}, Iters{}, std::integral_constant<SimtPass, SimtPass::kConvert>{});
      }
      return f(Vec{}, Iters{}, std::integral_constant<SimtPass, SimtPass::kFixup>{});
    }
  }
  TORCH_CHECK(pass == SimtPass::kFull, "internal error: a SIMT fix-up or conversion pass for float32");
  dispatch_simt<T>(dim, packs, [&](auto vec, auto iters) { f(vec, iters, Full{}); });
}

template <typename T>
void attention_simt_fwd(const AttentionParams& p, cudaStream_t stream) {
  const int64_t rows = p.batch * p.heads_q * p.len_q;
  if (rows == 0) return;
  const SimtPass pass = p.non_finite ? SimtPass::kFixup : SimtPass::kFull;
  // Each lane streams its own rows of K.
  dispatch_simt_pass<T, false>(pass, p.dim_v, rows_aligned16(p.k, p.k_stride, sizeof(T)), [&](auto vec, auto iters,
                                                                                                auto pass_) {
    constexpr int kVec = decltype(vec)::value, kIters = decltype(iters)::value;
    constexpr SimtPass kPass = decltype(pass_)::value;
    attention_simt_fwd_kernel<T, kVec, kIters, kPass><<<simt_grid(rows, kPass), kSimtWarps * kWarpSize, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

template <typename T>
void attention_simt_dq(const AttentionBackwardParams& bp, const float* delta, const float* dq_accum,
                       cudaStream_t stream) {
  const AttentionParams& p = bp.fwd;
  const int64_t rows = p.batch * p.heads_q * p.len_q;
  if (rows == 0) return;
  const SimtPass pass = dq_accum ? SimtPass::kConvert : p.non_finite ? SimtPass::kFixup : SimtPass::kFull;
  // Each lane streams its own rows of K and V.
  const bool packs = rows_aligned16(p.k, p.k_stride, sizeof(T)) && rows_aligned16(p.v, p.v_stride, sizeof(T));
  dispatch_simt_pass<T, true>(pass, std::max(p.dim, p.dim_v), packs, [&](auto vec, auto iters, auto pass_) {
    constexpr int kVec = decltype(vec)::value, kIters = decltype(iters)::value;
    constexpr SimtPass kPass = decltype(pass_)::value;
    const unsigned grid = simt_grid(rows, kPass);
    attention_simt_dq_kernel<T, kVec, kIters, kPass><<<grid, kSimtWarps * kWarpSize, 0, stream>>>(bp, delta, dq_accum);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

template <typename T>
void attention_simt_dkv(const AttentionBackwardParams& bp, const float* delta, cudaStream_t stream) {
  const AttentionParams& p = bp.fwd;
  const int64_t rows = p.batch * p.heads_kv * p.len_k;
  if (rows == 0) return;
  const SimtPass pass = p.non_finite ? SimtPass::kFixup : SimtPass::kFull;
  // Each lane streams its own rows of Q and grad_out.
  const bool packs = rows_aligned16(p.q, p.q_stride, sizeof(T)) && rows_aligned16(bp.grad_out, bp.go_stride, sizeof(T));
  dispatch_simt_pass<T, false>(pass, std::max(p.dim, p.dim_v), packs, [&](auto vec, auto iters, auto pass_) {
    constexpr int kVec = decltype(vec)::value, kIters = decltype(iters)::value;
    constexpr SimtPass kPass = decltype(pass_)::value;
    const unsigned grid = simt_grid(rows, kPass);
    attention_simt_dkv_kernel<T, kVec, kIters, kPass><<<grid, kSimtWarps * kWarpSize, 0, stream>>>(bp, delta);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

template <typename T>
void attention_simt_bwd(const AttentionBackwardParams& bp, const float* delta, cudaStream_t stream) {
  attention_simt_dq<T>(bp, delta, nullptr, stream);
  attention_simt_dkv<T>(bp, delta, stream);
}

// delta[row] = sum_d grad_out[row, d] * out[row, d] over the [B, Hq, Lq] rows, a warp a row.
template <typename T>
__global__ void __launch_bounds__(kSimtWarps* kWarpSize) attention_delta_kernel(AttentionBackwardParams bp,
                                                                                 float* delta) {
  const AttentionParams& p = bp.fwd;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int64_t rows = p.batch * p.heads_q * p.len_q;
  for (int64_t row = int64_t(blockIdx.x) * kSimtWarps + warp; row < rows; row += int64_t(gridDim.x) * kSimtWarps) {
    const int64_t i = row % p.len_q, h = row / p.len_q % p.heads_q, b = row / (p.len_q * p.heads_q);
    const T* go = simt_row<T>(bp.grad_out, bp.go_stride, b, h, i);
    const T* out = simt_row<T>(p.out, p.o_stride, b, h, i);
    float acc = 0.f;
    for (int64_t d = lane; d < p.dim_v; d += kWarpSize) acc = fmaf(to_float(go[d]), to_float(out[d]), acc);
    acc = warp_sum(acc);
    if (lane == 0) delta[row] = acc;
  }
}

template <typename T>
void attention_delta(const AttentionBackwardParams& bp, float* delta, cudaStream_t stream) {
  const int64_t rows = bp.fwd.batch * bp.fwd.heads_q * bp.fwd.len_q;
  if (rows == 0) return;
  attention_delta_kernel<T><<<simt_grid(rows), kSimtWarps * kWarpSize, 0, stream>>>(bp, delta);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace pytransformer::cuda
