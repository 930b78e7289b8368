#pragma once
// gemv_rows: the few-rows (decoding) product of the linear layers, out [M, N] = (x [M, K] @ w [N, K]^T) * scale [N] +
// bias [N], shared by linear (float32, bfloat16, float16 x and weights) and int8_linear (int8 weights with scales). It
// is weight streaming: M is small, so the time is that of reading w once from memory. The output features are split
// over all threads (at::parallel_for, each thread a contiguous range of weight rows). With AVX-512 and an x of at most
// 32 KiB (48 for up to 4 rows), a thread reads its range as two sequential streams, its first half and its second half,
// a row of each at a time; otherwise in blocks of 4 (or 2) rows, the next block prefetched. The weight rows are dotted
// with all M rows of x by dot_rows (blocks of up to 4 weight rows by up to kDotCols rows of x; with AVX-512, 8 rows of
// x at once over 2 weight rows), widening narrow weights as they are loaded, by AVX-512 BF16 dot products on
// bfloat16, or by AVX-512 VNNI integer dot products on int8 weights and x quantized to 16 or 8 bits (both 8 rows of x
// at once over 2 weight rows), so each weight row comes from memory once and from cache for the later blocks of x rows.
// With AVX-512, an x too large to stay in L1 goes by in chunks of K, each over two blocks at a time. Sums are per
// vector lane over K (or over the chunks), then across lanes (the order of a blocked GEMM). Compiled into each
// including kernel file's ISA level (namespace CPU_CAPABILITY, see isa.h).
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "dot_rows.h"
#include "isa.h"

namespace pytransformer::cpu {
inline namespace CPU_CAPABILITY {

constexpr int64_t kGemvBlock = 4;  // the most output features per work item (the weight rows dot_rows takes at once)
constexpr int64_t kPrefetchBytes = int64_t(64) << 10;  // the most weight bytes of a block prefetched
constexpr int64_t kStreamAhead = 4096;                  // bytes prefetched ahead of each of two streams
constexpr int64_t kChunkXBytes = int64_t(32) << 10;    // x above this goes by in chunks of K (gemv_rows)
constexpr int64_t kChunkBytes = 384;                    // bytes of a weight row a chunk of K covers
constexpr int64_t kChunkBytesFew = 256;                 // the same for up to 4 rows of x
constexpr int64_t kChunkBytesInt = 768;                 // the same for int8 weights with VNNI (any rows of x)
constexpr int64_t kChunkBlocks = 2;                     // blocks a chunk of x is used for before the next
constexpr int64_t kChunkAhead = 1152;                   // bytes prefetched ahead along each row of a chunked group
constexpr int64_t kL1Bytes = int64_t(48) << 10;        // a core's L1 data cache (Zen 4: 32 KiB, Zen 5 and Intel: 48)

// Asks for rows [n, n + count) of w [N, K] (those that exist) to be brought into L1, a line at a time, when they are at
// most kPrefetchBytes: short rows are short streams that the hardware prefetcher barely starts following before they
// end (measured, one thread, GPT-2's K = 768: int8 12 -> 32 GB/s, bfloat16 19 -> 30, float32 27 -> 35), and blocks of
// rows of K = 3072 gained too (2 threads: float32 199 -> 163 us, bfloat16 128 -> 106 us at N = 768), while much larger
// blocks would evict each other from L1 and are long streams that the hardware follows by itself.
// Always inlined: GCC counts a prefetch as free of side effects, so it deletes a call to a function that only
// prefetches (GCC 12 did, in linear's kernel files), while a prefetch inside a loop that stores is kept.
template <typename w_t>
__attribute__((always_inline)) inline void prefetch_rows(const w_t* w, int64_t K, int64_t N, int64_t n, int64_t count) {
  if (n >= N || count * K * static_cast<int64_t>(sizeof(w_t)) > kPrefetchBytes) return;
  const char* p = reinterpret_cast<const char*>(w + n * K);
  const char* end = reinterpret_cast<const char*>(w + std::min(N, n + count) * K);
  for (; p < end; p += 64) __builtin_prefetch(p, 0, 3);
}

#if defined(CPU_CAPABILITY_AVX512)
// The exact sum of the 16 int32 lanes of v.
__attribute__((always_inline)) inline int64_t sum_lanes(__m512i v) {
  return _mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(v)),
                                                  _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(v, 1))));
}

