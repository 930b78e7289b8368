// CPU kernel of linear, compiled once per ISA level (see isa.h; the glue is linear.cpp): out [M, N] = x [M, K] @
// weight [N, K]^T + bias. x, weight, bias and out are float32, bfloat16 or float16; narrow weights are widened to
// float32 as they are loaded (a bfloat16 weight is half the bytes to read, so half the time) and accumulated in
// float32, and out is rounded to the dtype once. Few rows (decoding) stream the weight over all threads (gemv.h), in
// calls of up to kRowBlock rows; from kGemmRows rows (prefill) AVX2 and AVX-512 take a GEMM of outer products (gemm:
// every dtype with AVX2, float32 with AVX-512).
#include "isa.h"

#include <algorithm>
#include <memory>
#include <new>
#include <type_traits>

#include "../linear.h"
#include "gemv.h"

namespace pytransformer::cpu {

extern KernelTable<LinearCpuFn> linear_kernel;

inline namespace CPU_CAPABILITY {
namespace {
// The most rows of x a call of the weight-streaming kernel takes: more go by in calls of this many rows.
constexpr int64_t kRowBlock = 32;

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// gemm: out [M, N] = x [M, K] @ w [N, K]^T + bias for many rows of x (prefill), every array of one type T: float32, or
// bfloat16 or float16 widened to float32 as it is packed. Tiles of kGemmMR rows of x by kGemmNR (two vectors) weight
// rows, each the sum over K of outer products: the two weight vectors at one k times each of kGemmMR broadcast x
// values, into 2 * kGemmMR accumulators (AVX-512: 12 x 32, 24 of its 32 registers; AVX2: 6 x 16, 12 of its 16), two
// fmas a load of a weight vector where a dot product block takes one. x is packed first, [M / kGemmMR][K][kGemmMR]
// (zero rows past M), so that a tile reads its x values from one sequential stream; the weight rows are split over the
// threads in panels of kGemmNR, each packed [kc][kGemmNR] (zeros past N) for a block of up to kGemmKC of K at a time,
// which stays in L2 with the tile's x while every tile of rows goes by (smaller blocks measured slower). A panel's sums
// go to a float32 buffer [tiles * kGemmMR][kGemmNR], the blocks of K adding to it, and from there to out with the bias,
// rounded to T once. Each sum runs over k in order, as a naive dot product.
using Vec = at::vec::Vectorized<float>;
constexpr int kLanes = Vec::size(), kGemmNR = 2 * kLanes;
#if defined(CPU_CAPABILITY_AVX512)
using VecF = __m512;
constexpr int kGemmMR = 12;
#else
using VecF = __m256;
constexpr int kGemmMR = 6;
#endif
constexpr int64_t kGemmKC = 2048;
// The fewest rows that take the GEMM: with fewer, gemv_rows measured as fast with the weights read from memory, as in
// decoding. With AVX2 (an EPYC Zen 3) every type from 24 rows; with AVX-512 float32 from 48 rows
// (cpu_kernel_notes_2026-12-02_zen3_gemm.md).
constexpr int64_t kGemmRows = kLanes == 8 ? 24 : 48;
// Which types take the GEMM: float32 at both levels, the 16-bit types with AVX2 only (not measured with AVX-512, where
// the glue gives bfloat16 with AVX-512 BF16 dot products to ATen from 29 rows).
template <typename T>
constexpr bool kGemmTakes = std::is_same_v<T, float> || kLanes == 8;

struct AlignedFloats {
  std::unique_ptr<float[], void (*)(float*)> p;
  explicit AlignedFloats(int64_t n)
      : p(static_cast<float*>(::operator new[](std::max<int64_t>(1, n) * sizeof(float), std::align_val_t(64))),
          [](float* q) { ::operator delete[](q, std::align_val_t(64)); }) {}
};

// c [kGemmMR][kGemmNR] = (first ? 0 : c) + the sum over kc of ap's outer products with bp's: ap [kc][kGemmMR] and bp
// [kc][kGemmNR] packed.
__attribute__((noinline)) void gemm_tile(int64_t kc, const float* ap, const float* bp, float* c, bool first) {
  Vec acc[kGemmMR][2];
#pragma GCC unroll 12
  for (int i = 0; i < kGemmMR; ++i) {
    acc[i][0] = first ? Vec(0.f) : Vec::loadu(c + i * kGemmNR);
    acc[i][1] = first ? Vec(0.f) : Vec::loadu(c + i * kGemmNR + kLanes);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const Vec w0 = Vec::loadu(bp + k * kGemmNR), w1 = Vec::loadu(bp + k * kGemmNR + kLanes);
#pragma GCC unroll 12
    for (int i = 0; i < kGemmMR; ++i) {
      const Vec a(ap[k * kGemmMR + i]);
      acc[i][0] = at::vec::fmadd(a, w0, acc[i][0]);
      acc[i][1] = at::vec::fmadd(a, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < kGemmMR; ++i) {
    acc[i][0].store(c + i * kGemmNR);
    acc[i][1].store(c + i * kGemmNR + kLanes);
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
  for (int i = 0; i < kLanes / 4; ++i) {  // t0, t1: rows 4i and 4i + 1 interleaved, elements 0-1 and 2-3; t2, t3 on
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

// dst[k * ld + r] = src[r * src_ld + k] widened to float32, for the rows r < width (<= kLanes) and k < kc, zeros for
// the rows from `rows` on: rows of src packed as columns, kLanes x kLanes at a time.
template <typename T>
void pack_columns(const T* src, int64_t src_ld, int64_t rows, int64_t kc, float* dst, int64_t ld, int width) {
  const int64_t real = std::min<int64_t>(rows, width);
  for (int64_t k = 0; k < kc; k += kLanes) {
    const int n = static_cast<int>(std::min<int64_t>(kLanes, kc - k));
    VecF v[kLanes] = {};  // (set below; GCC cannot see that every element is)
#pragma GCC unroll 16
    for (int r = 0; r < kLanes; ++r) v[r] = r < real ? load_widened<float>(src + r * src_ld + k, n) : Vec(0.f);
    transpose_square(v);
    for (int c = 0; c < n; ++c) Vec(v[c]).store(dst + (k + c) * ld, width);
  }
}

template <typename T>
void gemm(int64_t M, int64_t N, int64_t K, const T* x, const T* w, const T* bias, T* out) {
  const int64_t tiles_m = (M + kGemmMR - 1) / kGemmMR, panels = (N + kGemmNR - 1) / kGemmNR;
  AlignedFloats ap(tiles_m * K * kGemmMR);
  at::parallel_for(0, tiles_m, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      pack_columns(x + t * kGemmMR * K, K, M - t * kGemmMR, K, ap.p.get() + t * K * kGemmMR, kGemmMR, kGemmMR);
  });
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    AlignedFloats bp(std::min(K, kGemmKC) * kGemmNR), cp(tiles_m * kGemmMR * kGemmNR);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kGemmNR;
      const int cols = static_cast<int>(std::min<int64_t>(kGemmNR, N - n0));
      for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += kGemmKC) {
        const int64_t kc = std::min(kGemmKC, K - k0);
        for (int h = 0; h < kGemmNR; h += kLanes)
          pack_columns(w + (n0 + h) * K + k0, K, cols - h, kc, bp.p.get() + h, kGemmNR, kLanes);
        for (int64_t t = 0; t < tiles_m; ++t)
          gemm_tile(kc, ap.p.get() + (t * K + k0) * kGemmMR, bp.p.get(), cp.p.get() + t * kGemmMR * kGemmNR, k0 == 0);
      }
      alignas(64) float b[kGemmNR] = {};
      if (bias) at::vec::convert(bias + n0, b, cols);
      for (int64_t m = 0; m < M; ++m) {
        float* row = cp.p.get() + m * kGemmNR;
        for (int h = 0; h < kGemmNR; h += kLanes) (Vec::loadu(row + h) + Vec::loadu(b + h)).store(row + h);
        at::vec::convert(row, out + m * N + n0, cols);
      }
    }
  });
}
#endif
}  // namespace

void linear(const LinearParams& p, at::ScalarType dtype, const void* x, const void* weight, const void* bias,
            void* out) {
  const auto run = [&](auto io) {
    using T = decltype(io);
    const auto* xp = static_cast<const T*>(x);
    auto* op = static_cast<T*>(out);
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    if constexpr (kGemmTakes<T>)
      if (p.rows >= kGemmRows)
        return gemm(p.rows, p.out_features, p.in_features, xp, static_cast<const T*>(weight),
                    static_cast<const T*>(bias), op);
#endif
    for_row_blocks(p.rows, kRowBlock, [&](int64_t m0, int64_t mb) {  // rows [m0, m0 + mb) of x and out
      gemv_rows<float>(mb, p.out_features, p.in_features, xp + m0 * p.in_features, static_cast<const T*>(weight),
                       nullptr, static_cast<const T*>(bias), op + m0 * p.out_features, /*x_quant_bits=*/0);
    });
  };
  switch (dtype) {  // the glue passes float32, bfloat16 or float16 only
    case at::kBFloat16: return run(c10::BFloat16());
    case at::kHalf: return run(c10::Half());
    default: return run(float());
  }
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(linear_kernel, &CPU_CAPABILITY::linear);

}  // namespace pytransformer::cpu
