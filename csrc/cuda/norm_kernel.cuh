#pragma once
// CUDA kernels of layer_norm and rms_norm (forward and backward) over rows x [rows, n], templated on the storage type
// T (float, __half, __nv_bfloat16; float32 arithmetic) and on the row geometry of common.cuh. `center` selects
// LayerNorm (subtract the mean) or RMSNorm. LayerNorm statistics take two passes, as on the CPU: m = mean(x), then
// shifted sums s1 = sum(x - m), s2 = sum((x - m)^2), so mean = m + s1 / n and var = s2 / n - (s1 / n)^2 stay
// accurate for any offset of the row. The backward fuses grad_x with per-block partial sums of the weight and bias
// gradients ([blocks, n] float32, deterministic, no atomics), summed over blocks by column_sum_kernel.
#include "common.cuh"
#include "norm_launch.h"

namespace pytransformer::cuda {

// Rows held in registers use at most this many threads (the kernels' launch bound: up to 128 registers a thread)
// and this many elements a thread; the backward holds two rows and two column accumulators.
constexpr int kNormMaxRowThreads = 512;
constexpr int kNormFwdMaxElems = 64;
constexpr int kNormBwdMaxElems = 16;
static_assert(kNormBwdMaxElems >= kPackElems<__half>, "group_sums assumes at most kNormBwdMaxElems columns a thread");

template <typename T, int kVec, int kIters>
__global__ void __launch_bounds__(kIters > 0 ? kNormMaxRowThreads : kStreamThreads)
    norm_fwd_kernel(NormFwdParams<T> p, int row_threads) {
  using P = Pack<T, kVec>;
  constexpr int kSlots = kIters > 0 ? kIters : 1;
  __shared__ float2 red[32];
  const RowGroup g = row_group(row_threads);
  const int64_t chunks = p.n / kVec, groups = blockDim.x / row_threads;
  const P* w = reinterpret_cast<const P*>(p.weight);
  const P* b = reinterpret_cast<const P*>(p.bias);
  for (int64_t row = blockIdx.x * groups + g.group; row < p.rows; row += gridDim.x * groups) {
    const P* xrow = reinterpret_cast<const P*>(p.x + row * p.n);
    P xr[kSlots];
    load_chunks<kIters>(g.lane, row_threads, chunks, xr, xrow);
    float shift = 0.f;
    if (p.center) {
      float2 m = make_float2(0.f, 0.f);
      for_chunks<kIters>(g.lane, row_threads, chunks, [&](int it, int64_t c) {
        const P xv = chunk_at<kIters>(xr, it, xrow, c);
#pragma unroll
        for (int k = 0; k < kVec; ++k) m.x += to_float(xv.v[k]);
      });
      shift = row_allreduce(m, SumOp{}, row_threads, g.mask, red).x / p.n;
    }
    float2 s = make_float2(0.f, 0.f);
    for_chunks<kIters>(g.lane, row_threads, chunks, [&](int it, int64_t c) {
      const P xv = chunk_at<kIters>(xr, it, xrow, c);
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float d = to_float(xv.v[k]) - shift;
        s.x += d;
        s.y = fmaf(d, d, s.y);
      }
    });
    s = row_allreduce(s, SumOp{}, row_threads, g.mask, red);
    // LayerNorm: mean = x0 + s1 / n, var = s2 / n - (s1 / n)^2; RMSNorm: mean 0, mean square s2 / n.
    const float d = s.x / p.n, mean = p.center ? shift + d : 0.f;
    const float var = p.center ? fmaxf(s.y / p.n - d * d, 0.f) : s.y / p.n;
    const float rstd = rsqrtf(var + p.eps);
    if (g.lane == 0) {
      if (p.mean) p.mean[row] = mean;
      p.rstd[row] = rstd;
    }
    P* yrow = reinterpret_cast<P*>(p.y + row * p.n);
    for_chunks<kIters>(g.lane, row_threads, chunks, [&](int it, int64_t c) {
      const P xv = chunk_at<kIters>(xr, it, xrow, c);
      P wv, bv, yv;
      if (w) wv = w[c];
      if (b) bv = b[c];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float v = (to_float(xv.v[k]) - mean) * rstd;
        if (w) v *= to_float(wv.v[k]);
        if (b) v += to_float(bv.v[k]);
        yv.v[k] = from_float<T>(v);
      }
      yrow[c] = yv;
    });
  }
}

