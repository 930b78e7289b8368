#pragma once
// gemv_rows: the few-rows (decoding) product of the linear layers, out [M, N] = (x [M, K] @ w [N, K]^T) * scale [N] +
// bias [N], shared by linear (float32, bfloat16, float16 x and weights) and int8_linear (int8 weights with scales). It
// is weight streaming: M is small, so the time is that of reading w once from memory. The output features are split
// over all threads (at::parallel_for, each thread a contiguous range of weight rows). With an x of at most 32 KiB (48
// for up to 4 rows; below AVX-512 only up to 4 rows, or 8 with integer dot products), a thread reads its range as two
// sequential streams, its first half and its second half, a row of each at a time, up to kStreamPairs pairs of rows a
// call of the dot blocks (a run), prefetched in software from 3 rows of x and for 1 or 2 as timed trials chose
// (stream_prefetch.h), and a thread done with its range takes the last runs of the others' (GemvRows::read_streams);
// otherwise in blocks of 4 rows, the next block prefetched. The weight rows are dotted with all M rows of x by
// dot_rows (blocks of up to 4 weight rows by up to kDotCols rows of x; with AVX-512, 8 rows of x at once over 2 weight
// rows), widening narrow weights as they are loaded, by AVX-512 BF16 dot products on bfloat16, or by integer dot
// products on int8 weights and x quantized per row: AVX-512 VNNI on x of 16 or 8 bits (both 8 rows of x at once over
// 2 weight rows), AVX2 vpmaddwd on x of 16 bits (4 rows of x over 2 weight rows), or below AVX-512 at 3 rows of x and
// from 5 on bfloat16 and float16 weights widened in assembly blocks (4 weight rows by 3 rows of x, dot_block_16), so
// each weight row comes from memory once and from cache for the later blocks of x rows. With AVX-512, an x too large
// to stay in L1 goes by in chunks of K, each over two blocks at a time. Sums are per vector lane over K (or over the
// chunks), then across lanes (the order of a blocked GEMM). Compiled into each including kernel file's ISA level
// (namespace CPU_CAPABILITY, see isa.h).
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "dot_rows.h"
#include "isa.h"
#include "stream_prefetch.h"
#include "vec_util.h"

namespace pytransformer::cpu {
inline namespace CPU_CAPABILITY {

constexpr int64_t kGemvBlock = 4;  // the most output features per work item (the weight rows dot_rows takes at once)
constexpr int64_t kPrefetchBytes = int64_t(64) << 10;  // the most weight bytes of a block prefetched
constexpr int64_t kStreamAhead = 4096;                  // bytes prefetched ahead of each of two streams
constexpr int64_t kStreamPairs = 32;  // pairs of rows of the two streams in one call of the dot blocks, at most
constexpr int64_t kStreamAheadRows = 3;  // the fewest rows of x whose streams always prefetch (see stream_prefetch.h)
constexpr int64_t kChunkXBytes = int64_t(32) << 10;    // x above this goes by in chunks of K (gemv_rows)
constexpr int64_t kChunkBytes = 384;                    // bytes of a weight row a chunk of K covers
constexpr int64_t kChunkBytesFew = 256;                 // the same for up to 4 rows of x
constexpr int64_t kChunkBytesInt = 768;                 // the same for int8 weights with VNNI (any rows of x)
constexpr int64_t kChunkBlocks = 2;                     // blocks a chunk of x is used for before the next
constexpr int64_t kChunkAhead = 1152;                   // bytes prefetched ahead along each row of a chunked group
constexpr int64_t kL1Bytes = int64_t(48) << 10;        // a core's L1 data cache (Zen 4: 32 KiB, Zen 5 and Intel: 48)

// The largest magnitude of x quantized to xq_t for a K: 32767 (int16_t) or 127 (int8_t), or less where an int32 lane
// of the AVX-512 dot_block_i8 could overflow (the AVX2 one is exact for any of these, and quantizes to the same). With
// 16 bits a lane takes 2 of every 32 elements of K against weights down to -128 (K over 8192: 11008 gives 24385);
// with 8 bits, 4 of every 64 against weights shifted to 0..255 (K over a million).
template <typename xq_t>
inline int32_t x_quant_max(int64_t K) {
  constexpr int64_t kPerLane = 4 / sizeof(xq_t), kStep = 64 / sizeof(xq_t), kWeightMax = sizeof(xq_t) == 2 ? 128 : 255;
  return static_cast<int32_t>(std::min<int64_t>(std::numeric_limits<xq_t>::max(),
                                                INT32_MAX / (kWeightMax * kPerLane *
                                                             std::max<int64_t>(1, (K + kStep - 1) / kStep))));
}

// How a row of x is quantized (quantize_rows, quantize_rows_16), from the bits of its largest magnitude (as an int32:
// integer order is magnitude order, with inf and NaN above every finite value) and q_max: finite false for a row with
// an inf or NaN (scale NaN, its outputs NaN); else q = round(x * pre * mul) with pre 2^100 for a row whose largest
// magnitude is below 2^-100 (exact, so that 1 / scale stays finite), else 1, and mul 0 for a row of zeros.
struct RowQuant {
  float scale, pre, mul;
  bool finite;
};
inline RowQuant row_quant(int32_t top_bits, float q_max) {
  if (top_bits >= 0x7F800000) return {std::numeric_limits<float>::quiet_NaN(), 1.0f, 0.0f, false};
  float amax;
  std::memcpy(&amax, &top_bits, sizeof amax);
  const float pre = amax < 0x1p-100f ? 0x1p100f : 1.0f;
  const float big = amax * pre;
  return {big / q_max / pre, pre, big > 0 ? q_max / big : 0.0f, true};
}

#if defined(CPU_CAPABILITY_AVX512)
// The exact sum of the 16 int32 lanes of v.
__attribute__((always_inline)) inline int64_t sum_lanes(__m512i v) {
  return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(v)),
                                                  _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1))));
}

// Lane c of the result: the exact sum of the 16 int32 lanes of v[c], for 8 vectors, in int64 (the lanes widened and
// added in pairs, then a tree of unpacks and 128-bit shuffles): 53 instructions, where sum_lanes takes about 10 a
// vector.
__attribute__((always_inline)) inline __m512i sum_lanes_8(const __m512i* v) {
  __m512i w[8], t[4], u[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)
    w[i] = _mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(v[i])),
                            _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v[i], 1)));
  // t[i], each 128-bit lane: that lane's sums of w[2i] and of w[2i + 1]
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i)
    t[i] = _mm512_add_epi64(_mm512_unpacklo_epi64(w[2 * i], w[2 * i + 1]), _mm512_unpackhi_epi64(w[2 * i], w[2 * i + 1]));
  // u[i]: 128-bit lanes 0 and 1 the halves (lanes 0 + 1, 2 + 3) of t[2i], lanes 2 and 3 those of t[2i + 1]
#pragma GCC unroll 2
  for (int i = 0; i < 2; ++i)
    u[i] = _mm512_add_epi64(_mm512_shuffle_i64x2(t[2 * i], t[2 * i + 1], 0x88),
                            _mm512_shuffle_i64x2(t[2 * i], t[2 * i + 1], 0xDD));
  return _mm512_add_epi64(_mm512_shuffle_i64x2(u[0], u[1], 0x88), _mm512_shuffle_i64x2(u[0], u[1], 0xDD));
}

// out[c * n_out + o] for the 8 rows c of x from the int32 lane sums of their dot products with weight row o, as
// Out8 says: the sums of lanes at once (sum_lanes_8), scaled as vectors.
__attribute__((always_inline)) inline void store_i8_8(const __m512i* sums, const int64_t* b_offset,
                                                      const Out8<float>& to, int64_t o) {
  store_8(_mm512_cvtepi64_ps(_mm512_add_epi64(sum_lanes_8(sums), _mm512_loadu_si512(b_offset))), to, o);
}

