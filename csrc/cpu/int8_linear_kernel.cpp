// CPU kernels of int8_linear, compiled once per ISA level (see isa.h; the glue is int8_linear.cpp): out [M, N] = (x [M, K] @ weight^T) * scale + bias
// with an int8 weight [N, K].
//
// Few rows (decoding, M <= kMaxGemvRows), and with integer dot products any number of rows (8 a call, see the glue):
// the weight-streaming kernel of the linear layers (gemv.h), so the product reads 1 byte per weight from memory instead
// of the float layer's 4. With integer dot products (AVX-512 VNNI, or AVX2 where it is the best level; float32,
// float16 or bfloat16 x), each row of x is quantized to 16 bits (to nearest, in steps of its largest magnitude /
// 32767; / 24385 at K 11008, fewer over K 8192, so that no int32 sum of the AVX-512 kernel overflows), or with x_bits 8
// to 8 bits (steps of the largest magnitude / 127), and its products with the weights are summed exactly in integers,
// then times the two scales: off from the exact product by at most half a step times sum_k |w[n, k]| * scale[n] (with
// 16 bits typically 1e-5 to 1e-4 of the outputs), the same whatever the number of rows, and the same from both ISA
// levels; a row with an inf or NaN gives NaN. Otherwise the int8 weight rows are widened to float32 as they are
// loaded, each dot product times its scale (x_bits 8: x rounded by the glue). Many rows (prefill) with AMX int8
// tiles: the same quantized x and exact integer sums, by tiles (int8_amx), so the same outputs. Many rows where AVX2
// is the best level: the GEMM of outer products (gemm.h) on the weights widened to float32 as they are packed
// (int8_gemm, AVX2 only: the glue takes it nowhere else). Many rows otherwise: the product is compute-bound, so blocks
// of weight rows are dequantized (times scale) into a buffer of 16 MiB and multiplied with ATen's GEMM (widened_mm.h).
// float16/bfloat16 x is computed in float32, float64 in float64.
#include "isa.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../int8_linear.h"
#include "gemm.h"
#include "gemv.h"

namespace pytransformer::cpu {

extern KernelTable<Int8GemvCpuFn> int8_gemv_kernel;
extern KernelTable<Int8DequantizeCpuFn> int8_dequantize_kernel;
extern KernelTable<Int8GemmCpuFn> int8_gemm_kernel;
extern KernelTable<Int8AmxCpuFn> int8_amx_kernel;

inline namespace CPU_CAPABILITY {

// dst[i] = src[i] * s for n elements (a plain loop that the compiler vectorises for the file's ISA level).
template <typename acc_t>
void widen(const int8_t* src, acc_t* dst, int64_t n, acc_t s) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<acc_t>(src[i]) * s;
}

template <typename acc_t>
void int8_dequantize_typed(int64_t N, int64_t K, const int8_t* wp, const void* scale, void* deq) {
  const acc_t* sp = static_cast<const acc_t*>(scale);
  acc_t* dp = static_cast<acc_t*>(deq);
  at::parallel_for(0, N, std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, K)), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) widen<acc_t>(wp + n * K, dp + n * K, K, sp[n]);
  });
}

void int8_gemv(const Int8LinearParams& p, at::ScalarType acc, const void* x, const int8_t* weight, const void* scale,
               const void* bias, void* out, int64_t x_quant_bits) {
  AT_DISPATCH_FLOATING_TYPES(acc, "int8_linear", [&] {
    gemv_rows<scalar_t>(p.rows, p.out_features, p.in_features, static_cast<const scalar_t*>(x), weight,
                        static_cast<const scalar_t*>(scale), static_cast<const scalar_t*>(bias),
                        static_cast<scalar_t*>(out), x_quant_bits);
  });
}

void int8_dequantize(at::ScalarType acc, int64_t n, int64_t in_features, const int8_t* weight, const void* scale,
                     void* deq) {
  AT_DISPATCH_FLOATING_TYPES(acc, "int8_linear",
                             [&] { int8_dequantize_typed<scalar_t>(n, in_features, weight, scale, deq); });
}

#if defined(CPU_CAPABILITY_AVX512)
#pragma GCC push_options
#pragma GCC target("amx-tile,amx-int8")
// The AMX product (int8_amx). Tile registers: 0-3 int32 sums [16 rows of x][16 outputs] (C), 4 and 5 16 rows of x
// over 64 of K (A: the high and the low bytes of 16-bit x), 6 and 7 the weights of 16 outputs over the same 64 of K
// (B: row i holds k = 4i..4i+3 of each output, the layout the dot products take). tdpbssd multiplies signed bytes,
// tdpbusd unsigned bytes of A by signed bytes of B, each adding 64 products to every int32 sum.
constexpr int64_t kAmxRows = 16, kAmxCols = 16, kAmxK = 64;  // the shape of a C tile, the K of one step
constexpr int64_t kAmxPanelBytes = int64_t(512) << 10;       // packed weight bytes of a panel, at most (in L2)

