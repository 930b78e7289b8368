#pragma once
// CUDA kernels of masked_softmax (forward and backward) over rows [rows, lk], templated on the storage type T (float,
// __half, __nv_bfloat16; float32 arithmetic) and on the row geometry of common.cuh.
// Forward: v = scale * score + mask (a bool mask or a -inf mask entry removes the entry; causal rows stop at
// causal_cols, whose columns past it are never read), out = exp(v - max) / sum, a row with no visible entry is zeros.
// Rows held in registers are read once: each thread keeps exp(v - its own max) and its (max, sum), merged over the
// row (MaxSumOp), then rescales. Streaming rows take an online (max, sum) pass and a second pass that writes.
// Backward: grad = scale * out * (grad_out - sum(grad_out * out)).
#include "common.cuh"
#include "masked_softmax_launch.h"

namespace pytransformer::cuda {

// Rows held in registers use at most this many threads (the kernels' launch bound: up to 128 registers a thread)
// and this many elements a thread.
constexpr int kSoftmaxMaxRowThreads = 512;
constexpr int kSoftmaxFwdMaxElems = 16;
constexpr int kSoftmaxBwdMaxElems = 32;

// v[k] = the value of column c * kVec + k of `row`: scale * score plus the mask, -inf when removed or at or past
// `cols` (the visible prefix of the row).
template <typename T, int kVec>
__device__ __forceinline__ void masked_values(const SoftmaxFwdParams<T>& p, const Pack<T, kVec>& scores, int64_t c,
                                              int64_t cols, int64_t mask_row, float (&v)[kVec]) {
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const int64_t j = c * kVec + k;
    float x = p.scale * to_float(scores.v[k]);
    if (j >= cols) {
      x = -INFINITY;
    } else if (p.mask) {
      const int64_t at = mask_row + j * p.layout.col_stride;
      if (p.bool_mask) {
        if (!static_cast<const bool*>(p.mask)[at]) x = -INFINITY;
      } else {
        const float m = to_float(static_cast<const T*>(p.mask)[at]);
        x = m == -INFINITY ? m : x + m;
      }
    }
    v[k] = x;
  }
}

template <typename T, int kVec, int kIters>
__global__ void __launch_bounds__(kIters > 0 ? kSoftmaxMaxRowThreads : kStreamThreads)
    masked_softmax_fwd_kernel(SoftmaxFwdParams<T> p, int row_threads) {
  using P = Pack<T, kVec>;
  constexpr int kSlots = kIters > 0 ? kIters : 1;
  __shared__ float2 red[32];
  const RowGroup g = row_group(row_threads);
  const int64_t chunks = p.lk / kVec, groups = blockDim.x / row_threads;
  for (int64_t row = blockIdx.x * groups + g.group; row < p.rows; row += gridDim.x * groups) {
    const P* srow = reinterpret_cast<const P*>(p.scores + row * p.lk);
    P* orow = reinterpret_cast<P*>(p.out + row * p.lk);
    const int64_t cols = p.lq ? causal_cols(row, p.lq, p.lk) : p.lk;
    const int64_t visible_chunks = (cols + kVec - 1) / kVec;  // chunks past these are written as zeros, unread
    const int64_t mask_row = p.mask ? mask_row_offset(p.layout, row) : 0;
    float2 ms = make_float2(-INFINITY, 0.f);  // (max, sum of exp(v - max)) over this thread's chunks
    float e[kSlots][kVec];                    // in registers: exp(v - ms.x)
    if constexpr (kIters > 0) {
      P sr[kSlots];
      load_chunks<kIters>(g.lane, row_threads, visible_chunks, sr, srow);
      for_chunks<kIters>(g.lane, row_threads, visible_chunks, [&](int it, int64_t c) {
        masked_values(p, sr[it], c, cols, mask_row, e[it]);
#pragma unroll
        for (int k = 0; k < kVec; ++k) ms.x = max_nan(ms.x, e[it][k]);
      });
      if (ms.x != -INFINITY) {
        for_chunks<kIters>(g.lane, row_threads, visible_chunks, [&](int it, int64_t c) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) {
            e[it][k] = __expf(e[it][k] - ms.x);
            ms.y += e[it][k];
          }
        });
      }
    } else {
      for_chunks<0>(g.lane, row_threads, visible_chunks, [&](int, int64_t c) {
        const P sv = srow[c];  // one 16-byte load
        float v[kVec];
        masked_values(p, sv, c, cols, mask_row, v);
        float m = ms.x;
#pragma unroll
        for (int k = 0; k < kVec; ++k) m = max_nan(m, v[k]);
        if (m == -INFINITY) return;
        float s = ms.y * __expf(ms.x - m);
#pragma unroll
        for (int k = 0; k < kVec; ++k) s += __expf(v[k] - m);
        ms = make_float2(m, s);
      });
    }
    const float2 total = row_allreduce(ms, MaxSumOp{}, row_threads, g.mask, red);
    if constexpr (kIters > 0) {
      // This thread's exp(v - ms.x) rescaled to the row's max; e holds no exps when all its entries were removed.
      const bool live = ms.x != -INFINITY;
      const float factor = live ? __expf(ms.x - total.x) / total.y : 0.f;
      for_chunks<kIters>(g.lane, row_threads, chunks, [&](int it, int64_t c) {
        P ov;
#pragma unroll
        for (int k = 0; k < kVec; ++k) ov.v[k] = from_float<T>(live && c < visible_chunks ? e[it][k] * factor : 0.f);
        orow[c] = ov;
      });
    } else {
      const bool empty = total.x == -INFINITY;  // no visible entry: zeros
      const float inv_sum = empty ? 0.f : 1.f / total.y;
      for_chunks<0>(g.lane, row_threads, chunks, [&](int, int64_t c) {
        P ov;
        if (c < visible_chunks && !empty) {
          const P sv = srow[c];
          float v[kVec];
          masked_values(p, sv, c, cols, mask_row, v);
#pragma unroll
          for (int k = 0; k < kVec; ++k) ov.v[k] = from_float<T>(__expf(v[k] - total.x) * inv_sum);
        } else {
#pragma unroll
          for (int k = 0; k < kVec; ++k) ov.v[k] = from_float<T>(0.f);
        }
        orow[c] = ov;
      });
    }
  }
}