#pragma GCC push_options
#pragma GCC target("avx512bf16")  // dot_block_bf16; the rest here uses no BF16 instruction
// Calls step(set, k, mask) over elements [0, n) kWidth (32 or 64) at a time: in pairs while 2 * kWidth are left when
// prefetching (ahead(k) before each pair) or with kTwoSets (sets 0 and 1, else 0 and 0), then alone (set 0), the last
// one's mask the elements left.
// A constant full mask but in the last step: a mask computed at every step slows the read stream of cold weights and
// the dot products of cached ones (cpu_kernel_notes_2026-11-28.md, steps_of). Two loops, with and without ahead, keep
// a test out of the loop.
template <int kWidth, bool kTwoSets, class Ahead, class Step>
__attribute__((always_inline)) inline void steps_of(int64_t n, bool prefetching, Ahead&& ahead, Step&& step) {
  using Mask = std::conditional_t<kWidth == 64, __mmask64, __mmask32>;
  constexpr Mask kAll = ~Mask(0);
  const auto pair = [&](int64_t k) __attribute__((always_inline)) {
    step(std::integral_constant<int, 0>{}, k, kAll);
    step(std::integral_constant<int, kTwoSets ? 1 : 0>{}, k + kWidth, kAll);
  };
  int64_t k = 0;
  if (prefetching)
    for (; k + 2 * kWidth <= n; k += 2 * kWidth) {
      ahead(k);
      pair(k);
    }
  if constexpr (kTwoSets)
    for (; k + 2 * kWidth <= n; k += 2 * kWidth) pair(k);
  for (; k + kWidth <= n; k += kWidth) step(std::integral_constant<int, 0>{}, k, kAll);
  if (k < n) step(std::integral_constant<int, 0>{}, k, (Mask(1) << (n - k)) - 1);
}

// part[c * part_m + r] = dot(a row r, b row c) over n elements for R bfloat16 rows a + r * a_step and C bfloat16 rows
// b + c * b_step (kLanes: 16 partial sums at part + (c * part_m + r) * 16, added to, as in dot_block; prefetch: as
// there) by AVX-512 BF16 dot products (called only where has_avx512_bf16()): each vdpbf16ps multiplies 32 pairs
// exactly and adds them to 16 float32 sums; subnormal inputs and results count as zero, as the instruction defines.
// One instruction takes 32 weights where widening them to float32 takes three per 16 (cpu_kernel_notes_2026-11-28.md,
// dot_block_bf16).
// Small blocks keep two sets of sums, which take alternate steps (kTwoSumSets in dot_rows.h). The loops over r and c
// are unrolled by pragma: GCC 12 at -O3 otherwise unrolls them too late to keep the sums in registers and stores every
// one to the stack at every step (seen in the object code). R x C up to 2 x 8 or 4 x 4: the sums, C rows of x and a
// weight vector in at most 25 of the 32 registers.
// fused (8 rows of x, not kLanes): fused->blocks blocks of R weight rows in one call, each row's 8 sums reduced
// together and written to out (store_sums_8), as in dot_block; n_blocks (not kLanes, not fused): as many blocks, block
// i's sums at part + i * R, as in dot_block.
template <int R, int C, bool kLanes>
void dot_block_bf16(const c10::BFloat16* a_first, int64_t a_step, const c10::BFloat16* b, int64_t b_step, int64_t n,
                    float* part, int64_t part_m, int64_t prefetch, const Out8<c10::BFloat16>* fused = nullptr,
                    int64_t n_blocks = 1) {
  constexpr bool kTwoSets = kTwoSumSets<R, C>;
  const int64_t blocks = !kLanes && C == 8 && fused ? fused->blocks : n_blocks;
  for (int64_t block = 0; block < blocks; ++block) {
    const c10::BFloat16* a = a_first + block * n;  // the next block: the weight rows after these (n: whole rows)
    __m512 acc[R][C], acc2[R][C];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        acc[r][c] = kLanes ? _mm512_loadu_ps(part + (c * part_m + r) * 16) : _mm512_setzero_ps();
        acc2[r][c] = _mm512_setzero_ps();
      }
    // 32 elements from k (a 64-byte line of each row; prefetch: see dot_block) into acc (set 0) or acc2 (set 1);
    // mask: the elements loaded, zeros past them (see steps_of).
    const auto step = [&](auto set, int64_t k, __mmask32 mask) __attribute__((always_inline)) {
      __m512bh bv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) bv[c] = (__m512bh)_mm512_maskz_loadu_epi16(mask, b + c * b_step + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if (prefetch != 0) prefetch_line(a + r * a_step + k, prefetch);
        const __m512bh av = (__m512bh)_mm512_maskz_loadu_epi16(mask, a + r * a_step + k);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          if constexpr (decltype(set)::value == 0) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], av, bv[c]);
          else acc2[r][c] = _mm512_dpbf16_ps(acc2[r][c], av, bv[c]);
        }
      }
    };
    steps_of<32, kTwoSets>(n, false, [](int64_t) {}, step);
    if constexpr (!kLanes && C == 8) {
      if (fused) {  // a weight row's 8 sums at once, scaled as a vector
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m512 sums[C];
#pragma GCC unroll 8
          for (int c = 0; c < C; ++c) sums[c] = kTwoSets ? _mm512_add_ps(acc[r][c], acc2[r][c]) : acc[r][c];
          store_sums_8(sums, *fused, fused->row(block, r));
        }
        continue;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        const __m512 sum = kTwoSets ? _mm512_add_ps(acc[r][c], acc2[r][c]) : acc[r][c];
        if constexpr (kLanes) _mm512_storeu_ps(part + (c * part_m + r) * 16, sum);
        else part[block * R + c * part_m + r] = _mm512_reduce_add_ps(sum);
      }
  }
}

// x [M, K] float32 quantized per row for dot_block_i8 to xq_t (int16_t or int8_t): q[m, k] = round(x[m, k] / scale[m])
// (to nearest, ties to even) with scale[m] = max_k |x[m, k]| / x_quant_max<xq_t>(K), so |x - q * scale| <= scale / 2;
// offset[m] = -128 * sum_k q[m, k] for int8_t (the term that dot_block_i8's weights shifted by 128 add), 0 for
// int16_t. A row with an inf or NaN gets scale NaN (its outputs are NaN); a row of zeros scale 0. A row whose largest
// magnitude is below 2^-100 is scaled by 2^100 first (exact), so that 1 / scale stays finite.
template <typename xq_t>
inline void quantize_rows(int64_t M, int64_t K, const float* x, xq_t* q, float* scale, int64_t* offset) {
  const float q_max = static_cast<float>(x_quant_max<xq_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    xq_t* qr = q + m * K;
    offset[m] = 0;
    // the largest |x| as bits: integer order is magnitude order, with inf and NaN above every finite value
    __m512i top = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = first_lanes(K - k);
      const __m512i bits = _mm512_and_si512(_mm512_maskz_loadu_epi32(mask, xr + k), _mm512_set1_epi32(0x7FFFFFFF));
      top = _mm512_max_epi32(top, bits);
    }
    const RowQuant rq = row_quant(_mm512_reduce_max_epi32(top), q_max);
    scale[m] = rq.scale;
    if (!rq.finite) {
      std::fill(qr, qr + K, xq_t(0));
      continue;
    }
    const __m512 mul = _mm512_set1_ps(rq.mul);
    const __m512 pre_v = _mm512_set1_ps(rq.pre);
    __m512i sum = _mm512_setzero_si512();  // of q, at most 127 * K a lane
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = first_lanes(K - k);
      const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(mask, xr + k), pre_v), mul);
      const __m512i qv = _mm512_cvtps_epi32(v);
      if constexpr (std::is_same_v<xq_t, int8_t>) {
        _mm512_mask_cvtsepi32_storeu_epi8(qr + k, mask, qv);
        sum = _mm512_mask_add_epi32(sum, mask, sum, qv);
      } else {
        _mm512_mask_cvtsepi32_storeu_epi16(qr + k, mask, qv);
      }
    }
    if constexpr (std::is_same_v<xq_t, int8_t>) offset[m] = -128 * sum_lanes(sum);
  }
}

