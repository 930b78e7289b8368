// CPU kernel of linear, compiled once per ISA level (see isa.h; the glue is linear.cpp): out [M, N] = x [M, K] @
// weight [N, K]^T + bias. x, weight, bias and out are float32, bfloat16 or float16; narrow weights are widened to
// float32 as they are loaded (a bfloat16 weight is half the bytes to read, so half the time) and accumulated in
// float32, and out is rounded to the dtype once. Few rows (decoding) stream the weight over all threads (gemv.h), in
// calls of up to kRowBlock rows; with AVX-512, float32 from kGemmRows rows (prefill) is a GEMM of outer products
// (gemm_f32).
#include "isa.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "../linear.h"
#include "gemv.h"
#include "vec_util.h"

namespace pytransformer::cpu {

extern KernelTable<LinearCpuFn> linear_kernel;

inline namespace CPU_CAPABILITY {
namespace {
// The most rows of x a call of the weight-streaming kernel takes: more go by in calls of this many rows.
constexpr int64_t kRowBlock = 32;

#if defined(CPU_CAPABILITY_AVX512)
// gemm_f32: out [M, N] = x [M, K] @ w [N, K]^T + bias in tiles of kGemmMR rows of x by kGemmNR weight rows, each the
// sum over K of outer products: a vector pair of kGemmNR weights at one k times each of kGemmMR broadcast x values,
// into 2 * kGemmMR = 24 accumulators (of AVX-512's 32 registers), two fmas a load of a weight vector where a dot
// product block takes one. x is packed first, [M / kGemmMR][K][kGemmMR] (zero rows past M), so a tile reads its x
// values from one sequential stream; the weight rows are split over the threads in panels of kGemmNR, each packed
// [kc][kGemmNR] (zeros past N) for a block of up to kGemmKC of K at a time, which stays in L2 with the tile's x while
// every tile of rows goes by (smaller blocks measured slower: each adds to the tiles of out, rows N apart). Each sum
// runs over k in order (as a naive dot product), the blocks of K adding to out.
constexpr int kGemmMR = 12, kGemmNR = 32;
constexpr int64_t kGemmKC = 2048;
constexpr int64_t kGemmRows = 48;  // the fewest rows that take gemm_f32: with fewer, gemv_rows measured as fast

struct AlignedFloats {
  std::unique_ptr<float[], void (*)(float*)> p;
  explicit AlignedFloats(int64_t n)
      : p(static_cast<float*>(::operator new[](n * sizeof(float), std::align_val_t(64))),
          [](float* q) { ::operator delete[](q, std::align_val_t(64)); }) {}
};

// c [kGemmMR, cols <= kGemmNR] (row stride ldc) = (first ? bias, else c) + the sum over kc of ap's outer products with
// bp's: ap [kc][kGemmMR] and bp [kc][kGemmNR] packed.
__attribute__((noinline)) void gemm_tile(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc,
                                         int cols, bool first, const float* bias) {
  const __mmask16 m0 = first_lanes(cols), m1 = first_lanes(cols - 16);
  __m512 acc[kGemmMR][2];
  const __m512 b0 = first && bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
  const __m512 b1 = first && bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
#pragma GCC unroll 12
  for (int i = 0; i < kGemmMR; ++i) {
    acc[i][0] = first ? b0 : _mm512_maskz_loadu_ps(m0, c + i * ldc);
    acc[i][1] = first ? b1 : _mm512_maskz_loadu_ps(m1, c + i * ldc + 16);
  }
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 w0 = _mm512_load_ps(bp + k * kGemmNR), w1 = _mm512_load_ps(bp + k * kGemmNR + 16);
#pragma GCC unroll 12
    for (int i = 0; i < kGemmMR; ++i) {
      const __m512 a = _mm512_set1_ps(ap[k * kGemmMR + i]);
      acc[i][0] = _mm512_fmadd_ps(a, w0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(a, w1, acc[i][1]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < kGemmMR; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, acc[i][0]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, acc[i][1]);
  }
}

// v[c] = column c of the 16 x 16 floats whose row r is v[r] (unpacks, then 128-bit lane shuffles).
__attribute__((always_inline)) inline void transpose_16x16(__m512* v) {
  __m512 t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {  // t[2i], t[2i + 1]: rows 2i and 2i + 1 interleaved, elements 0-1 and 2-3 of a lane
    t[2 * i] = _mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {  // u[4i + j]: element j of each lane from rows 4i to 4i + 3
    u[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
    u[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
    u[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
    u[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
  }
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

// dst[k * ld + r] = src[r * src_ld + k] for the rows r < width (<= 16) and k < kc, zeros for the rows from `rows` on:
// rows of src packed as columns, 16 x 16 at a time.
void pack_columns(const float* src, int64_t src_ld, int64_t rows, int64_t kc, float* dst, int64_t ld, int width) {
  const __mmask16 store = first_lanes(width);
  for (int64_t k = 0; k < kc; k += 16) {
    const int n = static_cast<int>(std::min<int64_t>(16, kc - k));
    const __mmask16 load = first_lanes(n);
    __m512 v[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r)
      v[r] = r < rows ? _mm512_maskz_loadu_ps(load, src + r * src_ld + k) : _mm512_setzero_ps();
    transpose_16x16(v);
    for (int c = 0; c < n; ++c) _mm512_mask_storeu_ps(dst + (k + c) * ld, store, v[c]);
  }
}

void gemm_f32(int64_t M, int64_t N, int64_t K, const float* x, const float* w, const float* bias, float* out) {
  const int64_t tiles_m = (M + kGemmMR - 1) / kGemmMR, panels = (N + kGemmNR - 1) / kGemmNR;
  AlignedFloats ap(std::max<int64_t>(1, tiles_m * K * kGemmMR));
  at::parallel_for(0, tiles_m, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      pack_columns(x + t * kGemmMR * K, K, M - t * kGemmMR, K, ap.p.get() + t * K * kGemmMR, kGemmMR, kGemmMR);
  });
  at::parallel_for(0, panels, 1, [&](int64_t p0, int64_t p1) {
    AlignedFloats bp(std::min(K, kGemmKC) * kGemmNR);
    float tail[kGemmMR * kGemmNR];  // the tile of the last rows, where fewer than kGemmMR remain
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n0 = p * kGemmNR;
      const int cols = static_cast<int>(std::min<int64_t>(kGemmNR, N - n0));
      for (int64_t k0 = 0; k0 == 0 || k0 < K; k0 += kGemmKC) {
        const int64_t kc = std::min(kGemmKC, K - k0);
        for (int h = 0; h < kGemmNR; h += 16)
          pack_columns(w + (n0 + h) * K + k0, K, cols - h, kc, bp.p.get() + h, kGemmNR, 16);
        const float* b = bias ? bias + n0 : nullptr;
        for (int64_t t = 0; t < tiles_m; ++t) {
          const int64_t m0 = t * kGemmMR, rows = std::min<int64_t>(kGemmMR, M - m0);
          const float* a = ap.p.get() + (t * K + k0) * kGemmMR;
          if (rows == kGemmMR) {
            gemm_tile(kc, a, bp.p.get(), out + m0 * N + n0, N, cols, k0 == 0, b);
            continue;
          }
          if (k0 > 0)
            for (int64_t i = 0; i < rows; ++i) std::memcpy(tail + i * kGemmNR, out + (m0 + i) * N + n0, cols * 4);
          gemm_tile(kc, a, bp.p.get(), tail, kGemmNR, cols, k0 == 0, b);
          for (int64_t i = 0; i < rows; ++i) std::memcpy(out + (m0 + i) * N + n0, tail + i * kGemmNR, cols * 4);
        }
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
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (std::is_same_v<T, float>)
      if (p.rows >= kGemmRows)
        return gemm_f32(p.rows, p.out_features, p.in_features, xp, static_cast<const float*>(weight),
                        static_cast<const float*>(bias), op);
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
