#pragma once
// CUDA kernels of decode_attention ("flash-decoding"): q [B, Hq, T, D] over the first cache_lengths[b] rows of
// k_cache / v_cache [B, Hkv, capacity, D|Dv], read in place, -> out [B, Hq, T, Dv] (contiguous).
//
// Split kernel: a block = (row b, cache head h, pass of kRows query rows, split of the keys). The M = G * T query
// rows of a cache head (G = Hq / Hkv heads of its group, T queries each; row m = g * T + t) are processed kRows at a
// time, so each K and V row is loaded once for all of them (M <= kRows: one pass). The keys [first, n) that row b's
// queries can see are cut into `splits` equal chunks, one per block. Inside a block, each warp takes keys in steps of
// kDecodeKeys keys per lane group: a group of `lanes` (a power of two <= 32) threads holds one key row, each thread
// kC chunks of kVec elements (a 16-byte pack when K and V rows are aligned, else one element), so a thread has
// 2 * kDecodeKeys * kC loads in flight before it computes. Scores are reduced over the group with shuffles, then an
// online softmax (base 2: q is pre-scaled by scale * log2(e)) updates the group's running (max, sum, output). At the
// end the lane groups of a warp, then the warps of the block, merge their states. One split: the block writes the
// normalised output; several: float32 partials (output, max, sum) per split and query row, merged by the combine
// kernel (log-sum-exp weights).
//
// Cost, T = 1, bf16, D = Dv = 128, G = 4: per key 512 bytes of K and V read, 4 * 2 * 128 FMAs (scores and output) =
// 4 flops per byte: memory-bound on H100/H200 (the floor is the cache bytes over the copy bandwidth). Partials add
// splits * B * Hq * T * (Dv + 2) * 4 bytes written and read again (about 1% for the acceptance case).
#include "common.cuh"
#include "decode_attention_launch.h"

#include <cmath>

namespace pytransformer::cuda {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / 32;
constexpr int kDecodeKeys = 4;              // keys a lane group loads per step
constexpr int64_t kDecodeMinSplitKeys = 128;  // fewest keys worth a split of their own

// The running softmax state of a thread (kRows query rows, kC chunks of kVec output elements each) merged with
// another one: both rescaled to the larger max. Rounded without contraction so both sides of a shuffle agree.
template <int kRows, int kC, int kVec>
__device__ __forceinline__ void merge_state(float (&mx)[kRows], float (&l)[kRows], float (&o)[kRows][kC][kVec],
                                            const float (&mx2)[kRows], const float (&l2)[kRows],
                                            const float (&o2)[kRows][kC][kVec]) {
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float m = max_nan(mx[r], mx2[r]);
    if (m == -INFINITY) continue;
    const float a = exp2f(mx[r] - m), b = exp2f(mx2[r] - m);
    mx[r] = m;
    l[r] = __fadd_rn(__fmul_rn(l[r], a), __fmul_rn(l2[r], b));
#pragma unroll
    for (int c = 0; c < kC; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) o[r][c][e] = __fadd_rn(__fmul_rn(o[r][c][e], a), __fmul_rn(o2[r][c][e], b));
  }
}