// Lane c of the result: the exact sum of the 16 int32 lanes of v[c], for 8 vectors, in int64 (the lanes widened and
// added in pairs, then a tree of unpacks and 128-bit shuffles): 53 instructions, where sum_lanes takes about 10 a vector.
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
// A constant full mask but in the last step: a mask computed at every step cost 1 row at K 4096-11008 5-20 points of
// the read stream's speed (bfloat16, cold weights, alternating processes), and 4 rows at K 3072 7% of the time with
// the weights cached. Two loops, with and without ahead, keep a test out of the loop.
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
// One instruction takes 32 weights where widening them to float32 takes three per 16 (GPT-2's LM head, 1 row, 2
// threads, cold: best of 4 runs 1.23 -> 0.99 ms).
// Small blocks keep two sets of sums, which take alternate steps (kTwoSumSets in dot_rows.h). The loops over r and c
// are unrolled by pragma: GCC 12 at -O3 otherwise unrolled them too late to keep the sums in registers and stored every
// one to the stack at every step (seen in the object code; N 3072 K 768, 8 rows: 135 -> 72 us). R x C up to 2 x 8 or
// 4 x 4: the sums, C rows of x and a weight vector in at most 25 of the 32 registers.
// fused (8 rows of x, not kLanes): fused->blocks blocks of R weight rows in one call, each row's 8 sums reduced
// together and written to out (store_sums_8), as in dot_block.
template <int R, int C, bool kLanes>
void dot_block_bf16(const c10::BFloat16* a_first, int64_t a_step, const c10::BFloat16* b, int64_t b_step, int64_t n,
                    float* part, int64_t part_m, int64_t prefetch, const Out8<c10::BFloat16>* fused = nullptr) {
  constexpr bool kTwoSets = kTwoSumSets<R, C>;
  const int64_t blocks = !kLanes && C == 8 && fused ? fused->blocks : 1;
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
        else part[c * part_m + r] = _mm512_reduce_add_ps(sum);
      }
  }
}

// The largest magnitude of x quantized to xq_t for a K: 32767 (int16_t) or 127 (int8_t), or less where an int32 lane
// of dot_block_i8 could overflow. With 16 bits a lane takes 2 of every 32 elements of K against weights down to -128
// (K over 8192: 11008 gives 24385); with 8 bits, 4 of every 64 against weights shifted to 0..255 (K over a million).
template <typename xq_t>
inline int32_t x_quant_max(int64_t K) {
  constexpr int64_t kPerLane = 4 / sizeof(xq_t), kStep = 64 / sizeof(xq_t), kWeightMax = sizeof(xq_t) == 2 ? 128 : 255;
  return static_cast<int32_t>(std::min<int64_t>(std::numeric_limits<xq_t>::max(),
                                                INT32_MAX / (kWeightMax * kPerLane *
                                                             std::max<int64_t>(1, (K + kStep - 1) / kStep))));
}

// x [M, K] float32 quantized per row for dot_block_i8 to xq_t (int16_t or int8_t): q[m, k] = round(x[m, k] / scale[m])
// (to nearest, ties to even) with scale[m] = max_k |x[m, k]| / x_quant_max<xq_t>(K), so |x - q * scale| <= scale / 2;
// offset[m] = -128 * sum_k q[m, k] for int8_t (the term that dot_block_i8's weights shifted by 128 add), 0 for
// int16_t. A row with an inf or NaN gets scale NaN (its outputs are NaN); a row of zeros scale 0. A row whose largest
// magnitude is below 2^-100 is scaled by 2^100 first (exact), so that 1 / scale stays finite.
template <typename xq_t>
inline void quantize_rows(int64_t M, int64_t K, const float* x, xq_t* q, float* scale, int64_t* offset) {
  const float q_max = static_cast<float>(x_quant_max<xq_t>(K));
  const auto tail = [K](int64_t k) {  // the elements of K from k in a vector of 16
    return K - k >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (K - k)) - 1);
  };
  for (int64_t m = 0; m < M; ++m) {
    const float* xr = x + m * K;
    xq_t* qr = q + m * K;
    offset[m] = 0;
    // the largest |x| as bits: integer order is magnitude order, with inf and NaN above every finite value
    __m512i top = _mm512_setzero_si512();
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = tail(k);
      const __m512i bits = _mm512_and_si512(_mm512_maskz_loadu_epi32(mask, xr + k), _mm512_set1_epi32(0x7FFFFFFF));
      top = _mm512_max_epi32(top, bits);
    }
    const int32_t top_bits = _mm512_reduce_max_epi32(top);
    float amax;
    std::memcpy(&amax, &top_bits, sizeof amax);
    if (top_bits >= 0x7F800000) {  // inf or NaN
      scale[m] = std::numeric_limits<float>::quiet_NaN();
      std::fill(qr, qr + K, xq_t(0));
      continue;
    }
    const float pre = amax < 0x1p-100f ? 0x1p100f : 1.0f;
    const float big = amax * pre;
    scale[m] = big / q_max / pre;
    const __m512 mul = _mm512_set1_ps(big > 0 ? q_max / big : 0.0f);
    const __m512 pre_v = _mm512_set1_ps(pre);
    __m512i sum = _mm512_setzero_si512();  // of q, at most 127 * K a lane
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 mask = tail(k);
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
// fused (8 rows of x, not kLanes): fused->blocks blocks of R weight rows in one call, each row's 8 sums reduced together
// (sum_lanes_8) and written to out scaled (Out8) instead of to part: per pair of rows of K 768 the sums of lanes, the
// caller's store and the call took as many instructions as the dot products.
template <int R, int C, bool kLanes, typename xq_t>
__attribute__((noinline)) void dot_block_i8(const int8_t* a_first, int64_t a_step, const xq_t* b, int64_t b_step,
                                            int64_t n, const int64_t* b_offset, float* part, int64_t part_m,
                                            int64_t prefetch, const Out8<float>* fused = nullptr) {
  constexpr bool kBytes = std::is_same_v<xq_t, int8_t>;
  constexpr int kWidth = 64 / sizeof(xq_t);  // elements of K a step: a vector of x
  constexpr bool kTwoSets = kTwoSumSets<R, C>;
  const int64_t blocks = !kLanes && C == 8 && fused ? fused->blocks : 1;
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
        else part[c * part_m + r] = static_cast<float>(sum_lanes(sum) + b_offset[c]);
      }
  }
}
#pragma GCC pop_options
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

