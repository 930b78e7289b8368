#pragma once
// gemm: the many-rows (prefill) product of the linear layers, out [M, N] = (x [M, K] @ w [N, K]^T) * scale [N] + bias
// [N], shared by linear (x, w, bias and out all float32, bfloat16 or float16; no scale) and, with AVX2, int8_linear
// (float32 x, bias and out, an int8 w with float32 scales). Compiled into each including kernel file's ISA level
// (namespace CPU_CAPABILITY, see isa.h), with AVX2 or AVX-512 only.
//
// Tiles of kGemmMR rows of x by kGemmNR (two vectors) weight rows, each the sum over K of outer products: the two
// weight vectors at one k times each of kGemmMR broadcast x values, into 2 * kGemmMR accumulators (AVX-512: 12 x 32, 24
// of its 32 registers; AVX2: 6 x 16, 12 of its 16), two fmas a load of a weight vector where a dot product block takes
// one. Where M is not a multiple of kGemmMR, up to kGemmMR - 1 tiles of kGemmSmallMR rows (two thirds: still 16 or 8
// independent accumulators, enough to hide the fma latency) make up the rows, so that no fmas go to padding rows where
// the two sizes sum to M (128 rows: 20 x 6 + 2 x 4 with AVX2, 10 x 12 + 1 x 8 with AVX-512). x is packed first, each
// tile's rows [K][rows] (zero rows past M), so that a tile reads its x values from one sequential stream; the weight
// rows are split over the threads in panels of kGemmNR, each packed [kc][kGemmNR] (zeros past N) for a block of up to
// kGemmKC of K at a time, which stays in L2 with the tile's x while every tile of rows goes by (smaller blocks measured
// slower). Narrow types (bfloat16, float16, int8) are widened to float32 as they are packed. A panel's sums go to a
// float32 buffer [the tiles' rows][kGemmNR], the blocks of K adding to it, and from there to out as sum * scale + bias
// (one fused multiply-add; scale 1 without one), rounded to T once. Each sum runs over k in order, as a naive dot
// product, whichever tile holds it.
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/vec.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <new>

#include "dot_rows.h"

