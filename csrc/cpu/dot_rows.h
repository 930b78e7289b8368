#pragma once
// dot_rows: the dot products of a block of rows with a block of other rows, each vector load serving every product
// of its row (the first rows may be stored narrower than the accumulation type: bfloat16, float16 or int8 weights,
// widened as they are loaded); for_blocks: kernels written for a fixed number of rows applied to any. Shared by the CPU
// kernels; compiled into each including file's ISA level (namespace CPU_CAPABILITY, see isa.h).
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "vec_util.h"

namespace pytransformer::cpu {
inline namespace CPU_CAPABILITY {

// Most b rows a call takes at once: the R x C accumulators (R <= 4) and C + 1 loaded vectors fit the registers.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kDotCols = 4;
#else
constexpr int kDotCols = 2;
#endif

// Whether a block of R x C sums keeps two sets of them, which take alternate vectors and are added at the end: fewer
// than 8 sums cannot hide an fma's latency (4 cycles, 2 a cycle); benchmarks/results/cpu_kernel_notes_2026-11-28.md,
// kTwoSumSets.
template <int R, int C>
constexpr bool kTwoSumSets = R * C < 8;

// Asks for the lines `ahead` and `ahead / 2` bytes on from p to be brought into L1 (a streaming reader calls it for
// each line it reads). The second request is for a line that the first, made earlier, did not bring: a prefetch is a
// hint that the processor may drop. Two requests read cold weights faster than either alone
// (cpu_kernel_notes_2026-11-28.md, prefetch_line). Always inlined, as prefetch_rows in gemv.h is.
__attribute__((always_inline)) inline void prefetch_line(const void* p, int64_t ahead) {
  __builtin_prefetch(static_cast<const char*>(p) + ahead, 0, 3);
  __builtin_prefetch(static_cast<const char*>(p) + ahead / 2, 0, 3);
}

// The count <= Vectorized<acc_t>::size() elements at p widened to acc_t, zeros past count. Full vectors of bfloat16 or
// float16 widen with at::vec's conversions and of int8 with the ISA's sign extension; tails go through a buffer.
template <typename acc_t, typename T>
inline at::vec::Vectorized<acc_t> load_widened(const T* p, int64_t count) {
  using Vec = at::vec::Vectorized<acc_t>;
  if constexpr (std::is_same_v<T, acc_t>) {
    return Vec::loadu(p, count);
  } else {
    if (count == Vec::size()) {
      if constexpr (std::is_same_v<acc_t, float> && (std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>)) {
        Vec v;
        at::vec::load_to_float(p, v);
        return v;
      }
#if defined(CPU_CAPABILITY_AVX512)
      if constexpr (std::is_same_v<acc_t, float> && std::is_same_v<T, int8_t>)
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#elif defined(CPU_CAPABILITY_AVX2)
      if constexpr (std::is_same_v<acc_t, float> && std::is_same_v<T, int8_t>)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#endif
    }
    acc_t buf[Vec::size()] = {};
    for (int64_t i = 0; i < count; ++i) buf[i] = static_cast<acc_t>(p[i]);
    return Vec::loadu(buf);
  }
}

// Where a dot block with 8 rows of x (C = 8) over whole rows of K writes its results itself, rounded in the same order
// as gemv_rows' store: out[c * n_out + o] = dot * x_scale[c] * scale[o] + bias[o] (1, 1 and 0 where null), computed in
// float32 and rounded once to T (float32 or bfloat16), for the weight row a + r * a_step of block i, o = row(i, r);
// block i's rows are block 0's i rows on (a + i * n), as the pairs of gemv_rows' two streams are.
template <typename T>
struct Out8 {
  T* out;
  int64_t n_out, o0, o_step, blocks;
  const float *x_scale, *scale;
  const T* bias;
  int64_t row(int64_t block, int r) const { return o0 + block + r * o_step; }  // the output of block's weight row r
};

#if defined(CPU_CAPABILITY_AVX512)
// out[c * n_out + o] for the 8 rows c of x from their dot products with weight row o, as Out8 says.
template <typename T>
__attribute__((always_inline)) inline void store_8(__m256 dots, const Out8<T>& to, int64_t o) {
  if (to.x_scale) dots = _mm256_mul_ps(dots, _mm256_loadu_ps(to.x_scale));
  const __m256 scaled = _mm256_mul_ps(dots, _mm256_set1_ps(to.scale ? to.scale[o] : 1.0f));
  alignas(32) float y[8];
  _mm256_store_ps(y, _mm256_add_ps(scaled, _mm256_set1_ps(to.bias ? static_cast<float>(to.bias[o]) : 0.0f)));
#pragma GCC unroll 8
  for (int c = 0; c < 8; ++c) to.out[c * to.n_out + o] = static_cast<T>(y[c]);
}

// Lane i < N of the result: the sum of the 16 lanes of v[i], for N = 8 or 16 vectors, by a tree of unpacks and 128-bit
// shuffles (N 16: 45 instructions, N 8: 24, where a sum of lanes takes about 8 a vector): each 128-bit lane's 4
// elements first, then the 4 lanes. (N 8: lanes 8-15 repeat lanes 0-7.)
template <int N>
__attribute__((always_inline)) inline __m512 sum_lanes_of(const __m512* v) {
  static_assert(N == 8 || N == 16);
  __m512 t[N / 2], u[N / 4], w[N / 8];
  // t[i], each 128-bit lane: that lane's elements 0 + 2 and 1 + 3 of v[2i] and v[2i + 1], interleaved
#pragma GCC unroll 8
  for (int i = 0; i < N / 2; ++i)
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]), _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  // u[i], each 128-bit lane: that lane's sums of v[4i], ..., v[4i + 3]
#pragma GCC unroll 4
  for (int i = 0; i < N / 4; ++i) {
    const __m512d a = _mm512_castps_pd(t[2 * i]), b = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(a, b)), _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)));
  }
  // w[i]: 128-bit lanes 0 and 1 the halves (lanes 0 + 1, 2 + 3) of u[2i], lanes 2 and 3 those of u[2i + 1]