// acc plus the products of a and b added to its int32 lanes: in pairs of int16 (vpdpwssd), or in fours of unsigned
// bytes of a and signed bytes of b (vpdpbusd). In assembly: around the intrinsics, GCC 12 copied every sum between
// registers at every step.
__attribute__((always_inline)) inline __m512i dpwssd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}
__attribute__((always_inline)) inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// part[c * part_m + r] = dot(a row r, b row c) + b_offset[c] over n elements, exactly, rounded once to float32, for R
// int8 rows a + r * a_step and C rows b + c * b_step of x quantized to xq_t (kLanes: the 16 int32 lane sums at
// part + (c * part_m + r) * 16, as bits, added to, for a caller that takes K in chunks and adds b_offset itself;
// prefetch: as in dot_block), by AVX-512 VNNI dot products (called only where has_avx512_vnni()), exact in int32
// lanes (see x_quant_max):
// - int16_t x: each vpdpwssd multiplies 32 pairs of int16 (the weights sign-extended), 2 a 64-byte line of weights and
//   row of x, where widening the weights to float32 takes 8 instructions and 4 fmas a row;
// - int8_t x: each vpdpbusd multiplies 64 weights shifted to unsigned (w + 128, one xor a line for all rows of x) by
//   64 bytes of x, 1 a line and row; the shift's -128 * sum_k x[k] is b_offset (quantize_rows).
// Built as dot_block is (x vectors pinned to registers, two sets of sums for small blocks, never inlined). R x C up to
// 2 x 8 or 4 x 4: the sums, C vectors of x and a weight vector in at most 25 of the 32 registers.
// fused (8 rows of x, not kLanes): fused->blocks blocks of R weight rows in one call, each row's 8 sums reduced
// together (sum_lanes_8) and written to out scaled (Out8) instead of to part: per pair of rows of K 768 the sums of
// lanes, the caller's store and the call take as many instructions as the dot products. n_blocks (not kLanes, not
// fused): as many blocks, block i's sums at part + i * R, as in dot_block.
template <int R, int C, bool kLanes, typename xq_t>
__attribute__((noinline)) void dot_block_i8(const int8_t* a_first, int64_t a_step, const xq_t* b, int64_t b_step,
                                            int64_t n, const int64_t* b_offset, float* part, int64_t part_m,
                                            int64_t prefetch, const Out8<float>* fused = nullptr,
                                            int64_t n_blocks = 1) {
  constexpr bool kBytes = std::is_same_v<xq_t, int8_t>;
  constexpr int kWidth = 64 / sizeof(xq_t);  // elements of K a step: a vector of x
  constexpr bool kTwoSets = kTwoSumSets<R, C>;
  const int64_t blocks = !kLanes && C == 8 && fused ? fused->blocks : n_blocks;
  for (int64_t block = 0; block < blocks; ++block) {
    const int8_t* a = a_first + block * n;  // the next block: the weight rows after these (n: whole rows)
    __m512i acc[R][C], acc2[R][C];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        acc[r][c] = kLanes ? _mm512_loadu_si512(part + (c * part_m + r) * 16) : _mm512_setzero_si512();
        acc2[r][c] = _mm512_setzero_si512();
      }
    const auto dot = [](__m512i sum, __m512i w, __m512i x) __attribute__((always_inline)) {
      return kBytes ? dpbusd(sum, w, x) : dpwssd(sum, w, x);
    };
    // kWidth elements from k into acc (set 0) or acc2 (set 1); mask: the elements loaded (see steps_of)
    const auto step = [&](auto set, int64_t k, auto mask) __attribute__((always_inline)) {
      __m512i bv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        __m512i v = kBytes ? _mm512_maskz_loadu_epi8(mask, b + c * b_step + k)
                           : _mm512_maskz_loadu_epi16(mask, b + c * b_step + k);
        asm("" : "+v"(v));  // kept in a register: see dot_block
        bv[c] = v;
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m512i av;
        if constexpr (kBytes)  // masked-off weights become 128, against x of 0
          av = _mm512_xor_si512(_mm512_maskz_loadu_epi8(mask, a + r * a_step + k), _mm512_set1_epi8(-128));
        else
          av = _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(mask, a + r * a_step + k));
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          if constexpr (decltype(set)::value == 0) acc[r][c] = dot(acc[r][c], av, bv[c]);
          else acc2[r][c] = dot(acc2[r][c], av, bv[c]);
        }
      }
    };
    const auto lines_ahead = [&](int64_t k) __attribute__((always_inline)) {  // the 64-byte lines of a pair of steps
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
        for (int line = 0; line < 2 * kWidth; line += 64) prefetch_line(a + r * a_step + k + line, prefetch);
    };
    steps_of<kWidth, kTwoSets>(n, prefetch != 0, lines_ahead, step);
    if constexpr (!kLanes && C == 8) {
      if (fused) {  // a weight row's 8 sums at once, scaled as vectors
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m512i sums[C];
#pragma GCC unroll 8
          for (int c = 0; c < C; ++c) sums[c] = kTwoSets ? _mm512_add_epi32(acc[r][c], acc2[r][c]) : acc[r][c];
          store_i8_8(sums, b_offset, *fused, fused->row(block, r));
        }
        continue;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        const __m512i sum = kTwoSets ? _mm512_add_epi32(acc[r][c], acc2[r][c]) : acc[r][c];
        if constexpr (kLanes) _mm512_storeu_si512(part + (c * part_m + r) * 16, sum);
        else part[block * R + c * part_m + r] = static_cast<float>(sum_lanes(sum) + b_offset[c]);
      }
  }
}
#pragma GCC pop_options
#endif

#if defined(CPU_CAPABILITY_AVX2)
// x [M, K] float32 quantized per row to int16 for the AVX2 dot_block_i8, as the AVX-512 quantize_rows does it to 16
// bits (bits 16) or to 8 (bits 8, stored in 16): the same q_max (x_quant_max), scale, rounding (to nearest, ties to
// even), pre-scaling of tiny rows and NaN rows, so that both kernels multiply the same integers.
inline void quantize_rows_16(int64_t M, int64_t K, const float* x, int64_t bits, int16_t* q, float* scale) {
  const float q_max = static_cast<float>(bits == 8 ? x_quant_max<int8_t>(K) : x_quant_max<int16_t>(K));
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    int16_t* qr = q + m * K;
    // the largest |x| as bits: integer order is magnitude order, with inf and NaN above every finite value
    int32_t top_bits = 0;
    for (int64_t k = 0; k < K; ++k) {
      int32_t b;
      std::memcpy(&b, xr + k, sizeof b);
      top_bits = std::max(top_bits, b & 0x7FFFFFFF);
    }
    const RowQuant rq = row_quant(top_bits, q_max);
    scale[m] = rq.scale;
    if (!rq.finite) {
      std::fill(qr, qr + K, int16_t(0));
      continue;
    }
    const float pre = rq.pre, mul = rq.mul;
    const __m256 mul_v = _mm256_set1_ps(mul), pre_v = _mm256_set1_ps(pre);
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) {  // cvtps rounds to nearest, ties to even; packs keeps 128-bit lanes, hence the permute
      const __m256i lo = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + k), pre_v), mul_v));
      const __m256i hi = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + k + 8), pre_v), mul_v));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qr + k),
                          _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8));
    }
    for (; k < K; ++k) qr[k] = static_cast<int16_t>(std::nearbyint(xr[k] * pre * mul));
  }
}

// part[c * part_m + r] = dot(a row r, b row c) over n elements, exactly, rounded once to float32, for R int8 weight
// rows a + r * a_step and C rows b + c * b_step of x quantized to int16 (quantize_rows_16), by AVX2 vpmaddwd: 16
// products a step of int16 pairs (the weights sign-extended), added in pairs into 8 int32 lanes, where widening the
// weights to float32 takes 4 instructions and 2 fmas a row. Every kSegment elements the int32 lanes go into int64
// totals, so that no lane overflows for any K and x up to 32767. The sums' chain is an integer add (1 cycle), so one
// set of sums hides it. prefetch: as in dot_block; n_blocks: as many blocks of R weight rows, block i the rows after
// block i - 1's (n: whole rows), its sums at part + i * R. R x C up to 4 x 2 or 2 x 4: the sums, C vectors of x, a
// weight vector and a product in at most 14 of the 16 registers. Never inlined, as dot_block.
template <int R, int C>
__attribute__((noinline)) void dot_block_i8(const int8_t* a_first, int64_t a_step, const int16_t* b, int64_t b_step,
                                            int64_t n, float* part, int64_t part_m, int64_t prefetch,
                                            int64_t n_blocks = 1) {
  constexpr int64_t kSegment = 4096;  // 512 products a lane of at most 128 * 32767 each: below 2^31
  for (int64_t block = 0; block < n_blocks; ++block) {
    const int8_t* a = a_first + block * n;
    int64_t total[R][C] = {};
    for (int64_t s0 = 0; s0 < n; s0 += kSegment) {
      const int64_t s1 = std::min(n, s0 + kSegment);
      __m256i acc[R][C];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_si256();
      // 16 elements from k: weights as given, and x, or copies of the last count elements with zeros past them
      const auto step = [&](const int8_t* const* w, int64_t w_at, const int16_t* const* xs, int64_t x_at)
          __attribute__((always_inline)) {
        __m256i bv[C];
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) bv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xs[c] + x_at));
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256i av = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[r] + w_at)));
#pragma GCC unroll 4
          for (int c = 0; c < C; ++c) acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(av, bv[c]));
        }
      };
      const int8_t* w_rows[R];
      const int16_t* x_rows[C];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) w_rows[r] = a + r * a_step;
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) x_rows[c] = b + c * b_step;
      int64_t k = s0;
      if (prefetch != 0)
        for (; k + 64 <= s1; k += 64) {  // a 64-byte line of each weight row
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) prefetch_line(w_rows[r] + k, prefetch);
#pragma GCC unroll 4
          for (int64_t j = 0; j < 64; j += 16) step(w_rows, k + j, x_rows, k + j);
        }
      for (; k + 16 <= s1; k += 16) step(w_rows, k, x_rows, k);
      if (k < s1) {  // the last elements of a row, through zero-filled copies
        alignas(32) int8_t w_tail[R][16] = {};
        alignas(32) int16_t x_tail[C][16] = {};
        const int8_t* w_t[R];
        const int16_t* x_t[C];
        for (int r = 0; r < R; ++r) {
          std::memcpy(w_tail[r], w_rows[r] + k, s1 - k);
          w_t[r] = w_tail[r];
        }
        for (int c = 0; c < C; ++c) {
          std::memcpy(x_tail[c], x_rows[c] + k, (s1 - k) * sizeof(int16_t));
          x_t[c] = x_tail[c];
        }
        step(w_t, 0, x_t, 0);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          alignas(32) int32_t lanes[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[r][c]);
          for (int l = 0; l < 8; ++l) total[r][c] += lanes[l];
        }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) part[block * R + c * part_m + r] = static_cast<float>(total[r][c]);
  }
}

