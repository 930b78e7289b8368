#pragma once
// CUDA kernels of int8_linear: out [M, N] = (x [M, K] @ weight^T) * scale + bias with an int8 weight [N, K], x and out
// in T (float, __half, __nv_bfloat16), scale and bias float32/float16/bfloat16 of their own dtype, float32 arithmetic.
// Weight values are turned into exact floats in registers (a byte permute and an add, dequant4) and multiplied
// unscaled; the scale is applied once per output.
//
// Few rows (M <= kGemvMaxRows: decoding) -- int8_gemv_kernel. The product is bound by reading the weight once:
// N * K bytes (plus x, M * K * sizeof(T), and out, M * N * sizeof(T)) for 2 * M * N * K flops. A block owns
// kGemvBlockRows weight rows, up to kGemvMaxTileRows rows of x (staged in shared memory as float32, chunk by chunk of
// columns) and one K slice (split-K when N alone gives too few blocks to fill the device; the float32 partial sums,
// split * M * N * 4 bytes written and read once, are added up by int8_linear_sum_kernel). Four lanes share a weight
// row: each streams 16 int8 per 16-byte load (64 contiguous bytes a quad, 8 rows a warp-wide load), kUnroll steps in
// flight; a lane owns two rows, so each x value read from shared memory (a broadcast: 4 addresses a warp) serves both.
// Weights that are not 16-byte aligned row by row (K % 16 != 0, or a misaligned tensor) are read byte by byte.
// Per weight byte the SIMT cores spend ~2 instructions dequantizing and M FMAs, so beyond ~8 rows of x the kernel
// becomes bound by FMA throughput rather than memory.
//
// Many rows (prefill) -- int8_gemm_kernel: a plain shared-memory tiled SIMT GEMM (64 x 128 output tile, 4 x 8 outputs
// a thread, K tiles of 32 with the weight tile dequantized into shared memory and the next tiles prefetched into
// registers). It is compute-bound (2 * M * N * K flops on the float32 FMA units); a tensor-core path (mma/wgmma on
// bf16/fp16 operands dequantized into shared memory) is the obvious next step.
#include "common.cuh"
#include "int8_linear_launch.h"

namespace pytransformer::cuda {

// ---- shared pieces ----

// Element i of v as a float32 (0 for an absent vector).
__device__ __forceinline__ float value_at(const FloatVec& v, int64_t i) {
  if (!v.data) return 0.f;
  switch (v.dtype) {
    case c10::ScalarType::Half: return to_float(static_cast<const __half*>(v.data)[i]);
    case c10::ScalarType::BFloat16: return to_float(static_cast<const __nv_bfloat16*>(v.data)[i]);
    default: return static_cast<const float*>(v.data)[i];
  }
}

// The four int8 values of a word as exact floats: the biased byte q + 128 becomes the low mantissa bits of 2^23, and
// subtracting 2^23 + 128 leaves q (one byte permute and one add a value, instead of a slower int-to-float conversion).
__device__ __forceinline__ void dequant4(uint32_t word, float (&q)[4]) {
  const uint32_t biased = word ^ 0x80808080u;
#pragma unroll
  for (int i = 0; i < 4; ++i) q[i] = __int_as_float(__byte_perm(biased, 0x4B000000u, 0x7440u + i)) - 8388736.f;
}

__device__ __forceinline__ uint32_t word_at(const uint4& v, int i) { return reinterpret_cast<const uint32_t*>(&v)[i]; }

// The 16 weights row[k .. k + 16) as a pack, zeros past `end` (or for a null row): one 16-byte load when kAligned
// (then k is a multiple of 16 and the 16 are all before `end` or all past it), else byte loads.
template <bool kAligned>
__device__ __forceinline__ uint4 load_weight16(const int8_t* row, int64_t k, int64_t end) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (!row || k >= end) return v;
  if constexpr (kAligned) {
    v = *reinterpret_cast<const uint4*>(row + k);
  } else {
    uint32_t* words = reinterpret_cast<uint32_t*>(&v);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      if (k + i < end) words[i / 4] |= uint32_t(uint8_t(row[k + i])) << (8 * (i % 4));
  }
  return v;
}

