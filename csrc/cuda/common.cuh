#pragma once
// Shared pieces of the CUDA kernels and their launch code (the kernel units alone: what the glue shares with them is
// launch.h): float32 conversion of the storage types, 16-byte packs, the row kernels' (norms, masked_softmax) row
// geometry and all-reductions over a row's threads, and the launch code's row geometry.
//
// Row geometry. A row of n elements is cut into chunks of kVec elements (one 16-byte pack, or kVec = 1 when the rows
// are not 16-byte aligned). A group of `row_threads` threads works on a row: 1..32 threads share a warp (a block then
// holds several rows), 64..1024 threads are a whole block. Thread `lane` of the group owns chunks
// lane, lane + row_threads, lane + 2 * row_threads, ...; with kIters > 0 these are at most kIters chunks kept in
// registers between the passes over the row, with kIters == 0 (rows too long for registers) each pass streams the
// row from memory again.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "launch.h"

namespace pytransformer::cuda {

// ---- storage types <-> float32 ----

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>);
    return __float2bfloat16_rn(v);
  }
}

// kVec elements read or written as one access (16 bytes when kVec * sizeof(T) == 16).
template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Pack {
  T v[kVec];
};

// Elements per 16-byte pack.
template <typename T>
constexpr int kPackElems = 16 / sizeof(T);

// ---- row geometry ----

// This thread's place in its row group.
struct RowGroup {
  int lane;       // index within the group, 0 .. row_threads - 1
  int group;      // index of the group within the block
  unsigned mask;  // the warp lanes of the group, for shuffles
};

__device__ __forceinline__ RowGroup row_group(int row_threads) {
  const int t = threadIdx.x;
  if (row_threads >= 32) return {t % row_threads, t / row_threads, 0xffffffffu};
  const unsigned width_mask = (1u << row_threads) - 1u;
  return {t % row_threads, t / row_threads, width_mask << ((t % 32) / row_threads * row_threads)};
}

// Calls f(it, c) for each chunk c < chunks that this thread owns; `it` is the register slot (a constant after
// unrolling when kIters > 0; always 0 when streaming).
template <int kIters, class F>
__device__ __forceinline__ void for_chunks(int lane, int row_threads, int64_t chunks, F&& f) {
  if constexpr (kIters > 0) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int64_t c = int64_t(it) * row_threads + lane;
      if (c < chunks) f(it, c);
    }
  } else {
#pragma unroll 4
    for (int64_t c = lane; c < chunks; c += row_threads) f(0, c);
  }
}

// regs[it] = row[c] for each (regs, row) pair of arguments.
template <class P, int kSlots, class... More>
__device__ __forceinline__ void load_chunk(int it, int64_t c, P (&regs)[kSlots], const P* row, More&&... more) {
  regs[it] = row[c];
  if constexpr (sizeof...(More) > 0) load_chunk(it, c, more...);
}

// The row loader: load_chunks<kIters>(lane, row_threads, chunks, regs, row, ...) loads this thread's chunks of each
// row (a P* of `chunks` packs) into the register slots `regs` (P[kSlots]), chunk by chunk for all the rows at once,
// when rows are held in registers (kIters > 0); streamed rows (kIters == 0) stay in memory (read them by chunk_at).
template <int kIters, class... Rows>
__device__ __forceinline__ void load_chunks(int lane, int row_threads, int64_t chunks, Rows&&... rows) {
  if constexpr (kIters > 0)
    for_chunks<kIters>(lane, row_threads, chunks, [&](int it, int64_t c) { load_chunk(it, c, rows...); });
}

// Chunk c of a row: from its register slot `it` when the row is held in registers, else from memory.
template <int kIters, class P, int kSlots>
__device__ __forceinline__ P chunk_at(const P (&regs)[kSlots], int it, const P* row, int64_t c) {
  if constexpr (kIters > 0) {
    return regs[it];
  } else {
    return row[c];
  }
}

// ---- all-reductions over a row group ----

__device__ __forceinline__ float shfl_xor(float v, int offset, unsigned mask) {
  return __shfl_xor_sync(mask, v, offset);
}
__device__ __forceinline__ float2 shfl_xor(float2 v, int offset, unsigned mask) {
  return make_float2(__shfl_xor_sync(mask, v.x, offset), __shfl_xor_sync(mask, v.y, offset));
}

struct SumOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return a + b; }
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const { return make_float2(a.x + b.x, a.y + b.y); }
};

// max(a, b) propagating NaN from either side (fmaxf returns the other operand): a NaN score gives a NaN row, as in
// torch, instead of passing for a row with nothing visible.
__device__ __forceinline__ float max_nan(float a, float b) { return (a > b || a != a) ? a : b; }

// Whether x is an inf or a NaN, read off its exponent bits (integer arithmetic, which fast math leaves alone).
__device__ __forceinline__ bool non_finite(float x) { return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u; }

// (max, sum of exp(v - max)) pairs of two parts of a row merged; (-inf, 0) is the empty part. Rounded explicitly
// (no fma contraction) so that the merge is symmetric and every lane of a butterfly ends with the same value.
struct MaxSumOp {
  __device__ __forceinline__ float2 operator()(float2 a, float2 b) const {
    const float m = max_nan(a.x, b.x);
    if (m == -INFINITY) return make_float2(-INFINITY, 0.f);
    return make_float2(m, __fadd_rn(__fmul_rn(a.y, __expf(a.x - m)), __fmul_rn(b.y, __expf(b.x - m))));
  }
};