#pragma GCC unroll 2
  for (int i = 0; i < N / 8; ++i)
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], 0xDD));
  const __m512 hi = w[N / 8 - 1];
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], hi, 0x88), _mm512_shuffle_f32x4(w[0], hi, 0xDD));
}

// out[c * n_out + o] for the 8 rows c of x from the 16 float32 lane sums v[c] of their dot products with weight row o
// (reduced together by sum_lanes_of), as Out8 says.
template <typename T>
__attribute__((always_inline)) inline void store_sums_8(const __m512* v, const Out8<T>& to, int64_t o) {
  store_8(_mm512_castps512_ps256(sum_lanes_of<8>(v)), to, o);
}
#endif

// out[r * out_r + c * out_c] = sum_i a_r[i] * b_c[i] over n elements for the R rows a_r = a + r * a_step (of a_t,
// widened to acc_t) and the C rows b_c = b + c * b_step. prefetch != 0: as each 64-byte line of a row is read, the
// lines `prefetch` and `prefetch / 2` bytes on are asked for, for a streaming caller (see prefetch_line).
// kLanes: each sum stays a vector, Vectorized<acc_t>::size() partial sums at out + (r * out_r + c * out_c) * size(),
// added to (a caller that takes the elements in chunks sums the lanes at the end). Never inlined: inlined into
// gemv_rows' chunked loop, a block is slower, and a call costs nothing beside a block's loop.
// fused (AVX-512, float32, 8 rows of x, not kLanes): fused->blocks blocks of R weight rows in one call, each row's 8
// sums reduced together (sum_lanes_of) and written to out scaled (store_8) instead of to out as sums, one at a time,
// and stored again by the caller, which takes more instructions (see gemv_rows). The numbers of both:
// cpu_kernel_notes_2026-11-28.md, dot_block. n_blocks (not kLanes, not fused): as many blocks of R weight rows in one
// call, block i the rows after block i - 1's (n: whole rows), its sums at out + i * R * out_r: one call for a run of
// blocks, where a call and the caller's loop per block cost a decoding read a tenth or more of its speed
// (cpu_kernel_notes_2026-11-28.md, stream_prefetch).
template <int R, int C, bool kLanes = false, typename acc_t, typename a_t>
__attribute__((noinline)) void dot_block(const a_t* a_first, int64_t a_step, const acc_t* b, int64_t b_step, int64_t n,
                                         acc_t* out, int64_t out_r, int64_t out_c, int64_t prefetch = 0,
                                         const Out8<acc_t>* fused = nullptr, int64_t n_blocks = 1) {
#if defined(CPU_CAPABILITY_AVX512)
  constexpr bool kFusable = !kLanes && C == 8 && std::is_same_v<acc_t, float>;
#else
  constexpr bool kFusable = false;
#endif
  const int64_t blocks = kFusable && fused ? fused->blocks : n_blocks;
  for (int64_t block = 0; block < blocks; ++block) {
    const a_t* a = a_first + block * n;  // the next block: the weight rows after these (n: whole rows)
    using Vec = at::vec::Vectorized<acc_t>;
    constexpr int64_t kV = Vec::size();
    // Two sets of sums for small blocks (kTwoSumSets). The loops over r and c are unrolled by pragma, which GCC 12 at
    // -O3 needs to keep every sum in a register (see dot_block_bf16 in gemv.h).
    constexpr bool kTwoSets = kTwoSumSets<R, C>;
    Vec acc[R][C], acc2[R][C];  // acc2: the second set, when kTwoSets
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = acc2[r][c] = Vec(0);
    if constexpr (kLanes)
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = Vec::loadu(out + (r * out_r + c * out_c) * kV);
    // The vector at i into acc (set 0) or acc2 (set 1); count < kV: a zero-filled tail. With AVX-512 (and AVX2's 4
    // rows of b) each float32 b vector is pinned to a register by an empty asm: GCC 12 otherwise folds its load into
    // every fma that uses it, R loads where one does, and a 2 x 8 block then does 18 loads for 16 fmas, more than the
    // two load ports take in the fmas' time (cpu_kernel_notes_2026-11-28.md, dot_block). With AVX2, pinned 1 or 2 rows
    // of b read the weights slower (cpu_linear_2026-12-05_zen3_rows.md).
    const auto step = [&](auto set, int64_t i, int64_t count) __attribute__((always_inline)) {
      Vec bv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        bv[c] = Vec::loadu(b + c * b_step + i, count);
#if defined(CPU_CAPABILITY_AVX512)
        if constexpr (std::is_same_v<acc_t, float>) {  // kept in a register: see above
          __m512 v = bv[c];
          asm("" : "+v"(v));
          bv[c] = v;
        }
#elif defined(CPU_CAPABILITY_AVX2)
        if constexpr (std::is_same_v<acc_t, float> && C == 4) {  // the same, for 4 rows of b
          __m256 v = bv[c];
          asm("" : "+x"(v));
          bv[c] = v;
        }
#endif
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const Vec av = load_widened<acc_t>(a + r * a_step + i, count);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
          if constexpr (decltype(set)::value == 0) acc[r][c] = at::vec::fmadd(av, bv[c], acc[r][c]);
          else acc2[r][c] = at::vec::fmadd(av, bv[c], acc2[r][c]);
        }
      }
    };
    constexpr int64_t kLine = std::max<int64_t>(kV, 64 / static_cast<int64_t>(sizeof(a_t)));  // a 64-byte line of a
    constexpr int64_t kChunk = std::max<int64_t>(kLine, (kTwoSets ? 2 : 1) * kV);  // whole lines, a vector per set
    const auto chunk = [&](int64_t i) __attribute__((always_inline)) {  // vector j of a chunk into set j % 2
      [&]<int64_t... J>(std::integer_sequence<int64_t, J...>) {
        (step(std::integral_constant<int, kTwoSets ? J % 2 : 0>{}, i + J * kV, kV), ...);
      }(std::make_integer_sequence<int64_t, kChunk / kV>{});
    };
    int64_t i = 0;
    if (prefetch != 0)
      for (; i + kChunk <= n; i += kChunk) {
        for (int64_t l = 0; l < kChunk; l += kLine)  // for each line of each row
          for (int r = 0; r < R; ++r) prefetch_line(a + r * a_step + i + l, prefetch);
        chunk(i);
      }
    for (; i + kChunk <= n; i += kChunk) chunk(i);
    for (; i + kV <= n; i += kV) step(std::integral_constant<int, 0>{}, i, kV);
    if (i < n) step(std::integral_constant<int, 0>{}, i, n - i);
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (kFusable) {
      if (fused) {  // a weight row's 8 sums at once, scaled as a vector
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          __m512 sums[C];
#pragma GCC unroll 8
          for (int c = 0; c < C; ++c) sums[c] = kTwoSets ? acc[r][c] + acc2[r][c] : acc[r][c];
          store_sums_8(sums, *fused, fused->row(block, r));
        }
        continue;
      }
    }