// bfloat16 weights as pairs (plan.wide_blocks): a 32-bit lane of a vector of 16 bfloat16 weights holds elements 2j (its
// low half) and 2j + 1 (its high half), so the lanes shifted left by 16 are the even elements widened to float32 and
// the lanes with their low halves cleared the odd ones: 2 instructions widen 16 weights, where a widening load takes 2
// for 8. x is widened once in the matching order (widen_pairs): each 16 elements as their 8 even ones, then the odd.
template <typename io_t>
void widen_pairs(int64_t M, int64_t K, const io_t* x, float* out) {
  for (int64_t i = 0; i < M * K; i += 16)  // K is a multiple of 16: a row's elements in groups of 16
    for (int j = 0; j < 8; ++j) {
      out[i + j] = static_cast<float>(x[i + 2 * j]);
      out[i + 8 + j] = static_cast<float>(x[i + 2 * j + 1]);
    }
}

// The assembly of dot_block_16, one 16-element step: the C rows of x (elements [0, 8) then [8, 16) of the step, in
// pairs order the even then the odd) in ymm12-14, each weight row widened in ymm15 and multiplied into its C sums
// ymm(r * C + c). x0, x1: byte offsets of the two halves of x; w0, w1: of the weights (bfloat16 pairs: one load, w0).
#define PT_PX(row, reg, off) "vmovups " #off "(%[x" #row "], %[k], 4), %%ymm" #reg "\n\t"
#define PT_PW(row, off, load) load " " #off "(%[w" #row "], %[k], 2), %%ymm15\n\t"
#define PT_EVEN(row, off) PT_PW(row, off, "vmovdqu") "vpslld $16, %%ymm15, %%ymm15\n\t"
#define PT_ODD(row, off) PT_PW(row, off, "vmovdqu") "vpand %[odd], %%ymm15, %%ymm15\n\t"
#define PT_HALF(row, off) PT_PW(row, off, "vcvtph2ps")
#define PT_FMA(x, acc) "vfmadd231ps %%ymm15, %%ymm" #x ", %%ymm" #acc "\n\t"
#define PT_ROW3(row, off, widen, s0, s1, s2) widen(row, off) PT_FMA(12, s0) PT_FMA(13, s1) PT_FMA(14, s2)
#define PT_ROW2(row, off, widen, s0, s1) widen(row, off) PT_FMA(12, s0) PT_FMA(13, s1)
#define PT_HALF3(x_off, w_off, widen)                                                                       \
  PT_PX(0, 12, x_off) PT_PX(1, 13, x_off) PT_PX(2, 14, x_off) PT_ROW3(0, w_off, widen, 0, 1, 2)           \
      PT_ROW3(1, w_off, widen, 3, 4, 5) PT_ROW3(2, w_off, widen, 6, 7, 8) PT_ROW3(3, w_off, widen, 9, 10, 11)
#define PT_HALF2(x_off, w_off, widen)                                                                      \
  PT_PX(0, 12, x_off) PT_PX(1, 13, x_off) PT_ROW2(0, w_off, widen, 0, 1) PT_ROW2(1, w_off, widen, 2, 3) \
      PT_ROW2(2, w_off, widen, 4, 5) PT_ROW2(3, w_off, widen, 6, 7)
#define PT_PAIRS3(x0, x1, w0, w1) PT_HALF3(x0, w0, PT_EVEN) PT_HALF3(x1, w0, PT_ODD)
#define PT_PAIRS2(x0, x1, w0, w1) PT_HALF2(x0, w0, PT_EVEN) PT_HALF2(x1, w0, PT_ODD)
#define PT_HALVES3(x0, x1, w0, w1) PT_HALF3(x0, w0, PT_HALF) PT_HALF3(x1, w1, PT_HALF)
#define PT_HALVES2(x0, x1, w0, w1) PT_HALF2(x0, w0, PT_HALF) PT_HALF2(x1, w1, PT_HALF)
#define PT_PREFETCH "prefetcht0 (%[p0], %[k], 2)\n\tprefetcht0 (%[p1], %[k], 2)\n\t"
// A loop of 32 elements an iteration (a 64-byte line of each weight row), k from -n up to 0.
#define PT_LOOP(prefetch, STEP) "1:\n\t" prefetch STEP(0, 32, 0, 16) STEP(64, 96, 32, 48) "add $32, %[k]\n\tjnz 1b\n\t"
// The sums: register r * C + c, stored at byte offset (c * 4 + r) * 32 of lanes.
#define PT_SUMS3(op) op(0, 0) op(1, 128) op(2, 256) op(3, 32) op(4, 160) op(5, 288) op(6, 64) op(7, 192) op(8, 320) \
                     op(9, 96) op(10, 224) op(11, 352)
#define PT_SUMS2(op) op(0, 0) op(1, 128) op(2, 32) op(3, 160) op(4, 64) op(5, 192) op(6, 96) op(7, 224)
#define PT_ZERO_SUM(reg, off) "vxorps %%ymm" #reg ", %%ymm" #reg ", %%ymm" #reg "\n\t"
#define PT_STORE_SUM(reg, off) "vmovups %%ymm" #reg ", " #off "(%[s])\n\t"

// lanes[(c * kGemvBlock + r) * 8 + l] = lane l of the sums of dot(a row r, b row c) over n elements (a multiple of 32)
// for 4 16-bit weight rows a + r * a_step and C = 3 or 2 rows b + c * b_step of x, widened to float32: bfloat16 as
// pairs, x in pairs order (widen_pairs), float16 by vcvtph2ps (8 weights a load), x in its order. The dot product is
// the sum of the 8 lanes. kPrefetch: as each 64-byte line of weight rows pf and pf + 1 is read, the line `prefetch`
// bytes on is asked for (GemvRows::dot_wide_blocks spreads a block's prefetch over two calls).
// 4 x 3: 12 sums, 3 x vectors and a weight vector in the 16 registers, 12 fmas to 4 weight loads and 3 of x.
// In assembly: with intrinsics GCC 12 kept 3 of the 12 sums on the stack, and the loop ran at half the speed.
template <typename W, int C, bool kPrefetch>
__attribute__((noinline)) void dot_block_16(const W* a, int64_t a_step, const float* b, int64_t b_step, int64_t n,
                                            float* lanes, int64_t pf, int64_t prefetch) {
  static_assert((C == 2 || C == 3) && kGemvBlock == 4);  // PT_SUMS3 and PT_SUMS2 place the sums of 4 weight rows
  static_assert(std::is_same_v<W, c10::BFloat16> || std::is_same_v<W, c10::Half>);
  const __m256i odd = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));  // the high halves of the lanes
  int64_t k = -n;  // the rows are addressed from their ends
  const W *w0 = a + n, *w1 = w0 + a_step, *w2 = w1 + a_step, *w3 = w2 + a_step;
  const float *x0 = b + n, *x1 = x0 + b_step, *x2 = C == 3 ? x1 + b_step : x1;  // x2: unused for C = 2
  const char* p0 = reinterpret_cast<const char*>(w0 + pf * a_step) + prefetch;
  const char* p1 = p0 + a_step * static_cast<int64_t>(sizeof(W));