// out[m, n] from the full dot product of x row m with weight row n.
template <typename T>
__device__ __forceinline__ T finish(const Int8LinearArgs<T>& p, float dot, int64_t n) {
  return from_float<T>(fmaf(dot, value_at(p.scale, n), value_at(p.bias, n)));
}

// ---- few rows: GEMV ----

constexpr int kGemvThreads = 256;                      // 8 warps
constexpr int kQuad = 4;                               // lanes per weight row
constexpr int kLaneRows = 2;                           // weight rows per lane: n and n + 8
constexpr int kWarpRows = 32 / kQuad * kLaneRows;      // 16
constexpr int kGemvBlockRows = kGemvThreads / 32 * kWarpRows;  // 128 weight rows a block
constexpr int kStepCols = kQuad * 16;                  // columns a quad covers per step
constexpr int kUnroll = 4;                             // steps (16-byte loads per row) in flight a lane
constexpr int kGemvSmemFloats = 8192;                  // staged x: 32 KiB of shared memory
constexpr int kGemvMaxTileRows = 16;                   // rows of x a block
constexpr int64_t kGemvMaxRows = 64;                   // above: the tiled GEMM
constexpr int64_t kMinSliceCols = 256;                 // split-K never cuts K finer than this

// Block (blockIdx.x = n block * m_tiles + m tile, blockIdx.y = K slice): x rows [m0, m0 + kRows), weight rows
// [n0, n0 + kGemvBlockRows), columns [blockIdx.y * slice, + slice). Writes out (one slice) or its partial sums.
template <typename T, int kRows, bool kAligned>
__global__ void __launch_bounds__(kGemvThreads, 2) int8_gemv_kernel(Int8LinearArgs<T> p, int64_t slice) {
  constexpr int kChunk = kGemvSmemFloats / kRows;  // columns of x staged at a time
  static_assert(kChunk % (kStepCols * kUnroll) == 0, "a chunk is whole unrolled steps");
  alignas(16) __shared__ float xs[kRows][kChunk];  // [kRows, kChunk] x rows m0.., columns k0.., zero-padded
  const int64_t M = p.dims.rows, N = p.dims.out_features, K = p.dims.in_features;
  const int64_t m_tiles = (M + kRows - 1) / kRows, m0 = blockIdx.x % m_tiles * kRows;
  const int lane = threadIdx.x % 32, quad_lane = lane % kQuad;
  const int64_t n = blockIdx.x / m_tiles * kGemvBlockRows + threadIdx.x / 32 * kWarpRows + lane / kQuad;
  const int64_t k_begin = blockIdx.y * slice, k_end = std::min(K, k_begin + slice);
  const int8_t* wrow[kLaneRows];  // this lane's weight rows n + 8 r, null past N
#pragma unroll
  for (int r = 0; r < kLaneRows; ++r) wrow[r] = n + 8 * r < N ? p.weight + (n + 8 * r) * K : nullptr;
  float acc[kLaneRows][kRows] = {};  // partial dot products over this lane's columns
  for (int64_t k0 = k_begin; k0 < k_end; k0 += kChunk) {
    const int cols = static_cast<int>(std::min<int64_t>(kChunk, k_end - k0));
    const int padded = (cols + kStepCols - 1) / kStepCols * kStepCols;
    __syncthreads();  // every warp is done with the previous chunk
#pragma unroll
    for (int r = 0; r < kRows; ++r)
      for (int c = threadIdx.x; c < padded; c += kGemvThreads)
        xs[r][c] = m0 + r < M && c < cols ? to_float(p.x[(m0 + r) * K + k0 + c]) : 0.f;
    __syncthreads();
    for (int c = quad_lane * 16; c < cols; c += kStepCols * kUnroll) {
      uint4 w[kUnroll][kLaneRows];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int r = 0; r < kLaneRows; ++r) w[u][r] = load_weight16<kAligned>(wrow[r], k0 + c + u * kStepCols, k_end);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int cu = c + u * kStepCols;
        if (cu >= cols) break;
#pragma unroll
        for (int j = 0; j < 4; ++j) {  // columns cu + 4 j .. cu + 4 j + 3
          float q[kLaneRows][4];
#pragma unroll
          for (int r = 0; r < kLaneRows; ++r) dequant4(word_at(w[u][r], j), q[r]);
#pragma unroll
          for (int m = 0; m < kRows; ++m) {
            const float4 xv = *reinterpret_cast<const float4*>(&xs[m][cu + 4 * j]);
#pragma unroll
            for (int r = 0; r < kLaneRows; ++r)
              acc[r][m] = fmaf(q[r][3], xv.w, fmaf(q[r][2], xv.z, fmaf(q[r][1], xv.y, fmaf(q[r][0], xv.x, acc[r][m]))));
          }
        }
      }
    }
  }
  // The quad's lanes hold parts of the same dot products: sum them, then lane m % kQuad writes row m.