template <typename T, int kVec, int kC, int kRows>
__global__ void __launch_bounds__(kDecodeThreads) decode_split_kernel(DecodeArgs<T> a) {
  using P = Pack<T, kVec>;
  const DecodeAttentionParams& p = a.p;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int L = a.lanes, sub = lane % L, group = lane / L, groups = 32 / L;
  int64_t idx = blockIdx.x;
  const int split = int(idx % a.splits);
  idx /= a.splits;
  const int pass = int(idx % a.passes);
  idx /= a.passes;
  const int64_t h = idx % p.kv_heads, b = idx / p.kv_heads;
  const int64_t G = p.q_heads / p.kv_heads, Tq = p.q_len, M = G * Tq, D = p.head_dim, Dv = p.v_head_dim;
  const int64_t chunks_k = (D + kVec - 1) / kVec, chunks_v = (Dv + kVec - 1) / kVec;

  // The keys [first, n) that the row's queries see (n out of range happens only under graph capture: zeros), and
  // this block's chunk [j0, j1) of them.
  int64_t n = a.lengths.at(b);
  if (n < Tq || n > p.capacity) n = 0;
  const int64_t first = p.window > 0 ? std::max<int64_t>(0, n - Tq - p.window + 1) : 0;
  const int64_t span = n > 0 ? n - first : 0;
  const int64_t even = (span + a.splits - 1) / a.splits;
  const int64_t chunk = even > kDecodeMinSplitKeys ? even : kDecodeMinSplitKeys;
  const int64_t j0 = first + split * chunk, j1 = std::min(n, j0 + chunk);

  // This thread's slice of the scaled queries, and each row's position (it sees keys pos - window < j <= pos).
  float q[kRows][kC][kVec];
  int64_t pos[kRows];
  bool live[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t m = int64_t(pass) * kRows + r, g = m / Tq, t = m % Tq;
    live[r] = m < M;
    pos[r] = n - Tq + t;
    const T* qrow = a.q + b * p.q_stride[0] + (h * G + g) * p.q_stride[1] + t * p.q_stride[2];
#pragma unroll
    for (int c = 0; c < kC; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int64_t d = (sub + int64_t(c) * L) * kVec + e;
        q[r][c][e] = live[r] && d < D ? to_float(qrow[d]) * a.scale_log2 : 0.f;
      }
  }

  float o[kRows][kC][kVec] = {}, mx[kRows], l[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) mx[r] = -INFINITY, l[r] = 0.f;
  const T* kh = a.k + b * p.k_stride[0] + h * p.k_stride[1];
  const T* vh = a.v + b * p.v_stride[0] + h * p.v_stride[1];
  // Warp-uniform loop (the shuffles need every lane): lane group `group` takes keys jw + group * kDecodeKeys + i.
  for (int64_t jw = j0 + int64_t(warp) * groups * kDecodeKeys; jw < j1;
       jw += int64_t(kDecodeWarps) * groups * kDecodeKeys) {
    const int64_t jb = jw + group * kDecodeKeys;
    P kr[kDecodeKeys][kC] = {}, vr[kDecodeKeys][kC] = {};  // keys past j1 and chunks past the row stay zero
#pragma unroll
    for (int i = 0; i < kDecodeKeys; ++i)
      if (jb + i < j1) {
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          const int64_t ch = sub + int64_t(c) * L;
          if (ch < chunks_k) kr[i][c] = *reinterpret_cast<const P*>(kh + (jb + i) * p.k_stride[2] + ch * kVec);
          if (ch < chunks_v) vr[i][c] = *reinterpret_cast<const P*>(vh + (jb + i) * p.v_stride[2] + ch * kVec);
        }
      }
    float s[kRows][kDecodeKeys];  // log2-scaled scores; -inf where the key is invisible to the row
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kDecodeKeys; ++i) {
        float acc = 0.f;
#pragma unroll
        for (int c = 0; c < kC; ++c)
#pragma unroll
          for (int e = 0; e < kVec; ++e) acc = fmaf(q[r][c][e], to_float(kr[i][c].v[e]), acc);
        s[r][i] = acc;
      }
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int i = 0; i < kDecodeKeys; ++i)
        for (int offset = L / 2; offset > 0; offset /= 2) s[r][i] += shfl_xor(s[r][i], offset, 0xffffffffu);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < kDecodeKeys; ++i) {
        const int64_t j = jb + i;
        const bool visible = live[r] && j < j1 && j <= pos[r] && (p.window == 0 || j > pos[r] - p.window);
        s[r][i] = visible ? s[r][i] : -INFINITY;
        tile_max = max_nan(tile_max, s[r][i]);
      }
      if (tile_max == -INFINITY) continue;
      const float new_max = max_nan(mx[r], tile_max), alpha = exp2f(mx[r] - new_max);
      mx[r] = new_max;
      float w[kDecodeKeys], sum = 0.f;
