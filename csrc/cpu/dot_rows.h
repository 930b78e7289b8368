#pragma once
// dot_rows: the dot products of a block of rows with a block of other rows, each vector load serving every product
// of its row; for_blocks: kernels written for a fixed number of rows applied to any. Shared by the CPU kernels;
// compiled into each including file's ISA level (namespace CPU_CAPABILITY, see isa.h).
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <functional>
#include <type_traits>

namespace pytransformer::cpu {
inline namespace CPU_CAPABILITY {

// Most b rows a call takes at once: the R x C accumulators (R <= 4) and C + 1 loaded vectors fit the registers.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kDotCols = 4;
#else
constexpr int kDotCols = 2;
#endif

// out[r * out_r + c * out_c] = sum_i a_r[i] * b_c[i] over n elements for the R rows a_r = a + r * a_step and the C
// rows b_c = b + c * b_step.
template <int R, int C, typename acc_t>
void dot_block(const acc_t* a, int64_t a_step, const acc_t* b, int64_t b_step, int64_t n, acc_t* out, int64_t out_r,
               int64_t out_c) {
  using Vec = at::vec::Vectorized<acc_t>;
  constexpr int64_t kV = Vec::size();
  Vec acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = Vec(0);
  const auto step = [&](int64_t i, int64_t count) __attribute__((always_inline)) {  // count < kV: zero-filled tail
    Vec bv[C];
    for (int c = 0; c < C; ++c) bv[c] = Vec::loadu(b + c * b_step + i, count);
    for (int r = 0; r < R; ++r) {
      const Vec av = Vec::loadu(a + r * a_step + i, count);
      for (int c = 0; c < C; ++c) acc[r][c] = at::vec::fmadd(av, bv[c], acc[r][c]);
    }
  };
  int64_t i = 0;
  for (; i + kV <= n; i += kV) step(i, kV);
  if (i < n) step(i, n - i);
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c)
      out[r * out_r + c * out_c] = at::vec::vec_reduce_all<acc_t>(std::plus<Vec>(), acc[r][c]);
}

// Calls f(std::integral_constant<int, K>{}, i) for consecutive blocks [i, i + K) that cover [0, count): K = 4 (when
// kMax is 4) while a block of 4 fits, then 2, then 1. Kernels written for a fixed number of rows use it to take any.
template <int kMax, class F>
void for_blocks(int64_t count, F&& f) {
  int64_t i = 0;
  if constexpr (kMax >= 4)
    for (; i + 4 <= count; i += 4) f(std::integral_constant<int, 4>{}, i);
  for (; i + 2 <= count; i += 2) f(std::integral_constant<int, 2>{}, i);
  if (i < count) f(std::integral_constant<int, 1>{}, i);
}

// out[r * out_r + c * out_c] = dot(a + r * a_step, b + c * b_step) over n elements for any rows x cols, in blocks of
// up to 4 x kDotCols.
template <typename acc_t>
void dot_rows(const acc_t* a, int64_t a_step, int64_t rows, const acc_t* b, int64_t b_step, int64_t cols, int64_t n,
              acc_t* out, int64_t out_r, int64_t out_c) {
  for_blocks<4>(rows, [&](auto R, int64_t r) {
    for_blocks<kDotCols>(cols, [&](auto C, int64_t c) {
      dot_block<decltype(R)::value, decltype(C)::value>(a + r * a_step, a_step, b + c * b_step, b_step, n,
                                                        out + r * out_r + c * out_c, out_r, out_c);
    });
  });
}

}  // namespace CPU_CAPABILITY
}  // namespace pytransformer::cpu