// Combines v over the row_threads threads of a row group; every thread of the group gets the same result. Groups
// wider than a warp are the whole block: then every thread of the block must call this, and `smem` holds one V per
// warp (it is free again on return).
template <class V, class Op>
__device__ __forceinline__ V row_allreduce(V v, Op op, int row_threads, unsigned mask, V* smem) {
  const int width = row_threads < 32 ? row_threads : 32;
  for (int offset = width / 2; offset > 0; offset /= 2) v = op(v, shfl_xor(v, offset, mask));
  if (row_threads <= 32) return v;
  const int warp = threadIdx.x / 32, warps = blockDim.x / 32;
  if (threadIdx.x % 32 == 0) smem[warp] = v;
  __syncthreads();
  v = smem[0];
  for (int w = 1; w < warps; ++w) v = op(v, smem[w]);
  __syncthreads();
  return v;
}

// ---- launch side: row geometry ----

// How a kernel walks rows of n elements (see the top of this file).
struct RowConfig {
  int vec;          // elements per chunk
  int row_threads;  // threads per row: a power of two, 1 .. 1024
  int iters;        // chunks per thread kept in registers (1, 2, 4 or 8); 0: streaming
  int block;        // threads per block
  int rows_per_block() const { return block / row_threads; }
};

// Streaming rows: a block of this many threads per row.
constexpr int kStreamThreads = 1024;
// Rows of a warp or less: this many threads per block (several rows per block).
constexpr int kSmallRowsBlock = 128;

inline int next_pow2(int64_t v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

// The geometry for rows of n elements read `vec` at a time (the pack width, or 1 when the rows are not aligned for
// packs) that keeps at most max_elems elements per thread and max_row_threads threads per row in registers (the
// kernel's register launch bound): up to a warp per row while that fits, else a block per row, else streaming.
inline RowConfig row_config(int64_t n, int vec, int max_elems, int max_row_threads) {
  const int max_iters = std::max(1, std::min(8, max_elems / vec));
  const int64_t chunks = (n + vec - 1) / vec;
  int row_threads = next_pow2(std::min<int64_t>(chunks, 32));
  int64_t iters = (chunks + row_threads - 1) / row_threads;
  if (iters > max_iters) {
    const int64_t threads = (chunks + max_iters - 1) / max_iters;
    if (threads > max_row_threads) return {vec, kStreamThreads, 0, kStreamThreads};
    row_threads = next_pow2(threads);
    iters = (chunks + row_threads - 1) / row_threads;
  }
  return {vec, row_threads, next_pow2(iters), row_threads <= 32 ? kSmallRowsBlock : row_threads};
}

// Calls f(std::integral_constant<int, k>) for the k of {0, 1, 2, 4, 8, 16} within [kMin, kMax] that equals n (chunks
// a thread, chosen by the launch code within those bounds), instantiating f for those k only. Written as one test a k
// rather than a switch, so that no code exists for a k outside the bounds (the emulator's line coverage counts none).
template <int kMin, int kMax, class F>
void dispatch_chunks(int n, F&& f) {
  bool called = false;
  auto one = [&](auto k) {
    if constexpr (kMin <= decltype(k)::value && decltype(k)::value <= kMax)
      if (n == decltype(k)::value) {
        f(k);
        called = true;
      }
  };
  one(std::integral_constant<int, 0>{});
  one(std::integral_constant<int, 1>{});
  one(std::integral_constant<int, 2>{});
  one(std::integral_constant<int, 4>{});
  one(std::integral_constant<int, 8>{});
  one(std::integral_constant<int, 16>{});
  TORCH_CHECK(called, "internal error: ", n, " chunks a thread, outside ", kMin, "..", kMax, " or not a power of 2");
}

// Calls f(std::integral_constant<int, kVec>, std::integral_constant<int, kIters>) for cfg.vec (kPackVec or 1) and
// cfg.iters, instantiating only the (kVec, kIters) pairs that row_config(..., kMaxElems, ...) can choose.
template <int kPackVec, int kMaxElems, class F>
void dispatch_row_config(const RowConfig& cfg, F&& f) {
  auto with_iters = [&](auto vec) {
    dispatch_chunks<0, std::max(1, std::min(8, kMaxElems / decltype(vec)::value))>(cfg.iters,
                                                                                   [&](auto iters) { f(vec, iters); });
  };
  if (cfg.vec == kPackVec) {
    with_iters(std::integral_constant<int, kPackVec>{});
  } else {
    TORCH_CHECK(cfg.vec == 1, "internal error: unsupported vector width ", cfg.vec);
    with_iters(std::integral_constant<int, 1>{});
  }
}

// Blocks for `rows` rows: one row group per row, capped (the kernels loop over rows with a grid stride).
inline unsigned grid_for_rows(int64_t rows, const RowConfig& cfg) {
  const int64_t groups = cfg.rows_per_block();
  return static_cast<unsigned>(std::min<int64_t>((rows + groups - 1) / groups, int64_t(1) << 30));
}

}  // namespace pytransformer::cuda