namespace pytransformer::cpu {
inline namespace CPU_CAPABILITY {
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
using Vec = at::vec::Vectorized<float>;
constexpr int kGemmLanes = Vec::size(), kGemmNR = 2 * kGemmLanes;
#if defined(CPU_CAPABILITY_AVX512)
using VecF = __m512;
constexpr int kGemmMR = 12;
#else
using VecF = __m256;
constexpr int kGemmMR = 6;
#endif
constexpr int kGemmSmallMR = kGemmMR * 2 / 3;
constexpr int64_t kGemmKC = 2048;
struct AlignedFloats {
  std::unique_ptr<float[], void (*)(float*)> p;
  explicit AlignedFloats(int64_t n)
      : p(static_cast<float*>(::operator new[](std::max<int64_t>(1, n) * sizeof(float), std::align_val_t(64))),
          [](float* q) { ::operator delete[](q, std::align_val_t(64)); }) {}
};

// c [MR][kGemmNR] = (first ? 0 : c) + the sum over kc of ap's outer products with bp's: ap [kc][MR] and bp
// [kc][kGemmNR] packed.
template <int MR>
__attribute__((noinline)) void gemm_tile(int64_t kc, const float* ap, const float* bp, float* c, bool first) {
  Vec acc[MR][2];
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    acc[i][0] = first ? Vec(0.f) : Vec::loadu(c + i * kGemmNR);
    acc[i][1] = first ? Vec(0.f) : Vec::loadu(c + i * kGemmNR + kGemmLanes);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const Vec w0 = Vec::loadu(bp + k * kGemmNR), w1 = Vec::loadu(bp + k * kGemmNR + kGemmLanes);
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const Vec a(ap[k * MR + i]);
      acc[i][0] = at::vec::fmadd(a, w0, acc[i][0]);
      acc[i][1] = at::vec::fmadd(a, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    acc[i][0].store(c + i * kGemmNR);
    acc[i][1].store(c + i * kGemmNR + kGemmLanes);
  }
}

// The in-lane shuffles of a transpose, at each level's width.
#if defined(CPU_CAPABILITY_AVX512)
inline __m512 unpack_lo(__m512 a, __m512 b) { return _mm512_unpacklo_ps(a, b); }
inline __m512 unpack_hi(__m512 a, __m512 b) { return _mm512_unpackhi_ps(a, b); }
inline __m512 pairs_lo(__m512 a, __m512 b) { return _mm512_shuffle_ps(a, b, 0x44); }
inline __m512 pairs_hi(__m512 a, __m512 b) { return _mm512_shuffle_ps(a, b, 0xEE); }
#else
inline __m256 unpack_lo(__m256 a, __m256 b) { return _mm256_unpacklo_ps(a, b); }
inline __m256 unpack_hi(__m256 a, __m256 b) { return _mm256_unpackhi_ps(a, b); }
inline __m256 pairs_lo(__m256 a, __m256 b) { return _mm256_shuffle_ps(a, b, 0x44); }
inline __m256 pairs_hi(__m256 a, __m256 b) { return _mm256_shuffle_ps(a, b, 0xEE); }
#endif

// u[4i + j] = element j of each 128-bit lane of the rows 4i to 4i + 3 of v (a 4 x 4 transpose within each lane).
__attribute__((always_inline)) inline void transpose_lanes(const VecF* v, VecF* u) {
#pragma GCC unroll 4
  for (int i = 0; i < kGemmLanes / 4; ++i) {  // t0, t1: rows 4i and 4i + 1 interleaved, elements 0-1 and 2-3; t2, t3 on
    const VecF t0 = unpack_lo(v[4 * i], v[4 * i + 1]), t1 = unpack_hi(v[4 * i], v[4 * i + 1]);
    const VecF t2 = unpack_lo(v[4 * i + 2], v[4 * i + 3]), t3 = unpack_hi(v[4 * i + 2], v[4 * i + 3]);
    u[4 * i] = pairs_lo(t0, t2), u[4 * i + 1] = pairs_hi(t0, t2);
    u[4 * i + 2] = pairs_lo(t1, t3), u[4 * i + 3] = pairs_hi(t1, t3);
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// v[c] = column c of the 16 x 16 floats whose row r is v[r] (4 x 4 within lanes, then 128-bit lane shuffles).
__attribute__((always_inline)) inline void transpose_square(VecF* v) {
  __m512 t[16], u[16];
  transpose_lanes(v, u);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {  // t: lanes 0 and 2 of rows 0-3 and 4-7 (t[j]), 1 and 3 (t[j + 4]); rows 8-15 likewise
    t[j] = _mm512_shuffle_f32x4(u[j], u[j + 4], 0x88);
    t[j + 4] = _mm512_shuffle_f32x4(u[j], u[j + 4], 0xDD);
    t[j + 8] = _mm512_shuffle_f32x4(u[j + 8], u[j + 12], 0x88);
    t[j + 12] = _mm512_shuffle_f32x4(u[j + 8], u[j + 12], 0xDD);
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    v[j] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0x88);
    v[j + 8] = _mm512_shuffle_f32x4(t[j], t[j + 8], 0xDD);
  }
}
#else
// v[c] = column c of the 8 x 8 floats whose row r is v[r] (4 x 4 within halves, then the halves exchanged).
__attribute__((always_inline)) inline void transpose_square(VecF* v) {
  __m256 u[8];
  transpose_lanes(v, u);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {  // columns j and j + 4: the low and the high halves of rows 0-3 and 4-7
    v[j] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x20);
    v[j + 4] = _mm256_permute2f128_ps(u[j], u[j + 4], 0x31);
  }
}
#endif

// dst[k * ld + r] = src[r * src_ld + k] widened to float32, for the rows r < width (<= kGemmLanes) and k < kc, zeros
// for the rows from `rows` on: rows of src packed as columns, kGemmLanes x kGemmLanes at a time.
template <typename T>
void pack_columns(const T* src, int64_t src_ld, int64_t rows, int64_t kc, float* dst, int64_t ld, int width) {
  const int64_t real = std::min<int64_t>(rows, width);
  for (int64_t k = 0; k < kc; k += kGemmLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kGemmLanes, kc - k));
    VecF v[kGemmLanes] = {};  // (set below; GCC cannot see that every element is)
#pragma GCC unroll 16
    for (int r = 0; r < kGemmLanes; ++r) v[r] = r < real ? load_widened<float>(src + r * src_ld + k, n) : Vec(0.f);
    transpose_square(v);
    for (int c = 0; c < n; ++c) Vec(v[c]).store(dst + (k + c) * ld, width);
  }
}