#pragma unroll
      for (int i = 0; i < kDecodeKeys; ++i) sum += (w[i] = exp2f(s[r][i] - new_max));
      l[r] = l[r] * alpha + sum;
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          float acc = o[r][c][e] * alpha;
#pragma unroll
          for (int i = 0; i < kDecodeKeys; ++i)  // a hidden key (w = 0) is skipped: 0 * NaN is NaN
            if (w[i] != 0.f) acc = fmaf(w[i], to_float(vr[i][c].v[e]), acc);
          o[r][c][e] = acc;
        }
    }
  }

  // Merge the lane groups of the warp (lanes sub, sub + L, ... hold the same output elements).
  for (int offset = L; offset < 32; offset *= 2) {
    float mx2[kRows], l2[kRows], o2[kRows][kC][kVec];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      mx2[r] = shfl_xor(mx[r], offset, 0xffffffffu);
      l2[r] = shfl_xor(l[r], offset, 0xffffffffu);
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) o2[r][c][e] = shfl_xor(o[r][c][e], offset, 0xffffffffu);
    }
    merge_state(mx, l, o, mx2, l2, o2);
  }
  // Merge the warps one after another through shared memory; the last warp ends with the block's state. (A warp
  // reads the state before any of its lanes overwrites it: a barrier between the two.)
  __shared__ float smem_o[kRows][kDecodeMaxHeadDim];
  __shared__ float smem_ml[kRows][2];
  for (int w = 0; w < kDecodeWarps; ++w) {
    if (warp == w && group == 0 && w > 0) {
      float mx2[kRows], l2[kRows], o2[kRows][kC][kVec];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        mx2[r] = smem_ml[r][0], l2[r] = smem_ml[r][1];
#pragma unroll
        for (int c = 0; c < kC; ++c)
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            const int64_t d = (sub + int64_t(c) * L) * kVec + e;
            o2[r][c][e] = d < Dv ? smem_o[r][d] : 0.f;
          }
      }
      merge_state(mx, l, o, mx2, l2, o2);
    }
    __syncthreads();
    if (warp == w && group == 0 && w + 1 < kDecodeWarps) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (sub == 0) smem_ml[r][0] = mx[r], smem_ml[r][1] = l[r];
#pragma unroll
        for (int c = 0; c < kC; ++c)
#pragma unroll
          for (int e = 0; e < kVec; ++e) {
            const int64_t d = (sub + int64_t(c) * L) * kVec + e;
            if (d < Dv) smem_o[r][d] = o[r][c][e];
          }
      }
    }
    __syncthreads();
  }
  if (warp != kDecodeWarps - 1 || group != 0) return;

  // Query row m of cache head h is output row (b * Hkv + h) * M + m of out viewed as [B * Hq * T, Dv].
  const int64_t out_rows = p.batch * p.q_heads * Tq;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    if (!live[r]) continue;
    const int64_t row = (b * p.kv_heads + h) * M + int64_t(pass) * kRows + r;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;  // no visible key: zeros
    if (a.splits == 1) {
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const int64_t d = (sub + int64_t(c) * L) * kVec + e;
          if (d < Dv) a.out[row * Dv + d] = from_float<T>(o[r][c][e] * inv);
        }
    } else {
      float* po = a.part_o + (split * out_rows + row) * Dv;
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const int64_t d = (sub + int64_t(c) * L) * kVec + e;
          if (d < Dv) po[d] = o[r][c][e];
        }
      if (sub == 0) a.part_ml[split * out_rows + row] = make_float2(mx[r], l[r]);
    }
  }
}

// out row = sum_s 2^(max_s - max) o_s / sum_s 2^(max_s - max) l_s over the splits s; a warp per output row.
template <typename T>
__global__ void __launch_bounds__(kDecodeThreads) decode_combine_kernel(const float* part_o, const float2* part_ml,
                                                                        T* out, int64_t rows, int64_t dv, int splits) {
  const int64_t row = int64_t(blockIdx.x) * kDecodeWarps + threadIdx.x / 32;
  if (row >= rows) return;
  float gmax = -INFINITY;
  for (int s = 0; s < splits; ++s) gmax = max_nan(gmax, part_ml[s * rows + row].x);
  float denom = 0.f;
  if (gmax != -INFINITY)
    for (int s = 0; s < splits; ++s) denom += exp2f(part_ml[s * rows + row].x - gmax) * part_ml[s * rows + row].y;
  const float inv = denom > 0.f ? 1.f / denom : 0.f;  // no visible key: zeros
  for (int64_t d = threadIdx.x % 32; d < dv; d += 32) {
    float acc = 0.f;
    if (gmax != -INFINITY)
      for (int s = 0; s < splits; ++s) acc += exp2f(part_ml[s * rows + row].x - gmax) * part_o[(s * rows + row) * dv + d];
    out[row * dv + d] = from_float<T>(acc * inv);
  }
}