// grad_x = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)) with gw = grad_out * weight (RMSNorm: no mean(gw) term);
// block b adds grad_out * xhat and grad_out of its rows into row b of weight_parts / bias_parts. In registers, each
// thread accumulates its own columns over the rows it visits; row groups sharing a block then sum through shared
// memory. Streaming, the block owns its partial row in memory.
template <typename T, int kVec, int kIters>
__global__ void __launch_bounds__(kIters > 0 ? kNormMaxRowThreads : kStreamThreads)
    norm_bwd_kernel(NormBwdParams<T> p, int row_threads) {
  using P = Pack<T, kVec>;
  constexpr int kSlots = kIters > 0 ? kIters : 1;
  // Several rows per block (groups > 1: rows of a warp or less): the groups' column sums, [groups, n].
  __shared__ float group_sums[kIters > 0 ? kSmallRowsBlock * kNormBwdMaxElems : 1];
  __shared__ float2 red[32];
  const RowGroup g = row_group(row_threads);
  const int64_t chunks = p.n / kVec, groups = blockDim.x / row_threads;
  const P* w = reinterpret_cast<const P*>(p.weight);
  float* wpart = p.weight_parts ? p.weight_parts + blockIdx.x * p.n : nullptr;  // [n] this block's partial sums
  float* bpart = p.bias_parts ? p.bias_parts + blockIdx.x * p.n : nullptr;
  float wacc[kSlots][kVec] = {}, bacc[kSlots][kVec] = {};  // in registers: this thread's columns
  for (int64_t row = blockIdx.x * groups + g.group; row < p.rows; row += gridDim.x * groups) {
    const P* xrow = reinterpret_cast<const P*>(p.x + row * p.n);
    const P* grow = reinterpret_cast<const P*>(p.grad_out + row * p.n);
    P xr[kSlots], gr[kSlots];
    load_chunks<kIters>(g.lane, row_threads, chunks, xr, xrow, gr, grow);
    const float mu = p.mean ? p.mean[row] : 0.f, rstd = p.rstd[row];
    float2 s = make_float2(0.f, 0.f);  // sum(gw), sum(gw * xhat)
    for_chunks<kIters>(g.lane, row_threads, chunks, [&](int it, int64_t c) {
      const P xv = chunk_at<kIters>(xr, it, xrow, c), gv = chunk_at<kIters>(gr, it, grow, c);
      P wv;
      if (w) wv = w[c];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float gw = w ? to_float(gv.v[k]) * to_float(wv.v[k]) : to_float(gv.v[k]);
        s.x += gw;
        s.y = fmaf(gw, (to_float(xv.v[k]) - mu) * rstd, s.y);
      }
    });
    s = row_allreduce(s, SumOp{}, row_threads, g.mask, red);
    const float c_gw = p.center ? s.x / p.n : 0.f, c_gwx = s.y / p.n;
    P* dxrow = reinterpret_cast<P*>(p.grad_x + row * p.n);
    for_chunks<kIters>(g.lane, row_threads, chunks, [&](int it, int64_t c) {
      const P xv = chunk_at<kIters>(xr, it, xrow, c), gv = chunk_at<kIters>(gr, it, grow, c);
      P wv, dxv;
      if (w) wv = w[c];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float gf = to_float(gv.v[k]), xhat = (to_float(xv.v[k]) - mu) * rstd;
        const float gw = w ? gf * to_float(wv.v[k]) : gf;
        dxv.v[k] = from_float<T>((gw - c_gw - xhat * c_gwx) * rstd);
        if constexpr (kIters > 0) {
          wacc[it][k] = fmaf(gf, xhat, wacc[it][k]);
          bacc[it][k] += gf;
        } else {
          const int64_t col = c * kVec + k;
          const bool first = row < gridDim.x;  // the block's first row starts its sums
          if (wpart) wpart[col] = first ? gf * xhat : fmaf(gf, xhat, wpart[col]);
          if (bpart) bpart[col] = first ? gf : bpart[col] + gf;
        }
      }
      dxrow[c] = dxv;
    });
  }
  if constexpr (kIters > 0) {
    // This block's partial row: the thread's own columns when one group fills the block, else the sum over groups.
    auto write_part = [&](const float (&acc)[kSlots][kVec], float* part) {
      if (groups == 1) {
        for_chunks<kIters>(g.lane, row_threads, chunks, [&](int it, int64_t c) {
#pragma unroll
          for (int k = 0; k < kVec; ++k) part[c * kVec + k] = acc[it][k];
        });
        return;
      }
      for_chunks<kIters>(g.lane, row_threads, chunks, [&](int it, int64_t c) {
#pragma unroll
        for (int k = 0; k < kVec; ++k) group_sums[g.group * p.n + c * kVec + k] = acc[it][k];
      });
      __syncthreads();
      for (int64_t col = threadIdx.x; col < p.n; col += blockDim.x) {
        float total = 0.f;
        for (int64_t i = 0; i < groups; ++i) total += group_sums[i * p.n + col];
        part[col] = total;
      }
      __syncthreads();
    };
    if (wpart) write_part(wacc, wpart);
    if (bpart) write_part(bacc, bpart);
  }
}