#pragma unroll
  for (int r = 0; r < kLaneRows; ++r)
#pragma unroll
    for (int m = 0; m < kRows; ++m)
#pragma unroll
      for (int offset = 1; offset < kQuad; offset *= 2) acc[r][m] += shfl_xor(acc[r][m], offset, 0xffffffffu);
#pragma unroll
  for (int r = 0; r < kLaneRows; ++r) {
    const int64_t row = n + 8 * r;
#pragma unroll
    for (int m = 0; m < kRows; ++m) {
      if (m % kQuad != quad_lane || row >= N || m0 + m >= M) continue;
      if (gridDim.y == 1) {
        p.out[(m0 + m) * N + row] = finish(p, acc[r][m], row);
      } else {
        p.parts[(blockIdx.y * M + m0 + m) * N + row] = acc[r][m];
      }
    }
  }
}

// out = finish(sum over the split slices of parts), element by element.
template <typename T>
__global__ void __launch_bounds__(256) int8_linear_sum_kernel(Int8LinearArgs<T> p, int64_t split) {
  const int64_t size = p.dims.rows * p.dims.out_features;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < size; i += int64_t(gridDim.x) * blockDim.x) {
    float dot = 0.f;
    for (int64_t s = 0; s < split; ++s) dot += p.parts[s * size + i];
    p.out[i] = finish(p, dot, i % p.dims.out_features);
  }
}

// ---- many rows: tiled GEMM ----

constexpr int kTileM = 64, kTileN = 128, kTileK = 32;
constexpr int kGemmThreads = 256;  // 16 x 16 threads, 4 x 8 outputs each

// Block blockIdx.x = m tile * n_tiles + n tile. Thread (tx, ty) = (t % 16, t / 16) owns outputs rows m0 + 4 ty + i
// (i < 4), columns n0 + 4 tx + j and n0 + 64 + 4 tx + j (j < 4): its shared-memory reads are float4 broadcasts.
template <typename T, bool kAligned>
__global__ void __launch_bounds__(kGemmThreads) int8_gemm_kernel(Int8LinearArgs<T> p) {
  alignas(16) __shared__ float xs[kTileK][kTileM];  // [k, m] x tile, transposed
  alignas(16) __shared__ float ws[kTileK][kTileN];  // [k, n] weight tile as exact (unscaled) floats
  const int64_t M = p.dims.rows, N = p.dims.out_features, K = p.dims.in_features;
  const int64_t n_tiles = (N + kTileN - 1) / kTileN;
  const int64_t m0 = blockIdx.x / n_tiles * kTileM, n0 = blockIdx.x % n_tiles * kTileN;
  const int t = threadIdx.x, tx = t % 16, ty = t / 16;
  // Staging: x row m0 + xm, columns k0 + xk .. + 8; weight row n0 + wn, columns k0 + wk .. + 16.
  const int xm = t / 4, xk = t % 4 * 8, wn = t / 2, wk = t % 2 * 16;
  const T* xrow = m0 + xm < M ? p.x + (m0 + xm) * K : nullptr;
  const int8_t* wrow = n0 + wn < N ? p.weight + (n0 + wn) * K : nullptr;
  float xr[8];  // the next tile's staging values, in registers while the current tile is computed
  uint4 wr;
  auto load = [&](int64_t k0) {
#pragma unroll
    for (int e = 0; e < 8; ++e) xr[e] = xrow && k0 + xk + e < K ? to_float(xrow[k0 + xk + e]) : 0.f;
    wr = load_weight16<kAligned>(wrow, k0 + wk, K);
  };
  float acc[4][8] = {};
  load(0);
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    __syncthreads();  // the previous tile has been read
#pragma unroll
    for (int e = 0; e < 8; ++e) xs[xk + e][xm] = xr[e];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float q[4];
      dequant4(word_at(wr, i), q);
#pragma unroll
      for (int e = 0; e < 4; ++e) ws[wk + 4 * i + e][wn] = q[e];
    }
    __syncthreads();
    if (k0 + kTileK < K) load(k0 + kTileK);