#define PT_ASM(SUMS, STEP, prefetch, prefetch_operands)                                                            \
  asm volatile(SUMS(PT_ZERO_SUM) PT_LOOP(prefetch, STEP) SUMS(PT_STORE_SUM)                                      \
               : [k] "+r"(k)                                                                                      \
               : [s] "r"(lanes), [x0] "r"(x0), [x1] "r"(x1), [x2] "r"(x2), [w0] "r"(w0), [w1] "r"(w1),            \
                 [w2] "r"(w2), [w3] "r"(w3), [odd] "m"(odd) prefetch_operands                                     \
               : "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                 "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15")
#define PT_ASM_C(STEP3, STEP2)                                                               \
  if constexpr (C == 3 && kPrefetch)                                                         \
    PT_ASM(PT_SUMS3, STEP3, PT_PREFETCH, PT_PREFETCH_OPERANDS);                               \
  else if constexpr (C == 3)                                                                 \
    PT_ASM(PT_SUMS3, STEP3, "", );                                                           \
  else if constexpr (kPrefetch)                                                              \
    PT_ASM(PT_SUMS2, STEP2, PT_PREFETCH, PT_PREFETCH_OPERANDS);                               \
  else                                                                                       \
    PT_ASM(PT_SUMS2, STEP2, "", )
#define PT_PREFETCH_OPERANDS , [p0] "r"(p0), [p1] "r"(p1)
  if constexpr (std::is_same_v<W, c10::BFloat16>) {
    PT_ASM_C(PT_PAIRS3, PT_PAIRS2);
  } else {
    PT_ASM_C(PT_HALVES3, PT_HALVES2);
  }
}
#undef PT_PREFETCH_OPERANDS
#undef PT_ASM_C
#undef PT_ASM
#undef PT_STORE_SUM
#undef PT_ZERO_SUM
#undef PT_SUMS2
#undef PT_SUMS3
#undef PT_LOOP
#undef PT_PREFETCH
#undef PT_HALVES2
#undef PT_HALVES3
#undef PT_PAIRS2
#undef PT_PAIRS3
#undef PT_HALF2
#undef PT_HALF3
#undef PT_ROW2
#undef PT_ROW3
#undef PT_FMA
#undef PT_HALF
#undef PT_ODD
#undef PT_EVEN
#undef PT_PW
#undef PT_PX
#endif

// &to for a dot block that writes T where it writes its results itself (on), else nullptr.
template <typename T, typename U>
const Out8<T>* fused_out(bool on, const Out8<U>& to) {
  if constexpr (std::is_same_v<T, U>) return on ? &to : nullptr;
  return nullptr;
}

// Calls f(R, C, r, m) for blocks of C rows of x from m (8 while 8 are left, then 4, 2, 1) by R weight rows from r (2
// for 8 rows of x, else up to 4) that cover M rows of x and nb weight rows: the blocks of the AVX-512 dot products.
template <class F>
void for_x_blocks(int64_t M, int64_t nb, F&& f) {
  for_blocks<8>(M, [&](auto C, int64_t m) {
    constexpr int kRows = decltype(C)::value == 8 ? 2 : 4;  // weight rows a block of C rows of x takes
    for_blocks<kRows>(nb, [&](auto R, int64_t r) { f(R, C, r, m); });
  });
}

// Whether 16-bit weights [N, K] fit gemv_rows' assembly blocks below AVX-512 (dot_block_16): whole steps of 32
// elements and blocks of 4 rows.
inline bool wide_blocks_fit(int64_t N, int64_t K) { return K % 32 == 0 && N % kGemvBlock == 0; }

// The types those blocks take: 16-bit weights summed in float32.
template <typename acc_t, typename w_t>
constexpr bool kWideBlockTypes =
    (std::is_same_v<w_t, c10::BFloat16> || std::is_same_v<w_t, c10::Half>) && std::is_same_v<acc_t, float>;

// The path of one gemv_rows call, decided from the dtypes, M, K and the processor before any work (plan_gemv). Each
// choice is the one that measured best where it applies; the numbers are in
// benchmarks/results/cpu_kernel_notes_2026-11-28.md, section gemv_rows.
struct GemvPlan {
  bool bf16_dots = false;  // bfloat16 x and weights: AVX-512 BF16 dot products on x as it is (dot_block_bf16)
  bool int_dots = false;   // int8 weights, float32 x: AVX-512 VNNI integer dot products on x quantized per row
  bool x_8_bits = false;   // int_dots: x quantized to 8 bits instead of 16
  bool wide_blocks = false;  // 16-bit weights widened in 4 x 3 assembly blocks (dot_block_16; AVX2)
  bool chunked = false;    // x goes by in chunks of K, each over kChunkBlocks blocks (GemvRows::read_chunks)
  bool streams = false;    // a thread reads its weight rows as two sequential streams (GemvRows::read_streams)
  int64_t stream_ahead = 0;  // streams: the bytes prefetched ahead of each (0: none, the hardware's prefetch alone)
  bool prefetch_trial = false;  // streams of 1 or 2 rows of x: a timed trial of the way (stream_prefetch.h)
  bool fused = false;      // dot blocks of 8 rows of x write out themselves (Out8) instead of sums for store
  int64_t x_bytes = 0;     // x as the dot products read it
  int64_t row_bytes = 0;   // a weight row
  int64_t block_bytes = 0;     // the weight bytes of a block
  int64_t chunk_bytes = 0;     // chunked: the bytes of each weight row a chunk of K covers
};

// The plan of gemv_rows<acc_t, w_t, io_t> for M rows of x of K elements and N weight rows (x_quant_bits: see
// gemv_rows).
template <typename acc_t, typename w_t, typename io_t>
GemvPlan plan_gemv(int64_t M, int64_t N, int64_t K, int64_t x_quant_bits) {
  [[maybe_unused]] constexpr bool kFloatIo = std::is_same_v<io_t, float> && std::is_same_v<acc_t, float>;
  GemvPlan p;
#if defined(CPU_CAPABILITY_AVX512)
  constexpr bool kIntTypes = std::is_same_v<w_t, int8_t> && std::is_same_v<io_t, float>;
  if constexpr (std::is_same_v<w_t, c10::BFloat16> && std::is_same_v<io_t, c10::BFloat16>)
    p.bf16_dots = has_avx512_bf16();
  // Integer dot products take 2 (16-bit x) or 4 (8-bit x) times fewer instructions a weight line than the float32
  // fmas on widened weights that bound 8 rows of x, and they are exact, so a row's result does not depend on M or on
  // the path.
  if constexpr (kIntTypes) p.int_dots = x_quant_bits != 0;
#elif defined(CPU_CAPABILITY_AVX2)
  // vpmaddwd takes 16 weights an instruction and a row of x, the float32 fmas 8 after 4 instructions to widen them;
  // x is quantized to 16 bits (or to 8, stored in 16).
  if constexpr (std::is_same_v<w_t, int8_t> && std::is_same_v<io_t, float>) p.int_dots = x_quant_bits != 0;
#endif
  p.x_8_bits = p.int_dots && x_quant_bits == 8;
#if defined(CPU_CAPABILITY_AVX2)
  const bool x_8_bit_bytes = false;  // 8-bit x is stored in 16 bits
#else
  const bool x_8_bit_bytes = p.x_8_bits;
#endif
  p.x_bytes = M * K * (x_8_bit_bytes ? 1 : p.bf16_dots || p.int_dots ? 2 : static_cast<int64_t>(sizeof(acc_t)));
#if defined(CPU_CAPABILITY_AVX512)
  // Chunks of K keep a large x in L1 while the weights stream past, where that measured faster: 3 to 8 rows of x with
  // dot products of narrow types, 5 to 8 of float32 (one pass over a block reads up to 4 rows better); AVX-512 only.
  p.chunked = p.x_bytes > kChunkXBytes && M <= 8 &&
              (p.bf16_dots || p.int_dots ? M >= 3 : std::is_same_v<w_t, float> && M > 4);
  // Two streams a thread read memory better than blocks of rows (a short stream per row), while x stays in L1; more
  // rows of x, which go over x in several passes, and AVX2's 8 lanes did better in blocks.
  p.streams = !p.chunked && p.x_bytes <= (M <= 4 ? kL1Bytes : kChunkXBytes);
#else
  // Below AVX-512 (an AVX2 EPYC) two streams read better up to 4 rows of x, at 8 (two passes of 4 over a run of
  // pairs; 1.1x blocks' speed on bfloat16 weights, a tie on float32) and with integer dot products; 5 to 7 rows of x
  // did better in blocks of 4 weight rows (a run of the streams is one pair where M is not a power of two); 16-bit
  // weights at 3 rows of x and from 5 go in the assembly blocks instead, where their shapes allow.
#if defined(CPU_CAPABILITY_AVX2)
  // 16-bit weights at 3 rows of x and from 5 (where the float32 fmas bound the time) in 4 x 3 assembly blocks:
  // bfloat16 as pairs 0.71-0.80x the time of the 2 x 4 blocks of widened weights at TinyLlama's layers (5 to 16 rows),
  // 0.83-0.97x at Llama-124M's (cpu_linear_2026-12-06_zen3_bf16_pairs.md). float16 by vcvtph2ps 0.67-0.71x the time
  // of the blocks and streams before at TinyLlama's (5, 8, 16 rows), 0.83-0.92x at Llama-124M's. 3 rows, one pass of
  // one block over the weights, 0.76x (float16) / 0.83x (bfloat16) the streams' time at TinyLlama's, 1.00x / 0.95x at
  // Llama-124M's; 4 rows, two passes of 2, lost to the streams (0.99-1.17x) (cpu_linear_2026-12-06_zen3_f16_blocks.md).
  if constexpr (kWideBlockTypes<acc_t, w_t>) p.wide_blocks = (M == 3 || M >= 5) && wide_blocks_fit(N, K);
#endif
  p.streams = !p.wide_blocks && p.x_bytes <= (M <= 4 ? kL1Bytes : kChunkXBytes) && (M <= 4 || M == 8 || p.int_dots);
#endif
  p.row_bytes = K * static_cast<int64_t>(sizeof(w_t));
  // Software prefetch lets the dot products of 3 or more rows of x overlap the reads; with fewer the loop waits on
  // memory either way, and whether prefetch helps it depends on the host (stream_prefetch.h).
  if (p.streams && M >= kStreamAheadRows) {
    p.stream_ahead = kStreamAhead;
  } else if (p.streams) {
    const StreamPrefetchTrial trial = stream_prefetch_trial(sizeof(w_t), N * p.row_bytes);
    p.stream_ahead = trial.prefetch ? kStreamAhead : 0;
    p.prefetch_trial = trial.timed;
  }
  p.block_bytes = kGemvBlock * p.row_bytes;
  // Integer dot products are compute-bound in chunks, and longer chunks load and store their sums fewer times a line;
  // up to 4 rows of x, shorter chunks read memory better.
  p.chunk_bytes = p.int_dots ? kChunkBytesInt : M <= 4 ? kChunkBytesFew : kChunkBytes;
  // Reducing a weight row's 8 sums together and writing out in the dot block took a third or more of the
  // instructions of the separate sums of lanes and store (the fused paths of dot_block, dot_block_bf16, dot_block_i8).
  // (AVX-512 only: below it the dot blocks write sums)
#if defined(CPU_CAPABILITY_AVX512)
  p.fused = M % 8 == 0 && (p.int_dots || ((kFloatIo || p.bf16_dots) && (p.chunked || p.streams)));
#endif
  return p;
}