struct alignas(64) AmxTileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Packs the weights of outputs [n, n + 16) into B tiles, one per step of kAmxK along K ([kp / kAmxK][16][64] bytes at
// bp): the 4 bytes of k = 4i..4i+3 of output c at row i, column 4c, zeros past N and K. A step is a 16 x 16 transpose
// of 4-byte words (64 bytes of each output), done as floats by transpose_square, whose shuffles move bits unchanged.
void pack_amx_b(const int8_t* w, int64_t N, int64_t K, int64_t kp, int64_t n, int8_t* bp) {
  const int64_t valid = std::min<int64_t>(kAmxCols, N - n);
  for (int64_t k = 0; k < kp; k += kAmxK) {
    const __mmask64 bytes = K - k >= kAmxK ? ~__mmask64(0) : (__mmask64(1) << (K - k)) - 1;
    __m512 v[kAmxCols];
    for (int64_t c = 0; c < kAmxCols; ++c)
      v[c] = _mm512_castsi512_ps(c < valid ? _mm512_maskz_loadu_epi8(bytes, w + (n + c) * K + k)
                                           : _mm512_setzero_si512());
    transpose_square(v);
    for (int64_t i = 0; i < kAmxCols; ++i) _mm512_storeu_ps(bp + k * kAmxCols + i * kAmxK, v[i]);
  }
}

// out [M, N] = (x [M, K] @ weight^T) * scale + bias with x quantized per row to x_quant_bits (quantize_rows, as the
// VNNI row-by-row kernel does it) and the products summed exactly in integers by AMX tiles: 16-bit x as its high
// (signed) and low (unsigned) bytes, two sums of each output put together as 256 * high + low in int64; 8-bit x in
// one. The sums are those of the VNNI kernel, and so are the outputs: the same float32 operations in the same order.
// Needs K <= kAmxMaxK (int32 sums) and the process's permission to use the tiles (the glue asks for it).
// Rows of x go by 16, outputs by panels of up to kAmxPanelBytes of packed weights per thread, each packed once and
// used by every 16 rows of x; each step of K loads 2 A and 2 B tiles for 4 products (2 with 8-bit x).
void int8_amx(const Int8LinearParams& p, const float* x, const int8_t* weight, const float* scale, const float* bias,
              float* out, int64_t x_quant_bits) {
  const int64_t M = p.rows, N = p.out_features, K = p.in_features;
  const int64_t mp = (M + kAmxRows - 1) / kAmxRows * kAmxRows, kp = (K + kAmxK - 1) / kAmxK * kAmxK;
  const bool two_bytes = x_quant_bits == 16;
  // x quantized, then as A planes [mp][kp] (zeros past M and K): the high bytes (or 8-bit x) and the low bytes.
  std::vector<float> x_scale(M);
  std::vector<int8_t> hi(mp * kp, 0);
  std::vector<uint8_t> lo(two_bytes ? mp * kp : 0, 0);
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    std::vector<int16_t> q(two_bytes ? K : 0);  // a row quantized to 16 bits, split into hi and lo as it is written
    for (int64_t m = m0; m < m1; ++m) {
      int64_t offset;
      if (!two_bytes) {
        quantize_rows(1, K, x + m * K, hi.data() + m * kp, &x_scale[m], &offset);
        continue;
      }
      quantize_rows(1, K, x + m * K, q.data(), &x_scale[m], &offset);
      for (int64_t k = 0; k < K; k += 32) {
        const __mmask32 mask = K - k >= 32 ? ~__mmask32(0) : (__mmask32(1) << (K - k)) - 1;
        const __m512i v = _mm512_maskz_loadu_epi16(mask, q.data() + k);
        _mm256_mask_storeu_epi8(hi.data() + m * kp + k, mask, _mm512_cvtepi16_epi8(_mm512_srai_epi16(v, 8)));
        _mm256_mask_storeu_epi8(lo.data() + m * kp + k, mask, _mm512_cvtepi16_epi8(v));
      }
    }
  });
  const int64_t col_blocks = (N + 2 * kAmxCols - 1) / (2 * kAmxCols);
  const int64_t panel_blocks = std::max<int64_t>(1, kAmxPanelBytes / (2 * kAmxCols * kp));
  at::parallel_for(0, col_blocks, 1, [&](int64_t b0, int64_t b1) {
    AmxTileConfig config{};
    config.palette = 1;
    for (int t = 0; t < 8; ++t) {
      config.rows[t] = kAmxRows;
      config.colsb[t] = kAmxK;
    }
    _tile_loadconfig(&config);
    const int64_t steps = kp / kAmxK, b_bytes = kp * kAmxCols;  // steps of K; bytes of one output tile's weights
    // The panel's packed weights, in a buffer each thread keeps for its next calls (up to kAmxPanelBytes, or one
    // block's for K over 16384): a call takes no fresh pages for it.
    thread_local std::vector<int8_t> packed;
    packed.resize(std::max<size_t>(packed.size(), std::min(panel_blocks, b1 - b0) * 2 * b_bytes));
    alignas(64) int32_t sums[4][kAmxRows][kAmxCols];
    for (int64_t pb = b0; pb < b1; pb += panel_blocks) {
      const int64_t pe = std::min(b1, pb + panel_blocks);
      for (int64_t b = pb; b < pe; ++b)
        for (int j = 0; j < 2; ++j)
          pack_amx_b(weight, N, K, kp, (2 * b + j) * kAmxCols, packed.data() + ((b - pb) * 2 + j) * b_bytes);
      for (int64_t m = 0; m < mp; m += kAmxRows) {
        const int8_t* a_hi = hi.data() + m * kp;
        const uint8_t* a_lo = two_bytes ? lo.data() + m * kp : nullptr;
        for (int64_t b = pb; b < pe; ++b) {
          const int8_t* b0p = packed.data() + (b - pb) * 2 * b_bytes;
          const int8_t* b1p = b0p + b_bytes;
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          for (int64_t s = 0; s < steps; ++s) {
            _tile_loadd(4, a_hi + s * kAmxK, kp);
            _tile_loadd(6, b0p + s * kAmxK * kAmxCols, kAmxK);
            _tile_loadd(7, b1p + s * kAmxK * kAmxCols, kAmxK);
            _tile_dpbssd(0, 4, 6);
            _tile_dpbssd(1, 4, 7);
            if (two_bytes) {
              _tile_loadd(5, a_lo + s * kAmxK, kp);
              _tile_dpbusd(2, 5, 6);
              _tile_dpbusd(3, 5, 7);
            }
          }
          _tile_stored(0, sums[0], kAmxCols * 4);
          _tile_stored(1, sums[1], kAmxCols * 4);
          if (two_bytes) {
            _tile_stored(2, sums[2], kAmxCols * 4);
            _tile_stored(3, sums[3], kAmxCols * 4);
          }
          for (int j = 0; j < 2; ++j) {
            const int64_t o = (2 * b + j) * kAmxCols;
            if (o >= N) break;
            const __mmask16 cols = first_lanes(N - o);
            const __m512 w_scale = _mm512_maskz_loadu_ps(cols, scale + o);
            const __m512 w_bias = bias ? _mm512_maskz_loadu_ps(cols, bias + o) : _mm512_setzero_ps();
            for (int64_t r = 0; r < kAmxRows && m + r < M; ++r) {
              // The int64 sums of 16 outputs, as two halves of 8: 256 * high + low (8-bit x: high alone).
              __m256 half[2];
              const auto sums_of = [&](int tile, int h) {  // 8 int32 sums of a tile's row r, as int64
                return _mm512_cvtepi32_epi64(
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&sums[tile][r][8 * h])));
              };
              for (int h = 0; h < 2; ++h) {
                __m512i dot = sums_of(j, h);
                if (two_bytes) dot = _mm512_add_epi64(_mm512_slli_epi64(dot, 8), sums_of(2 + j, h));
                half[h] = _mm512_cvtepi64_ps(dot);
              }
              __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(half[0]), half[1], 1);
              y = _mm512_mul_ps(_mm512_mul_ps(y, _mm512_set1_ps(x_scale[m + r])), w_scale);
              _mm512_mask_storeu_ps(out + (m + r) * N + o, cols, _mm512_add_ps(y, w_bias));
            }
          }
        }
      }
    }
    _tile_release();
  });
}
#pragma GCC pop_options
#endif

#if defined(CPU_CAPABILITY_AVX2)
void int8_gemm(const Int8LinearParams& p, const float* x, const int8_t* weight, const float* scale, const float* bias,
               float* out) {
  gemm(p.rows, p.out_features, p.in_features, x, weight, scale, bias, out);
}
#endif
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(int8_gemv_kernel, &CPU_CAPABILITY::int8_gemv);
PT_REGISTER_CPU_KERNEL(int8_dequantize_kernel, &CPU_CAPABILITY::int8_dequantize);
#if defined(CPU_CAPABILITY_AVX512)
PT_REGISTER_CPU_KERNEL(int8_amx_kernel, &CPU_CAPABILITY::int8_amx);
#endif
#if defined(CPU_CAPABILITY_AVX2)
PT_REGISTER_CPU_KERNEL(int8_gemm_kernel, &CPU_CAPABILITY::int8_gemm);
#endif

}  // namespace pytransformer::cpu