// out[k][col] = sum over p < parts of in[k][p * n + col], for the gridDim.y outputs k: one column per threadIdx.x,
// parts strided over threadIdx.y, then summed through shared memory.
constexpr int kColumnSumRows = 16;

template <typename T>
struct ColumnSumParams {
  const float* in[2];  // [parts, n] each
  T* out[2];           // [n] each
  int64_t parts, n;
};

template <typename T>
__global__ void __launch_bounds__(32 * kColumnSumRows) column_sum_kernel(ColumnSumParams<T> p) {
  __shared__ float sums[kColumnSumRows][33];
  const int64_t col = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const float* in = blockIdx.y == 0 ? p.in[0] : p.in[1];  // (constant indices keep p in parameter memory)
  float s = 0.f;
  if (col < p.n)
    for (int64_t r = threadIdx.y; r < p.parts; r += kColumnSumRows) s += in[r * p.n + col];
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < p.n) {
    for (int r = 1; r < kColumnSumRows; ++r) s += sums[r][threadIdx.x];
    (blockIdx.y == 0 ? p.out[0] : p.out[1])[col] = from_float<T>(s);
  }
}

// ---- launches (norm_launch.h) ----

template <typename T>
void launch_norm_fwd(const NormFwdParams<T>& p, bool can_vec, cudaStream_t stream) {
  constexpr int kPack = kPackElems<T>;
  const int vec = can_vec && p.n % kPack == 0 ? kPack : 1;
  const RowConfig cfg = row_config(p.n, vec, kNormFwdMaxElems, kNormMaxRowThreads);
  dispatch_row_config<kPack, kNormFwdMaxElems>(cfg, [&](auto kVec, auto kIters) {
    norm_fwd_kernel<T, kVec, kIters><<<grid_for_rows(p.rows, cfg), cfg.block, 0, stream>>>(p, cfg.row_threads);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

template <typename T>
void launch_norm_bwd(NormBwdParams<T> p, bool can_vec, T* out_weight, T* out_bias, cudaStream_t stream,
                     FloatAlloc alloc_parts) {
  constexpr int kPack = kPackElems<T>;
  const int vec = can_vec && p.n % kPack == 0 ? kPack : 1;
  const RowConfig cfg = row_config(p.n, vec, kNormBwdMaxElems, kNormMaxRowThreads);
  dispatch_row_config<kPack, kNormBwdMaxElems>(cfg, [&](auto kVec, auto kIters) {
    auto* kernel = norm_bwd_kernel<T, kVec, kIters>;
    const int groups = cfg.rows_per_block();
    // A persistent grid: as many blocks as are resident at once (each sums many rows), at most one per row group.
    int per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, cfg.block, 0));
    const int64_t grid = std::min<int64_t>((p.rows + groups - 1) / groups,
                                           int64_t(std::max(per_sm, 1)) * multiprocessor_count());
    ColumnSumParams<T> cs{{nullptr, nullptr}, {nullptr, nullptr}, grid, p.n};
    const int outputs = (out_weight != nullptr) + (out_bias != nullptr);
    float* parts = outputs ? alloc_parts(outputs * grid * p.n) : nullptr;  // [outputs, grid, n]
    int k = 0;
    if (out_weight) p.weight_parts = parts, cs.in[k] = parts, cs.out[k++] = out_weight;
    if (out_bias) p.bias_parts = parts + (k * grid * p.n), cs.in[k] = p.bias_parts, cs.out[k++] = out_bias;
    kernel<<<unsigned(grid), cfg.block, 0, stream>>>(p, cfg.row_threads);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (outputs) {
      const dim3 cs_grid(unsigned((p.n + 31) / 32), unsigned(outputs));
      column_sum_kernel<T><<<cs_grid, dim3(32, kColumnSumRows), 0, stream>>>(cs);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

}  // namespace pytransformer::cuda