// x as the dot products read it: in acc_t (as it is, or widened from a narrower io_t; dot_block, dot_rows), as it is
// (bf16_dots), or quantized per row (int_dots: quantize_rows).
template <typename acc_t>
struct GemvX {
  const acc_t* wide = nullptr;   // x in acc_t, or nullptr where the dot products read it otherwise
  std::vector<acc_t> widened;    // the storage of wide where io_t is narrower than acc_t
  std::vector<int16_t> int16;    // int_dots, 16 bits: x [M, K] quantized
  std::vector<int8_t> int8;      // int_dots, 8 bits: x [M, K] quantized
  std::vector<float> scale;      // int_dots: the step of each row's quantization [M]
  std::vector<int64_t> offset;   // int_dots: each row's offset for the shifted weights of 8 bits [M] (quantize_rows)
};

// One call of gemv_rows: its arguments, its plan and its x, and the steps of the work, one method each.
template <typename acc_t, typename w_t, typename io_t>
class GemvRows {
 public:
  GemvRows(int64_t M, int64_t N, int64_t K, const io_t* x, const w_t* w, const acc_t* scale, const io_t* bias,
           io_t* out, int64_t x_quant_bits)
      : M(M), N(N), K(K), x(x), w(w), scale(scale), bias(bias), out(out),
        plan(plan_gemv<acc_t, w_t, io_t>(M, N, K, x_quant_bits)), xs(prepare_x()) {}