template <typename T, int kVec, int kIters>
__global__ void __launch_bounds__(kIters > 0 ? kSoftmaxMaxRowThreads : kStreamThreads)
    masked_softmax_bwd_kernel(SoftmaxBwdParams<T> p, int row_threads) {
  using P = Pack<T, kVec>;
  constexpr int kSlots = kIters > 0 ? kIters : 1;
  __shared__ float red[32];
  const RowGroup g = row_group(row_threads);
  const int64_t chunks = p.lk / kVec, groups = blockDim.x / row_threads;
  for (int64_t row = blockIdx.x * groups + g.group; row < p.rows; row += gridDim.x * groups) {
    const P* grow = reinterpret_cast<const P*>(p.grad_out + row * p.lk);
    const P* orow = reinterpret_cast<const P*>(p.out + row * p.lk);
    P gr[kSlots], outr[kSlots];
    load_chunks<kIters>(g.lane, row_threads, chunks, gr, grow, outr, orow);
    float dot = 0.f;
    for_chunks<kIters>(g.lane, row_threads, chunks, [&](int it, int64_t c) {
      const P gv = chunk_at<kIters>(gr, it, grow, c), ov = chunk_at<kIters>(outr, it, orow, c);
#pragma unroll
      for (int k = 0; k < kVec; ++k) dot = fmaf(to_float(gv.v[k]), to_float(ov.v[k]), dot);
    });
    dot = row_allreduce(dot, SumOp{}, row_threads, g.mask, red);
    P* drow = reinterpret_cast<P*>(p.grad + row * p.lk);
    for_chunks<kIters>(g.lane, row_threads, chunks, [&](int it, int64_t c) {
      const P gv = chunk_at<kIters>(gr, it, grow, c), ov = chunk_at<kIters>(outr, it, orow, c);
      P dv;
#pragma unroll
      for (int k = 0; k < kVec; ++k) dv.v[k] = from_float<T>(p.scale * to_float(ov.v[k]) * (to_float(gv.v[k]) - dot));
      drow[c] = dv;
    });
  }
}

// ---- launches (masked_softmax_launch.h) ----

template <typename T>
void launch_masked_softmax_fwd(const SoftmaxFwdParams<T>& p, bool can_vec, cudaStream_t stream) {
  constexpr int kPack = kPackElems<T>;
  const RowConfig cfg = row_config(p.lk, can_vec && p.lk % kPack == 0 ? kPack : 1, kSoftmaxFwdMaxElems,
                                   kSoftmaxMaxRowThreads);
  dispatch_row_config<kPack, kSoftmaxFwdMaxElems>(cfg, [&](auto kVec, auto kIters) {
    masked_softmax_fwd_kernel<T, kVec, kIters><<<grid_for_rows(p.rows, cfg), cfg.block, 0, stream>>>(
        p, cfg.row_threads);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

template <typename T>
void launch_masked_softmax_bwd(const SoftmaxBwdParams<T>& p, bool can_vec, cudaStream_t stream) {
  constexpr int kPack = kPackElems<T>;
  const RowConfig cfg = row_config(p.lk, can_vec && p.lk % kPack == 0 ? kPack : 1, kSoftmaxBwdMaxElems,
                                   kSoftmaxMaxRowThreads);
  dispatch_row_config<kPack, kSoftmaxBwdMaxElems>(cfg, [&](auto kVec, auto kIters) {
    masked_softmax_bwd_kernel<T, kVec, kIters><<<grid_for_rows(p.rows, cfg), cfg.block, 0, stream>>>(
        p, cfg.row_threads);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace pytransformer::cuda