#pragma unroll 8
    for (int k = 0; k < kTileK; ++k) {
      const float4 a = *reinterpret_cast<const float4*>(&xs[k][4 * ty]);
      const float4 b0 = *reinterpret_cast<const float4*>(&ws[k][4 * tx]);
      const float4 b1 = *reinterpret_cast<const float4*>(&ws[k][64 + 4 * tx]);
      const float av[4] = {a.x, a.y, a.z, a.w}, bv[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t m = m0 + 4 * ty + i;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t n = n0 + j / 4 * 64 + 4 * tx + j % 4;
      if (m < M && n < N) p.out[m * N + n] = finish(p, acc[i][j], n);
    }
  }
}

// ---- launch (int8_linear_launch.h) ----

template <typename T, int kRows, bool kAligned>
void launch_int8_gemv(Int8LinearArgs<T> p, cudaStream_t stream, FloatAlloc alloc_parts) {
  const int64_t M = p.dims.rows, N = p.dims.out_features, K = p.dims.in_features;
  auto* kernel = int8_gemv_kernel<T, kRows, kAligned>;
  const int64_t blocks = (M + kRows - 1) / kRows * ((N + kGemvBlockRows - 1) / kGemvBlockRows);
  TORCH_CHECK(blocks < (int64_t(1) << 31), "int8_linear: too many output rows for one launch");
  // Split K until the grid fills the device once (resident blocks), in slices of whole steps.
  int per_sm = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kGemvThreads, 0));
  const int64_t resident = int64_t(std::max(per_sm, 1)) * multiprocessor_count();
  int64_t split = std::clamp<int64_t>((resident + blocks - 1) / blocks, 1, std::max<int64_t>(1, K / kMinSliceCols));
  const int64_t slice = ((K + split - 1) / split + kStepCols - 1) / kStepCols * kStepCols;
  split = slice ? (K + slice - 1) / slice : 1;
  if (split > 1) p.parts = alloc_parts(split * M * N);
  kernel<<<dim3(unsigned(blocks), unsigned(split)), kGemvThreads, 0, stream>>>(p, slice);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  if (split > 1) {
    const unsigned grid = unsigned(std::min<int64_t>((M * N + 255) / 256, resident * 8));
    int8_linear_sum_kernel<T><<<grid, 256, 0, stream>>>(p, split);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

template <typename T>
void launch_int8_linear(const Int8LinearArgs<T>& p, cudaStream_t stream, FloatAlloc alloc_parts) {
  const int64_t M = p.dims.rows, N = p.dims.out_features;
  auto with_alignment = [&](auto f) {
    if (aligned16(p.weight) && p.dims.in_features % 16 == 0) {
      f(std::true_type{});
    } else {
      f(std::false_type{});
    }
  };
  if (M > kGemvMaxRows) {
    const int64_t blocks = (M + kTileM - 1) / kTileM * ((N + kTileN - 1) / kTileN);
    TORCH_CHECK(blocks < (int64_t(1) << 31), "int8_linear: too many rows for one launch");
    with_alignment([&](auto aligned) {
      auto* kernel = int8_gemm_kernel<T, decltype(aligned)::value>;
      kernel<<<unsigned(blocks), kGemmThreads, 0, stream>>>(p);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    return;
  }
  with_alignment([&](auto aligned) {
    constexpr bool kAligned = decltype(aligned)::value;
    switch (std::min<int>(next_pow2(M), kGemvMaxTileRows)) {
      case 1: return launch_int8_gemv<T, 1, kAligned>(p, stream, alloc_parts);
      case 2: return launch_int8_gemv<T, 2, kAligned>(p, stream, alloc_parts);
      case 4: return launch_int8_gemv<T, 4, kAligned>(p, stream, alloc_parts);
      case 8: return launch_int8_gemv<T, 8, kAligned>(p, stream, alloc_parts);
      default: return launch_int8_gemv<T, kGemvMaxTileRows, kAligned>(p, stream, alloc_parts);
    }
  });
}

}  // namespace pytransformer::cuda