  // The output features split over all threads, each thread a contiguous range of blocks of weight rows; a trial of
  // the streams' prefetch is timed (stream_prefetch.h).
  void run() const {
    if (!plan.prefetch_trial) return run_threads();
    const auto t0 = std::chrono::steady_clock::now();
    run_threads();
    stream_prefetch_report(sizeof(w_t), plan.stream_ahead != 0, N * plan.row_bytes,
                           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }

 private:
  void run_threads() const {
    const int64_t items = (N + kGemvBlock - 1) / kGemvBlock;
    // ~32 KiB of weight per task at least: fewer tasks than that cost more in scheduling than they save.
    const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, plan.block_bytes));
    if (plan.streams) return read_streams(items, grain);
    at::parallel_for(0, items, grain, [&](int64_t i0, int64_t i1) {
      // The sums [M, 4] of a block, or with x in chunks those of a group of blocks, each as kVec partial sums.
      std::vector<acc_t> part(plan.chunked ? kChunkBlocks * M * kGemvBlock * kVec : M * kGemvBlock);
#if defined(CPU_CAPABILITY_AVX512)
      if (plan.chunked) return read_chunks(i0, i1, part.data());
#endif
      read_blocks(i0, i1, part.data());
    });
  }

  static constexpr bool kIntTypes = std::is_same_v<w_t, int8_t> && std::is_same_v<io_t, float>;
  static constexpr bool kFusedIo = std::is_same_v<acc_t, float> &&
                                   (std::is_same_v<io_t, float> || std::is_same_v<io_t, c10::BFloat16>);
  static constexpr int64_t kVec = at::vec::Vectorized<acc_t>::size();

  const int64_t M, N, K;
  const io_t* const x;
  const w_t* const w;
  const acc_t* const scale;
  const io_t* const bias;
  io_t* const out;
  const GemvPlan plan;
  const GemvX<acc_t> xs;

  GemvX<acc_t> prepare_x() const {
    GemvX<acc_t> r;
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (kIntTypes) {
      if (plan.int_dots) {
        r.scale.resize(M);
        r.offset.resize(M);
        if (plan.x_8_bits) {
          r.int8.resize(M * K);
          quantize_rows(M, K, x, r.int8.data(), r.scale.data(), r.offset.data());
        } else {
          r.int16.resize(M * K);
          quantize_rows(M, K, x, r.int16.data(), r.scale.data(), r.offset.data());
        }
      }
    }
#elif defined(CPU_CAPABILITY_AVX2)
    if constexpr (kIntTypes) {
      if (plan.int_dots) {
        r.scale.resize(M);
        r.int16.resize(M * K);
        quantize_rows_16(M, K, x, plan.x_8_bits ? 8 : 16, r.int16.data(), r.scale.data());
      }
    }
#endif
#if defined(CPU_CAPABILITY_AVX2)
    if constexpr (std::is_same_v<acc_t, float>) {
      if (std::is_same_v<w_t, c10::BFloat16> && plan.wide_blocks) {
        r.widened.resize(M * K);
        widen_pairs(M, K, x, r.widened.data());
        r.wide = r.widened.data();
        return r;
      }
    }
#endif
    if constexpr (std::is_same_v<io_t, acc_t>) {
      r.wide = x;
    } else if (!plan.bf16_dots) {
      r.widened.assign(x, x + M * K);
      r.wide = r.widened.data();
    }
    return r;
  }

  // Where the 8 rows of x from m write the outputs o0 + i + r * o_step of block i (Out8; float32 or bfloat16 out).
  Out8<io_t> out8(int64_t m, int64_t o0, int64_t o_step, int64_t blocks) const {
    Out8<io_t> to{};
    if constexpr (kFusedIo)
      to = {out + m * N, N, o0, o_step, blocks, plan.int_dots ? xs.scale.data() + m : nullptr, scale, bias};
    return to;
  }

  // The dot products of the nb weight rows n + r * step with all M rows of x over elements [c0, c0 + cn) into sums
  // (row m of x's at sums + m * sums_m; kLanes: as vectors of partial sums, added to), or into out where plan.fused;
  // ahead: the prefetch distance of the weight rows (see prefetch_line); blocks: that many blocks of nb rows in one
  // call, each the rows after the last's (fused: Out8::blocks; else the dot blocks' n_blocks, block i's sums at
  // sums + i * nb, and M a power of two up to 8, whose rows of x the dot blocks take in one pass).
  template <bool kLanes>
  void dot(int64_t n, int64_t nb, int64_t step, int64_t c0, int64_t cn, int64_t ahead, acc_t* sums,
           int64_t blocks = 1, int64_t sums_m = kGemvBlock) const {
    const w_t* rows = w + n * K + c0;
#if defined(CPU_CAPABILITY_AVX512)
    const bool fused = plan.fused && !kLanes;
    constexpr int64_t kSum = kLanes ? kVec : 1;  // a sum's size in acc_t
    if constexpr (std::is_same_v<w_t, c10::BFloat16> && std::is_same_v<io_t, c10::BFloat16>) {
      // 8 rows of x at a time in one pass over 2 weight rows at a time, each weight line used by all 8 rows as it
      // arrives (with more rows the next 8 reread the block's weights from cache)
      if (plan.bf16_dots)
        return for_x_blocks(M, nb, [&](auto R, auto C, int64_t r, int64_t m) {
          const auto to = out8(m, n + r * step, step, blocks);
          dot_block_bf16<decltype(R)::value, decltype(C)::value, kLanes>(
              rows + r * step * K, step * K, x + m * K + c0, K, cn, sums + (m * sums_m + r) * kSum, sums_m, ahead,
              fused_out<c10::BFloat16>(fused, to), blocks);
        });
    }
    if constexpr (kIntTypes) {
      if (plan.int_dots)
        return for_x_blocks(M, nb, [&](auto R, auto C, int64_t r, int64_t m) {
          const auto to = out8(m, n + r * step, step, blocks);
          const auto dot_x = [&](const auto* xq) {
            dot_block_i8<decltype(R)::value, decltype(C)::value, kLanes>(
                rows + r * step * K, step * K, xq + m * K + c0, K, cn, xs.offset.data() + m,
                sums + (m * sums_m + r) * kSum, sums_m, ahead, fused_out<float>(fused, to), blocks);
          };
          plan.x_8_bits ? dot_x(xs.int8.data()) : dot_x(xs.int16.data());
        });
    }
    // The same blocks in the other dtypes (16 sums and the 8 x vectors in registers, each weight vector loaded and
    // widened once for all 8, where 4 x 4 blocks take two passes), while x (or its chunk) stays in L1: an x read
    // from L2, 8 vectors for 2 weight vectors, is slower.
    if (M >= 8 && (plan.chunked || plan.streams))
      return for_x_blocks(M, nb, [&](auto R, auto C, int64_t r, int64_t m) {
        const auto to = out8(m, n + r * step, step, blocks);
        dot_block<decltype(R)::value, decltype(C)::value, kLanes>(rows + r * step * K, step * K, xs.wide + m * K + c0,
                                                                  K, cn, sums + (m * sums_m + r) * kSum, 1, sums_m,
                                                                  ahead, fused_out<acc_t>(fused, to), blocks);
      });
#elif defined(CPU_CAPABILITY_AVX2)
    // 4 rows of x at a time over 2 weight rows, fewer over 4, so that each weight vector is loaded (and widened) once
    // for 4 rows of x: the integer dot products, and the float32 fmas from 4 rows of x (1.1-1.4x the speed of dot_rows'
    // 4 x 2 blocks at 4 and 8 rows, cpu_linear_2026-12-05_zen3_rows.md). (No chunks of K below AVX-512.)
    if constexpr (kWideBlockTypes<acc_t, w_t> && !kLanes)
      if (plan.wide_blocks) return dot_wide_blocks(rows, ahead, sums, sums_m);
    if constexpr (!kLanes)
      if (plan.int_dots || M >= 4)
        return for_blocks<4>(M, [&](auto C, int64_t m) {
          constexpr int kRows = decltype(C)::value == 4 ? 2 : 4;
          for_blocks<kRows>(nb, [&](auto R, int64_t r) {
            constexpr int kR = decltype(R)::value, kC = decltype(C)::value;
            if constexpr (kIntTypes)
              if (plan.int_dots)
                return dot_block_i8<kR, kC>(rows + r * step * K, step * K, xs.int16.data() + m * K + c0, K, cn,
                                            sums + m * sums_m + r, sums_m, ahead, blocks);
            constexpr const Out8<acc_t>* kNotFused = nullptr;
            dot_block<kR, kC>(rows + r * step * K, step * K, xs.wide + m * K + c0, K, cn, sums + m * sums_m + r, 1,
                              sums_m, ahead, kNotFused, blocks);
          });
        });
#endif
    dot_rows<kLanes>(rows, step * K, nb, xs.wide + c0, K, M, cn, sums, 1, sums_m, ahead, blocks);
  }

#if defined(CPU_CAPABILITY_AVX2)
  // dot<false> for wide_blocks: a block of 4 weight rows from `rows` (one apart) with x's rows 3 at a time (2 for the
  // last 2 or 4), the sums of their lanes into sums. The next block's lines, `ahead` bytes on, are asked for by the
  // first two blocks of x rows, two weight rows each: all four from the first took 1.14x the time at K 768, 8 rows of
  // x (a burst of requests that waits for free miss buffers).
  void dot_wide_blocks(const w_t* rows, int64_t ahead, acc_t* sums, int64_t sums_m) const {
    for (int64_t m = 0; m < M;) {
      const int64_t left = M - m, c_rows = left == 2 || left == 4 ? 2 : 3, pf = m == 0 ? 0 : 2;
      alignas(32) float lanes[3 * kGemvBlock * 8];  // [c][r][lane]
      const bool prefetch = m <= 3 && ahead != 0;  // m 0 or 3: the first two blocks
      const auto block = [&](auto C) {
        constexpr int kC = decltype(C)::value;
        (prefetch ? dot_block_16<w_t, kC, true> : dot_block_16<w_t, kC, false>)(rows, K, xs.wide + m * K, K, K, lanes,
                                                                              pf, ahead);
      };
      c_rows == 3 ? block(std::integral_constant<int, 3>{}) : block(std::integral_constant<int, 2>{});
      for (int64_t c = 0; c < c_rows; ++c)
        for (int64_t r = 0; r < kGemvBlock; ++r)
          sums[(m + c) * sums_m + r] = at::vec::vec_reduce_all<float>(
              VecPlus(), at::vec::Vectorized<float>::loadu(lanes + (c * kGemvBlock + r) * 8));
      m += c_rows;
    }
  }
#endif

  // out for the nb weight rows n + r * step from their sums (row m of x's at sums + m * sums_m; nothing where the dot
  // blocks wrote out themselves).
  template <bool kLanes>
  void store(int64_t n, int64_t nb, int64_t step, const acc_t* sums, int64_t sums_m = kGemvBlock) const {
    if (plan.fused && !kLanes) return;
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (kFusedIo && kLanes)
      if (plan.fused) return store_lanes_8(n, nb, step, sums);
#endif
    for (int64_t m = 0; m < M; ++m)
      for (int64_t r = 0; r < nb; ++r) {
        const int64_t o = n + r * step;
        acc_t dot_mr = kLanes ? sum_of_lanes(sums + (m * sums_m + r) * kVec, m) : sums[m * sums_m + r];
        if (kIntTypes && plan.int_dots) dot_mr *= xs.scale[m];
        out[m * N + o] = static_cast<io_t>(dot_mr * (scale ? scale[o] : acc_t(1)) +
                                           (bias ? static_cast<acc_t>(bias[o]) : acc_t(0)));
      }
  }

  // The dot product of row m of x from its kVec partial sums at lanes (int_dots: int32 lanes, summed exactly).
  acc_t sum_of_lanes(const acc_t* lanes, int64_t m) const {
#if defined(CPU_CAPABILITY_AVX512)
    if (kIntTypes && plan.int_dots) return static_cast<acc_t>(sum_lanes(_mm512_loadu_si512(lanes)) + xs.offset[m]);
#endif
    using Vec = at::vec::Vectorized<acc_t>;
    return at::vec::vec_reduce_all<acc_t>(VecPlus(), Vec::loadu(lanes));
  }