// ---- launch (decode_attention_launch.h) ----

template <typename T>
void launch_decode_attention(DecodeArgs<T> a, bool packed, cudaStream_t stream, FloatAlloc alloc_floats) {
  const DecodeAttentionParams& p = a.p;
  constexpr int kPack = kPackElems<T>;
  const int vec = packed ? kPack : 1;
  const int64_t chunks = (std::max(p.head_dim, p.v_head_dim) + vec - 1) / vec;
  a.lanes = next_pow2(std::min<int64_t>(chunks, 32));
  const int kc = next_pow2((chunks + a.lanes - 1) / a.lanes);
  const int64_t M = p.q_heads / p.kv_heads * p.q_len;
  const int rows = M <= 1 ? 1 : M <= 2 ? 2 : 4;
  a.passes = static_cast<int>((M + rows - 1) / rows);
  auto with_kernel = [&](auto kernel) {
    // Splits: fill the device once (the resident blocks of one wave) without splitting a row's visible keys
    // (at most `capacity`, or window + T - 1) into chunks shorter than kDecodeMinSplitKeys.
    int per_sm = 0;
    C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kDecodeThreads, 0));
    const int64_t units = p.batch * p.kv_heads * a.passes;
    const int64_t span = p.window > 0 ? std::min(p.capacity, p.window + p.q_len - 1) : p.capacity;
    const int64_t fill = int64_t(std::max(per_sm, 1)) * multiprocessor_count() / units;
    a.splits = static_cast<int>(std::clamp<int64_t>(
        std::min(fill, (span + kDecodeMinSplitKeys - 1) / kDecodeMinSplitKeys), 1, 1024));
    const int64_t out_rows = p.batch * p.q_heads * p.q_len;
    if (a.splits > 1) {
      // [splits, rows, Dv] floats, then [splits, rows] float2s from the next 16-byte boundary (a float2 access must be
      // 8-byte aligned, and splits * rows * Dv floats may be odd).
      const int64_t ml_offset = (a.splits * out_rows * p.v_head_dim + 3) / 4 * 4;
      a.part_o = alloc_floats(ml_offset + a.splits * out_rows * 2);
      a.part_ml = reinterpret_cast<float2*>(a.part_o + ml_offset);
    }
    kernel<<<unsigned(units * a.splits), kDecodeThreads, 0, stream>>>(a);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (a.splits > 1) {
      const unsigned blocks = unsigned((out_rows + kDecodeWarps - 1) / kDecodeWarps);
      decode_combine_kernel<T><<<blocks, kDecodeThreads, 0, stream>>>(a.part_o, a.part_ml, a.out, out_rows,
                                                                      p.v_head_dim, a.splits);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  };
  auto with_rows = [&](auto kvec, auto kchunks) {
    constexpr int kVec = decltype(kvec)::value, kC = decltype(kchunks)::value;
    if (rows == 1) return with_kernel(decode_split_kernel<T, kVec, kC, 1>);
    if (rows == 2) return with_kernel(decode_split_kernel<T, kVec, kC, 2>);
    with_kernel(decode_split_kernel<T, kVec, kC, 4>);
  };
  // Chunks a thread: D, Dv <= kDecodeMaxHeadDim over 32 lanes.
  if (packed) {
    dispatch_chunks<1, std::max(1, kDecodeMaxHeadDim / (32 * kPack))>(
        kc, [&](auto kchunks) { with_rows(std::integral_constant<int, kPack>{}, kchunks); });
  } else {
    dispatch_chunks<1, kDecodeMaxHeadDim / 32>(
        kc, [&](auto kchunks) { with_rows(std::integral_constant<int, 1>{}, kchunks); });
  }
}

}  // namespace pytransformer::cuda