#endif
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) {
        const Vec sum = kTwoSets ? acc[r][c] + acc2[r][c] : acc[r][c];
        if constexpr (kLanes) sum.store(out + (r * out_r + c * out_c) * kV);
        else out[(block * R + r) * out_r + c * out_c] = at::vec::vec_reduce_all<acc_t>(VecPlus(), sum);
      }
  }
}

// Calls f(std::integral_constant<int, K>{}, i) for consecutive blocks [i, i + K) that cover [0, count): K = kMax (8, 4,
// 2 or 1) while a block of kMax fits, then the next smaller ones. Kernels written for a fixed number of rows use it to
// take any.
template <int kMax, class F>
void for_blocks(int64_t count, F&& f) {
  int64_t i = 0;
  if constexpr (kMax >= 8)
    for (; i + 8 <= count; i += 8) f(std::integral_constant<int, 8>{}, i);
  if constexpr (kMax >= 4)
    for (; i + 4 <= count; i += 4) f(std::integral_constant<int, 4>{}, i);
  for (; i + 2 <= count; i += 2) f(std::integral_constant<int, 2>{}, i);
  if (i < count) f(std::integral_constant<int, 1>{}, i);
}

// out[r * out_r + c * out_c] = dot(a + r * a_step, b + c * b_step) over n elements for any rows x cols, in blocks of
// up to 4 x kDotCols (prefetch and kLanes: see dot_block); n_blocks (not kLanes; rows a power of two up to 4): as many
// groups of rows, group i the rows after those of group i - 1 (n: whole rows), its sums at out + i * rows * out_r.
template <bool kLanes = false, typename acc_t, typename a_t>
void dot_rows(const a_t* a, int64_t a_step, int64_t rows, const acc_t* b, int64_t b_step, int64_t cols, int64_t n,
              acc_t* out, int64_t out_r, int64_t out_c, int64_t prefetch = 0, int64_t n_blocks = 1) {
  const int64_t sum_size = kLanes ? at::vec::Vectorized<acc_t>::size() : 1;
  for_blocks<4>(rows, [&](auto R, int64_t r) {
    for_blocks<kDotCols>(cols, [&](auto C, int64_t c) {
      constexpr const Out8<acc_t>* kNotFused = nullptr;
      dot_block<decltype(R)::value, decltype(C)::value, kLanes>(a + r * a_step, a_step, b + c * b_step, b_step, n,
                                                                out + (r * out_r + c * out_c) * sum_size, out_r,
                                                                out_c, prefetch, kNotFused, n_blocks);
    });
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace pytransformer::cpu