#if defined(CPU_CAPABILITY_AVX512)
  // store for the partial sums of 8 rows of x (in chunks): as the fused dot blocks write them over whole rows.
  void store_lanes_8(int64_t n, int64_t nb, int64_t step, const acc_t* sums) const {
    const auto to = out8(0, 0, 0, 1);
    for (int64_t r = 0; r < nb; ++r) {
      const acc_t* lanes_r = sums + r * kVec;  // row m's lanes at lanes_r + m * kGemvBlock * kVec
      if constexpr (kIntTypes) {
        if (plan.int_dots) {  // int32 lanes (dot_block_i8)
          __m512i v[8];
          for (int m = 0; m < 8; ++m) v[m] = _mm512_loadu_si512(lanes_r + m * kGemvBlock * kVec);
          store_i8_8(v, xs.offset.data(), to, n + r * step);
          continue;
        }
      }
      __m512 v[8];
      for (int m = 0; m < 8; ++m) v[m] = _mm512_loadu_ps(lanes_r + m * kGemvBlock * kVec);
      store_sums_8(v, to, n + r * step);
    }
  }
#endif

  // One thread's range of the streams: rows [r0, r1) as h pairs (r0 + j, r0 + h + j), then the last row of an odd
  // count alone; the pairs go in runs of per_run pairs, which its thread claims from the front and threads done with
  // their own ranges from the back (runs: the front in the low 32 bits, the back in the high 32).
  struct StreamRange {
    int64_t r0 = 0, r1 = 0, h = 0, per_run = 1;
    std::atomic<uint64_t> runs{0};
  };

  // The next run of a range from its front or back, -1 when none is left.
  static int64_t claim_run(std::atomic<uint64_t>& runs, bool front) {
    uint64_t c = runs.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t lo = c & 0xffffffffu, hi = c >> 32;
      if (lo >= hi) return -1;
      const uint64_t next = front ? (hi << 32) | (lo + 1) : ((hi - 1) << 32) | lo;
      if (runs.compare_exchange_weak(c, next, std::memory_order_relaxed))
        return static_cast<int64_t>(front ? lo : hi - 1);
    }
  }

  // The items (blocks of rows) split into one range a thread (fewer for fewer than `grain` items each), read as two
  // streams each, plan.stream_ahead bytes prefetched ahead of each (a prefetch past the range or w never faults). A
  // thread done with its range takes the last runs of the others: the reads of a thread slowed for a while (a busy
  // neighbour on its core) go on in parallel instead of holding the others at the end of the call.
  void read_streams(int64_t items, int64_t grain) const {
    const int64_t ranges = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), (items + grain - 1) / grain));
    const int64_t per_range = (items + ranges - 1) / ranges;
    std::vector<StreamRange> range(ranges);
    for (int64_t t = 0; t < ranges; ++t) {
      StreamRange& r = range[t];
      r.r0 = std::min(N, t * per_range * kGemvBlock);
      r.r1 = std::min(N, (t + 1) * per_range * kGemvBlock);
      r.h = (r.r1 - r.r0) / 2;
      // Pairs a run: all h where 8 rows of x write their outputs directly (Out8::blocks; store returns at once), up
      // to kStreamPairs where the dot blocks take all M rows of x in one pass, else one.
      r.per_run = plan.fused && M == 8 ? std::max<int64_t>(r.h, 1) : (M & (M - 1)) == 0 && M <= 8 ? kStreamPairs : 1;
      r.runs.store(static_cast<uint64_t>((r.h + r.per_run - 1) / r.per_run) << 32, std::memory_order_relaxed);
    }
    at::parallel_for(0, ranges, 1, [&](int64_t t0, int64_t t1) {
      std::vector<acc_t> part(M * 2 * kStreamPairs);  // the sums [M, 2 * per_run] of a run
      for (int64_t t = t0; t < t1; ++t) {
        StreamRange& own = range[t];
        for (int64_t u; (u = claim_run(own.runs, true)) >= 0;) stream_run(own, u, part.data());
        if (own.r0 + 2 * own.h < own.r1) {
          dot<false>(own.r1 - 1, 1, 1, 0, K, 0, part.data());
          store<false>(own.r1 - 1, 1, 1, part.data());
        }
        for (int64_t v = 1; v < ranges; ++v) {
          StreamRange& other = range[(t + v) % ranges];
          for (int64_t u; (u = claim_run(other.runs, false)) >= 0;) stream_run(other, u, part.data());
        }
      }
    });
  }

  // Run u of range r: its pairs in one call of the dot blocks, then their stores.
  void stream_run(const StreamRange& r, int64_t u, acc_t* part) const {
    const int64_t j = u * r.per_run, pairs = std::min(r.per_run, r.h - j), sums_m = 2 * r.per_run;
    dot<false>(r.r0 + j, 2, r.h, 0, K, plan.stream_ahead, part, pairs, sums_m);
    for (int64_t i = 0; i < pairs; ++i) store<false>(r.r0 + j + i, 2, r.h, part + 2 * i, sums_m);
  }

#if defined(CPU_CAPABILITY_AVX512)  // the one level that plans x in chunks (plan_gemv)
  // Blocks [i0, i1) in groups of kChunkBlocks, each group over x in chunks of K (plan.chunk_bytes of each weight row)
  // whose sums stay vectors in part between chunks, so that a chunk of x is reused from L1 while the weights stream
  // past.
  void read_chunks(int64_t i0, int64_t i1, acc_t* part) const {
    const int64_t block = kGemvBlock, chunk = plan.chunk_bytes / static_cast<int64_t>(sizeof(w_t));  // elements of K
    const int64_t group_sums = M * kGemvBlock * kVec;  // part's elements for one block
    for (int64_t g0 = i0; g0 < i1; g0 += kChunkBlocks) {
      const int64_t g1 = std::min(i1, g0 + kChunkBlocks);
      std::fill(part, part + kChunkBlocks * group_sums, acc_t(0));
      for (int64_t c0 = 0; c0 < K; c0 += chunk)
        for (int64_t i = g0; i < g1; ++i) {
          const int64_t n = i * block;
          dot<true>(n, std::min(block, N - n), 1, c0, std::min(chunk, K - c0), chunk_ahead(i, g1 - g0, c0),
                    part + (i - g0) * group_sums);
        }
      for (int64_t i = g0; i < g1; ++i)
        store<true>(i * block, std::min(block, N - i * block), 1, part + (i - g0) * group_sums);
    }
  }

  // The prefetch distance of block i's chunk from c0 in a group of `blocks` blocks: each row reads on into the same
  // row of the next group, so the lines kChunkAhead bytes on along the row, and near the row's end those as far into
  // the next group's row (when that is a whole group; the half-way requests of prefetch_line land half a group on
  // there, where they are wasted).
  int64_t chunk_ahead(int64_t i, int64_t blocks, int64_t c0) const {
    const bool next_group = (i + blocks + 1) * kGemvBlock <= N;
    const bool along = c0 * static_cast<int64_t>(sizeof(w_t)) + kChunkAhead + plan.chunk_bytes <= plan.row_bytes;
    return along ? kChunkAhead : next_group ? kChunkAhead + (blocks * kGemvBlock - 1) * plan.row_bytes : 0;
  }
#endif

  // Blocks [i0, i1) one after the other, the next one coming into L1 while this one is computed, a line of it as each
  // line of this one is read (the dot blocks' prefetch), when the next is a whole block of at most kPrefetchBytes.
  void read_blocks(int64_t i0, int64_t i1, acc_t* part) const {
    const int64_t block = kGemvBlock;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i * block, nb = std::min(block, N - n);
      const bool spread = plan.block_bytes <= kPrefetchBytes && n + 2 * block <= N;
      const int64_t ahead = spread ? plan.block_bytes : 0;
      dot<false>(n, nb, 1, 0, K, ahead, part);
      store<false>(n, nb, 1, part);
    }
  }
};

// out [M, N] = (x [M, K] @ w [N, K]^T) * scale + bias, every array contiguous; scale and bias may be nullptr (1 and 0).
// x, bias and out are io_t (float32, or bfloat16/float16 that is widened to acc_t and rounded back once at the end).
// x_quant_bits (int8 weights, float32 x; only where has_int_dot_products(), as int8_linear's glue decides): 16 or 8, x
// quantized per row to that many bits for integer dot products; 0, x as it is.
// The steps: plan_gemv decides the path, GemvRows prepares x (widened or quantized) and runs the blocks of weight
// rows over all threads.
template <typename acc_t, typename w_t, typename io_t>
void gemv_rows(int64_t M, int64_t N, int64_t K, const io_t* x, const w_t* w, const acc_t* scale, const io_t* bias,
               io_t* out, int64_t x_quant_bits) {
  GemvRows<acc_t, w_t, io_t>(M, N, K, x, w, scale, bias, out, x_quant_bits).run();
}

}  // namespace CPU_CAPABILITY
}  // namespace pytransformer::cpu