// out [M, N] = (x [M, K] @ w [N, K]^T) * scale + bias, every array contiguous; scale and bias may be nullptr (1 and 0).
// x, bias and out are io_t (float32, or bfloat16/float16 that is widened to acc_t and rounded back once at the end).
// x_8_bits (int8 weights, float32 x, with VNNI): x quantized to 8 bits instead of 16 (int8_linear's x_bits = 8).
template <typename acc_t, typename w_t, typename io_t>
void gemv_rows(int64_t M, int64_t N, int64_t K, const io_t* x, const w_t* w, const acc_t* scale, const io_t* bias,
               io_t* out, bool x_8_bits = false) {
  // bfloat16 weights and x on a processor with AVX-512 BF16 dot products: those, on x as it is.
  bool bf16_dots = false;
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (std::is_same_v<w_t, c10::BFloat16> && std::is_same_v<io_t, c10::BFloat16>)
    bf16_dots = has_avx512_bf16();
#endif
  // int8 weights and float32 x on a processor with AVX-512 VNNI: x quantized per row to 16 bits or 8 (x_int16 or
  // x_int8, times x_scale), its products with the weights summed exactly in integers (dot_block_i8), so that a row's
  // result does not depend on M or on the path. Widened to float32 instead, 8 rows took 32 fmas a weight line
  // (17.6-18.9 cycles measured, weights in cache) and were bound by them. 2 threads, cold weights, single calls in
  // turns with the read of the same bytes, at 31-44 GB/s, fraction of the read, float32 -> VNNI: 8 rows, N 2304-3072 K
  // 768 55-56% -> 75-78, N 50257 K 768 47 -> 66, N 768 K 3072 51 -> 58, K 4096-11008 52-58 -> 58-67; 4 rows N 3072 K
  // 768 82 -> 96; 1 row N 4096 K 11008 91 -> 95. Weights in cache, 1 thread, 8 rows K 2048: 21.5 -> 13.7 cycles a line
  // (8 ideal; the block alone, 11). 8 bits instead (x_8_bits): vpdpbusd, 8 a line for 8 rows; on a 2-core Zen 4 at
  // 2.6 GHz, weights in cache, 1 thread, 8 rows K 2048 26 -> 13 cycles a line; 2 threads, cold weights, 8 rows,
  // 0.56-0.97x the time on 9 of 10 layer shapes (GPT-2's 768 x 768 1.2x), 36-57% of the copy bandwidth against 27-52.
  // (kIntTypes: whether the types allow it, so that the other types' code has no test of int_dots)
  constexpr bool kIntTypes = std::is_same_v<w_t, int8_t> && std::is_same_v<io_t, float>;
  bool int_dots = false;
  std::vector<int16_t> x_int16;
  std::vector<int8_t> x_int8;
  std::vector<float> x_scale;
  std::vector<int64_t> x_offset;
#if defined(CPU_CAPABILITY_AVX512)
  if constexpr (kIntTypes) {
    int_dots = has_avx512_vnni();
    if (int_dots) {
      x_scale.resize(M);
      x_offset.resize(M);
      if (x_8_bits) {
        x_int8.resize(M * K);
        quantize_rows(M, K, x, x_int8.data(), x_scale.data(), x_offset.data());
      } else {
        x_int16.resize(M * K);
        quantize_rows(M, K, x, x_int16.data(), x_scale.data(), x_offset.data());
      }
    }
  }
#endif
  std::vector<acc_t> x_wide;  // otherwise x in acc_t when it is narrower: M * K elements, one weight row or a few
  const acc_t* xa = nullptr;
  if constexpr (std::is_same_v<io_t, acc_t>) {
    xa = x;
  } else if (!bf16_dots) {
    x_wide.assign(x, x + M * K);
    xa = x_wide.data();
  }
  const int64_t x_bytes =
      M * K * (int_dots && x_8_bits ? 1 : bf16_dots || int_dots ? 2 : static_cast<int64_t>(sizeof(acc_t)));
  // x of more than kChunkXBytes is taken in chunks of K (chunk_bytes of each weight row), each over kChunkBlocks blocks
  // whose sums are kept as vectors (lanes) in between, so that a chunk of x is reused from L1 while the weights stream
  // past (the prefetch: see the loop). 2 threads, cold weights, A/B in one process, fraction of a read of the same
  // bytes: bfloat16 (AVX-512 BF16), 8 rows, K 3072 74% -> 82%, K 4096 70 -> 78, K 11008 34 -> 73 (N 4096); 3 and 4 rows
  // at K 11008 61 -> 85 and 58 -> 73; float32, 8 rows, K 2048-4096 70-73 -> 71-79, K 11008 73 -> 77. Groups of 2 blocks
  // did best of 1-4, and chunks of 384 bytes of each weight row (96 float32, 192 bfloat16) of 256-2048 bytes: from 512
  // elements (the first choice), 8 rows: float32 K 2048-11008 76-78% -> 84-91, bfloat16 K 3072-11008 75-78 -> 82-91;
  // bfloat16 3 and 4 rows K 11008 67-84 -> 89-95; float32 5 rows K 4096 77 -> 81-89 (smaller chunks lost again: 256
  // bytes, bfloat16 8 rows 62-66%). Where it lost, it is not used: float32 up to 4 rows (one pass over a block; K
  // 3072-11008 83-89% -> 77-84), int8 widened to float32 (compute-bound, K 11008 8 rows 56 -> 47; with VNNI 3 and 4
  // rows of K 11008 gained, 79-80% -> 86-87, and 8 rows of K 3072-11008 did the same either way), x of 32 KiB or less
  // (bfloat16 8 rows K 2048 1.06x the time, float32 K 768 1.1x), more than 8 rows (K 768, 16 and 32 rows: float32 1.3x,
  // bfloat16 1.4x). Measured on AVX-512 only, so only there. A chunk's sums loaded and stored cost as much as its dot
  // products: weights in cache, one thread, float32 8 rows, 8.4-11.4 cycles a line against 4.5 over whole rows.
  // Segments of K over the two streams instead (x segments of 16 KiB, 2 KiB of each weight row, the sums of 64 pairs of
  // rows kept between segments) did half the work a line but read memory worse, median of 14 A/B runs at 42-52 GB/s,
  // fraction of the read stream: float32 8 rows K 2048-11008 79-82% against 87-89, bfloat16 77-80 against 86-90; only
  // at 70-80 GB/s, where the chunks' work bounds them, did segments win (float32 71-73% against 47-57). One call over a
  // group's 4 pairs of weight rows, instead of a call a pair, took a third less time a line in cache and changed
  // nothing cold (float32 8 rows K 2048-11008, 6 A/B runs at 50-55 GB/s: 74-91% of the read stream either way). Those
  // two were measured with the prefetch of the next group's same chunk, which the prefetch along the rows replaced.
  bool chunked = false;
#if defined(CPU_CAPABILITY_AVX512)
  chunked = x_bytes > kChunkXBytes && M <= 8 && (bf16_dots || int_dots ? M >= 3 : std::is_same_v<w_t, float> && M > 4);
#endif
  // Otherwise with AVX-512, while x is at most kChunkXBytes (or kL1Bytes for up to 4 rows of x), each thread reads its
  // range of weight rows as two sequential streams, a row of each at a time (kStreamAhead bytes prefetched ahead of
  // each, see prefetch_line). Blocks of rows read together, instead, make as many short streams as a block has rows. 2
  // threads, cold weights, A/B in one process, fraction of a read of the same bytes, blocks (as below) -> two streams:
  // 8 rows of x, K 768: float32 75-80% -> 84-90, bfloat16 78-81 -> 95-99; 3 to 5 rows: float32 71-86 -> 93-103,
  // bfloat16 68-87 -> 93-101, float16 4 rows 72-75 -> 91; 1 row, float32 K 3072 86-87 -> 101-109; x of 32-48 KiB: int8
  // 1 row K 11008 82-86 -> 94-95, 2 rows K 5120 60 -> 70, float32 2 rows K 6144 80 -> 88, 4 rows K 2560-3072 79 ->
  // 83-84, but with more rows, which go over x in several passes, lost (float32 16 rows K 768 78 -> 60%, float16 12
  // rows 52 -> 41). Four streams (the rows of a block from the quarters of the range) did worse than two (float32 4
  // rows 94 -> 78%). With AVX2's 8 lanes, two rows at a time lost to blocks of 4 (int8 1 and 4 rows: 64-68% -> 29-44,
  // 34-38 -> 14-20), so there, and for a larger x, the weights go in blocks. The next block comes into L1 while this
  // one is computed:
  // - A burst: the whole next block at the start of this one (prefetch_rows), which keeps the most reads in flight
  //   (1 row: bfloat16 N 3072 K 768 103 us against 154 spread out; 2 rows, float32 227 against 249). Rows of narrow
  //   weights of 3 KiB or more then go in blocks of 2 (1 row, N 768: bfloat16 K 3072 129 -> 110 us, int8 75 -> 63;
  //   float32 rows and rows of K = 768 gained nothing). For 1 or 2 rows of x while this block, the next and x fit in
  //   L1 (int8, with four times the work per byte of float32, in half of it).
  // - Spread: a line of the next block as each line of this one is read (dot_rows' prefetch), in blocks of 4; with no
  //   software prefetch for blocks over kPrefetchBytes. From 3 rows of x, the burst made the dot products wait for
  //   memory instead of overlapping it (float32 N 2304 K 768, 8 rows: 263 -> 189 us; N 768 K 3072, 4 rows: bfloat16
  //   181 -> 128 us, int8 104 -> 68; 3 rows, float32 N 3072 K 768 255 -> 232); with 1 or 2 rows and long rows, the
  //   burst evicted the block being read, or (int8) waited as long (fraction of a read of the same bytes, burst ->
  //   spread: 1 row, float32 K 2048-3072 74-95% -> 79-107; bfloat16 N 4096 K 11008 85 -> 97-99; int8 K 4096 73-79
  //   -> 81-85, K 11008 73 -> 83-86; 2 rows, int8 K 2048-11008 60-70 -> 81-86, float32 K 3072-4096 63-89 -> 75-96;
  //   while int8 K 2048-3072 at 1 row, 24 KiB, kept 94-100% with the burst against 79-88 spread, and bfloat16 K 4096,
  //   40 KiB, 88-91 against 85-86).
  bool streams = false;
#if defined(CPU_CAPABILITY_AVX512)
  streams = !chunked && x_bytes <= (M <= 4 ? kL1Bytes : kChunkXBytes);
#endif
  const int64_t row_bytes = K * static_cast<int64_t>(sizeof(w_t));
  const int64_t burst_block = sizeof(w_t) <= 2 && row_bytes >= 3072 ? 2 : kGemvBlock;
  const int64_t burst_bytes = 2 * burst_block * row_bytes + x_bytes;
  const bool burst = !streams && M <= 2 && burst_bytes <= (sizeof(w_t) == 1 ? kL1Bytes / 2 : kL1Bytes);
  const int64_t block = burst ? burst_block : kGemvBlock;
  const int64_t items = (N + block - 1) / block;
  const int64_t block_bytes = block * K * static_cast<int64_t>(sizeof(w_t));
  // ~32 KiB of weight per task at least: fewer tasks than that cost more in scheduling than they save.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, block_bytes));
  // Chunks of 256 bytes for up to 4 rows of x (bfloat16 is chunked there), single calls in turns with F.linear and
  // the read, three runs at 43-48 GB/s, fraction of the read against 384: K 11008 4 rows 79-80% -> 87-88, 3 rows 91-92
  // -> 94-95, K 6144 4 rows 71-75 -> 78-81; with 5-8 rows 256 bytes lost (float32 6 rows K 4096 85-89 -> 78-83,
  // bfloat16 6 rows K 11008 93-97 -> 86-92), and so did 576 and 768 (float32 8 rows K 2048-11008 3-12 points); 768
  // with the prefetch along the rows twice as far (2304 bytes) too, though it took 15-20% less time in cache (8 rows,
  // float32 and bfloat16, K 3072-11008, 3 A/B runs at about 45 GB/s: 75-80% of the read against 86-97%).
  // Integer dot products take 768 bytes (768 elements of K) at any row count: they are compute-bound in chunks, and a
  // chunk's sums loaded and stored are fewer a line. The kernel alone, called from C++, 2 threads, median of 3-5 A/B
  // runs, 384 -> 768: weights in cache, 8 rows N 768 K 3072 77.8 -> 68.1 us; cold, K 11008 N 4096, 8 rows 1550 ->
  // 1341 us, 8-bit x 1584 -> 1171, 4 rows 986 -> 889, 6 rows 8-bit 1020 -> 870; 1024 bytes did the same as 768, 576
  // and 1536 worse. (The chunks' sums of 8 rows of x are written as dot_block_i8 writes whole rows: 68.1 -> 64.8 us.)
  const int64_t chunk_bytes = kIntTypes && int_dots ? kChunkBytesInt : M <= 4 ? kChunkBytesFew : kChunkBytes;
  const int64_t chunk = chunk_bytes / static_cast<int64_t>(sizeof(w_t));  // elements of K a chunk
  constexpr int64_t kVec = at::vec::Vectorized<acc_t>::size();
  // Integer dot products over whole rows of K for 8 (or 16) rows of x: dot_block_i8 reduces a weight row's 8 sums at
  // once and writes the outputs itself (Out8), instead of a sum of lanes each and the store below; for 8 rows, all the
  // pairs of a thread's two streams in one call. Weights in cache (L2), N 2304 K 768, 8 rows, the kernel alone called
  // from C++, 3 A/B runs: one thread, 16-bit x 91.5-94.0 -> 69.3-71.1 us, 8-bit 70.1-72.1 -> 49.2-49.4; two threads
  // 47.7-51.5 -> 37.1-38.7 and 37.0-41.6 -> 26.3-28.7. In chunks of K (8 rows: chunked takes at most 8) the store
  // does the same from the lane sums (store_i8_8).
  // The same for float32 x, bias and out where 8 rows of x go to dot_block (whole rows or chunks). 2 threads, K 768,
  // 8 rows, 6 A/B runs (alternating processes), medians: weights in cache (L2), N 768-3072 32.7-119.3 -> 27.7-100.9
  // us; cold, at 40-50 GB/s, fraction of the read timed in turns 82.5-92.5% -> 84.5-92.5 (memory-bound there).
  // The same for bfloat16 x, bias and out with AVX-512 BF16 dot products (dot_block_bf16, whole rows or chunks), where
  // 16 sums of lanes and the store took about a third of a pair of rows' instructions at K 768: 2 threads, 8 rows,
  // 3 A/B runs (alternating processes), weights in cache (L2), 8.4-8.6 -> 7.1-7.2 cycles a line at K 768, 7.1-7.2 ->
  // 6.3-6.5 at K 2048 (chunks of K 3072 unchanged, 11.9); cold at about 45 GB/s, memory-bound either way (fraction of
  // the read timed in turns, K 768 the same, K 2048 85% -> 88-89); GPT-2 bfloat16 greedy, batch 8: 630-637 ->
  // 653-662 tokens/s.
  constexpr bool kFloatIo = std::is_same_v<io_t, float> && std::is_same_v<acc_t, float>;
  constexpr bool kFusedIo = kFloatIo || (std::is_same_v<io_t, c10::BFloat16> && std::is_same_v<acc_t, float>);
  const bool fused_i8 = kIntTypes && int_dots && M % 8 == 0;
  const bool fused_f32 = kFloatIo && !int_dots && M % 8 == 0 && (chunked || streams);
  const bool fused_bf16 = bf16_dots && M % 8 == 0 && (chunked || streams);
  const bool fused = fused_i8 || fused_f32 || fused_bf16;
  // Where the 8 rows of x from m write the outputs o0 + i + r * o_step of block i (Out8; float32 or bfloat16 out)
  const auto out8 = [&](int64_t m, int64_t o0, int64_t o_step, int64_t blocks) {
    Out8<io_t> to{};
    if constexpr (kFusedIo)
      to = {out + m * N, N, o0, o_step, blocks, int_dots ? x_scale.data() + m : nullptr, scale, bias};
    return to;
  };
  at::parallel_for(0, items, grain, [&](int64_t i0, int64_t i1) {
    // The sums [M, 4] of a block, or with x in chunks those of a group of blocks, each as kVec partial sums.
    std::vector<acc_t> part(chunked ? kChunkBlocks * M * kGemvBlock * kVec : M * kGemvBlock);
    // The dot products of the nb weight rows n + r * step with all M rows of x over elements [c0, c0 + cn) into sums.
    const auto dot = [&](auto lanes, int64_t n, int64_t nb, int64_t step, int64_t c0, int64_t cn, int64_t ahead,
                         acc_t* sums, int64_t blocks = 1) {
      constexpr bool kLanes = decltype(lanes)::value;
      const w_t* rows = w + n * K + c0;
#if defined(CPU_CAPABILITY_AVX512)
      constexpr int64_t kSum = kLanes ? kVec : 1;  // a sum's size in acc_t
      if constexpr (std::is_same_v<w_t, c10::BFloat16> && std::is_same_v<io_t, c10::BFloat16>) {
        // 8 rows of x at a time in one pass over 2 weight rows at a time, each weight line used by all 8 rows as it
        // arrives (with more rows the next 8 reread the block's weights from cache); the rest in blocks of 4 x 4
        // weight rows, or 4 x 2 over the two streams' pair (2 threads, cold weights, 8 rows, A/B in one process,
        // median of 21: N 3072 K 768 and N 50257 K 768 0.90-0.93x the time of two passes over 4 x 4 blocks, N 768
        // K 3072 0.94-0.97x)
        if (bf16_dots)
          return for_x_blocks(M, nb, [&](auto R, auto C, int64_t r, int64_t m) {
            const auto to_out = out8(m, n + r * step, step, blocks);
            dot_block_bf16<decltype(R)::value, decltype(C)::value, kLanes>(
                rows + r * step * K, step * K, x + m * K + c0, K, cn, sums + (m * kGemvBlock + r) * kSum, kGemvBlock,
                ahead, fused_out<c10::BFloat16>(fused_bf16 && !kLanes, to_out));
          });
      }
      if constexpr (kIntTypes) {
        if (int_dots)
          return for_x_blocks(M, nb, [&](auto R, auto C, int64_t r, int64_t m) {
            const auto to_out = out8(m, n + r * step, step, blocks);
            const auto block = [&](const auto* xq) {
              dot_block_i8<decltype(R)::value, decltype(C)::value, kLanes>(
                  rows + r * step * K, step * K, xq + m * K + c0, K, cn, x_offset.data() + m,
                  sums + (m * kGemvBlock + r) * kSum, kGemvBlock, ahead, fused_out<float>(fused_i8 && !kLanes, to_out));
            };
            x_8_bits ? block(x_int8.data()) : block(x_int16.data());
          });
      }
      // The same blocks in the other dtypes (16 sums and the 8 x vectors in registers, each weight vector loaded and
      // widened once for all 8, where 4 x 4 blocks take two passes), while x (or its chunk) stays in L1: an x read
      // from L2, 8 vectors for 2 weight vectors, is slower (int8, 8 rows, K 3072-11008 46-56% -> 33-38% of the read
      // stream). 2 threads, cold weights, A/B in one process, fraction of the read stream: float32 8 rows N 2304-3072
      // K 768 81-82% -> 83-87%, N 768 K 3072 82 -> 84; float16 K 768 64-65 -> 75-77; int8 K 768 41-44 -> 48-50;
      // weights in cache, 1 thread: float32 K 768 8% less time.
      if (M >= 8 && (chunked || streams))
        return for_x_blocks(M, nb, [&](auto R, auto C, int64_t r, int64_t m) {
          const auto to_out = out8(m, n + r * step, step, blocks);
          dot_block<decltype(R)::value, decltype(C)::value, kLanes>(rows + r * step * K, step * K, xa + m * K + c0, K,
                                                                    cn, sums + (m * kGemvBlock + r) * kSum, 1,
                                                                    kGemvBlock, ahead,
                                                                    fused_out<acc_t>(fused_f32 && !kLanes, to_out));
        });
#endif
      dot_rows<kLanes>(rows, step * K, nb, xa + c0, K, M, cn, sums, 1, kGemvBlock, ahead);
    };
    // out for the nb weight rows n + r * step from their sums (written by the dot block itself where fused)
    const auto store = [&](auto lanes, int64_t n, int64_t nb, int64_t step, const acc_t* sums) {
      if (fused && !decltype(lanes)::value) return;
#if defined(CPU_CAPABILITY_AVX512)
      if constexpr (kFusedIo && decltype(lanes)::value)
        if (fused) {  // the lanes of 8 rows of x (in chunks): as the dot blocks write them over whole rows
          const auto to = out8(0, 0, 0, 1);
          for (int64_t r = 0; r < nb; ++r) {
            const acc_t* lanes_r = sums + r * kVec;  // row m's lanes at lanes_r + m * kGemvBlock * kVec
            if constexpr (kIntTypes) {
              if (int_dots) {  // int32 lanes (dot_block_i8)
                __m512i v[8];
                for (int m = 0; m < 8; ++m) v[m] = _mm512_loadu_si512(lanes_r + m * kGemvBlock * kVec);
                store_i8_8(v, x_offset.data(), to, n + r * step);
                continue;
              }
            }
            __m512 v[8];
            for (int m = 0; m < 8; ++m) v[m] = _mm512_loadu_ps(lanes_r + m * kGemvBlock * kVec);
            store_sums_8(v, to, n + r * step);
          }
          return;
        }
#endif
      for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < nb; ++r) {
          acc_t dot_mr;
          if constexpr (decltype(lanes)::value) {
            using Vec = at::vec::Vectorized<acc_t>;
            const acc_t* lanes_mr = sums + (m * kGemvBlock + r) * kVec;
#if defined(CPU_CAPABILITY_AVX512)
            if (kIntTypes && int_dots)  // int32 lanes (dot_block_i8), summed exactly
              dot_mr = static_cast<acc_t>(sum_lanes(_mm512_loadu_si512(lanes_mr)) + x_offset[m]);
            else
#endif
              dot_mr = at::vec::vec_reduce_all<acc_t>(std::plus<Vec>(), Vec::loadu(lanes_mr));
          } else {
            dot_mr = sums[m * kGemvBlock + r];
          }
          const int64_t o = n + r * step;
          if (kIntTypes && int_dots) dot_mr *= x_scale[m];
          out[m * N + o] = static_cast<io_t>(dot_mr * (scale ? scale[o] : acc_t(1)) +
                                             (bias ? static_cast<acc_t>(bias[o]) : acc_t(0)));
        }
    };
    if (streams) {
      // rows r0 + j and r0 + h + j together, then the last one of an odd count alone (the prefetches of the last rows
      // reach up to kStreamAhead past the range or w: a prefetch never faults)
      const int64_t r0 = i0 * block, r1 = std::min(N, i1 * block), h = (r1 - r0) / 2;
      if (fused && M == 8 && h > 0)  // all h pairs in one call (Out8::blocks)
        dot(std::false_type{}, r0, 2, h, 0, K, kStreamAhead, part.data(), h);
      else
        for (int64_t j = 0; j < h; ++j) {
          dot(std::false_type{}, r0 + j, 2, h, 0, K, kStreamAhead, part.data());
          store(std::false_type{}, r0 + j, 2, h, part.data());
        }
      if (r0 + 2 * h < r1) {
        dot(std::false_type{}, r1 - 1, 1, 1, 0, K, 0, part.data());
        store(std::false_type{}, r1 - 1, 1, 1, part.data());
      }
      return;
    }
    if (chunked) {
      for (int64_t g0 = i0; g0 < i1; g0 += kChunkBlocks) {
        const int64_t g1 = std::min(i1, g0 + kChunkBlocks);
        std::fill(part.begin(), part.end(), acc_t(0));
        for (int64_t c0 = 0; c0 < K; c0 += chunk)
          for (int64_t i = g0; i < g1; ++i) {
            const int64_t n = i * block;
            // Each row of a group reads on into the same row of the next group: the lines kChunkAhead bytes on along
            // the row are prefetched (and, by prefetch_line, half as far), near the row's end those as far into the
            // next group's row (when that is a whole group; the half-way requests of those calls land half a group on,
            // where they are wasted). Against the next group's same chunk (the first choice), 2 threads, cold weights,
            // 8 rows, A/B in one process, single calls in turns with F.linear and the read of the same bytes (the
            // benchmark's way), three runs at 39-51 GB/s, fraction of the read: float32 K 2048-11008 71-82% -> 77-94,
            // bfloat16 K 3072 and 11008 75-91 -> 85-93, float32 6 rows K 4096 81-82 -> 88-89; at 62-84 GB/s float32
            // 55-61 -> 62-70, bfloat16 55-74 -> 68-84 (of 768-6144 bytes ahead, 1152 did best; the next group's first
            // 1152 bytes a row all at once near the row's end, instead, lost 2-10 points of that).
            const bool next_group = (i + (g1 - g0) + 1) * block <= N;
            const bool along = c0 * static_cast<int64_t>(sizeof(w_t)) + kChunkAhead + chunk_bytes <= row_bytes;
            const int64_t ahead = along ? kChunkAhead
                                        : next_group ? kChunkAhead + ((g1 - g0) * block - 1) * row_bytes : 0;
            dot(std::true_type{}, n, std::min(block, N - n), 1, c0, std::min(chunk, K - c0), ahead,
                part.data() + (i - g0) * M * kGemvBlock * kVec);
          }
        for (int64_t i = g0; i < g1; ++i)
          store(std::true_type{}, i * block, std::min(block, N - i * block), 1,
                part.data() + (i - g0) * M * kGemvBlock * kVec);
      }
      return;
    }
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i * block, nb = std::min(block, N - n);
      if (burst) prefetch_rows(w, K, N, n + block, block);
      // spread: the next block when it is a whole one of at most kPrefetchBytes
      const int64_t ahead = !burst && block_bytes <= kPrefetchBytes && n + 2 * block <= N ? block_bytes : 0;
      dot(std::false_type{}, n, nb, 1, 0, K, ahead, part.data());
      store(std::false_type{}, n, nb, 1, part.data());
    }
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace pytransformer::cpu