// The row tiles of x: `big` tiles of kGemmMR rows, then `small` of kGemmSmallMR, the fewest rows in all that cover M
// (the fewest small tiles among equals).
struct GemmTiles {
  int64_t big, small;
  int64_t count() const { return big + small; }
  int64_t rows() const { return big * kGemmMR + small * kGemmSmallMR; }
  int64_t first_row(int64_t t) const { return t < big ? t * kGemmMR : big * kGemmMR + (t - big) * kGemmSmallMR; }
  int rows_of(int64_t t) const { return t < big ? kGemmMR : kGemmSmallMR; }
};

inline GemmTiles gemm_tiles(int64_t M) {
  GemmTiles best{(M + kGemmMR - 1) / kGemmMR, 0};
  for (int64_t small = 1; small < kGemmMR && (small - 1) * kGemmSmallMR < M; ++small) {
    const GemmTiles t{(std::max<int64_t>(0, M - small * kGemmSmallMR) + kGemmMR - 1) / kGemmMR, small};
    if (t.rows() < best.rows()) best = t;
  }
  return best;
}

template <typename T, typename W>
void gemm(int64_t M, int64_t N, int64_t K, const T* x, const W* w, const float* scale, const T* bias, T* out) {
  const GemmTiles tiles = gemm_tiles(M);
  const int64_t n_tiles = tiles.count(), panels = (N + kGemmNR - 1) / kGemmNR;
  AlignedFloats ap(tiles.rows() * K);
  at::parallel_for(0, n_tiles, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t r0 = tiles.first_row(t);
      pack_columns(x + r0 * K, K, M - r0, K, ap.p.get() + r0 * K, tiles.rows_of(t), tiles.rows_of(t));
    }
  });
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    AlignedFloats bp(std::min(K, kGemmKC) * kGemmNR), cp(tiles.rows() * kGemmNR);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kGemmNR;
      const int cols = static_cast<int>(std::min<int64_t>(kGemmNR, N - n0));
      for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += kGemmKC) {
        const int64_t kc = std::min(kGemmKC, K - k0);
        for (int h = 0; h < kGemmNR; h += kGemmLanes)
          pack_columns(w + (n0 + h) * K + k0, K, cols - h, kc, bp.p.get() + h, kGemmNR, kGemmLanes);
        for (int64_t t = 0; t < n_tiles; ++t) {
          const int64_t r0 = tiles.first_row(t);
          const float* a = ap.p.get() + r0 * K + k0 * tiles.rows_of(t);
          float* c = cp.p.get() + r0 * kGemmNR;
          if (t < tiles.big)
            gemm_tile<kGemmMR>(kc, a, bp.p.get(), c, k0 == 0);
          else
            gemm_tile<kGemmSmallMR>(kc, a, bp.p.get(), c, k0 == 0);
        }
      }
      alignas(64) float b[kGemmNR] = {}, s[kGemmNR];
      std::fill_n(s, kGemmNR, 1.f);
      if (bias) convert_n(bias + n0, b, cols);
      if (scale) std::copy_n(scale + n0, cols, s);
      for (int64_t m = 0; m < M; ++m) {
        float* row = cp.p.get() + m * kGemmNR;
        for (int h = 0; h < kGemmNR; h += kGemmLanes)
          at::vec::fmadd(Vec::loadu(row + h), Vec::loadu(s + h), Vec::loadu(b + h)).store(row + h);
        convert_n(row, out + m * N + n0, cols);
      }
    }
  });
}
#endif
}  // namespace CPU_CAPABILITY
}  // namespace pytransformer::cpu
