#pragma once
// dot_rows: the dot products of a block of rows with a block of other rows, each vector load serving every product
// of its row. Shared by the CPU kernels; compiled into each including file's ISA level (namespace CPU_CAPABILITY,
// see isa.h).
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

// dot_block for R rows of a and any number of rows of b, kDotCols, 2 and 1 at a time.
template <int R, typename acc_t>
void dot_rows_of(const acc_t* a, int64_t a_step, const acc_t* b, int64_t b_step, int64_t cols, int64_t n, acc_t* out,
                 int64_t out_r, int64_t out_c) {
  int64_t c = 0;
  if constexpr (kDotCols == 4)
    for (; c + 4 <= cols; c += 4) dot_block<R, 4>(a, a_step, b + c * b_step, b_step, n, out + c * out_c, out_r, out_c);
  for (; c + 2 <= cols; c += 2) dot_block<R, 2>(a, a_step, b + c * b_step, b_step, n, out + c * out_c, out_r, out_c);
  if (c < cols) dot_block<R, 1>(a, a_step, b + c * b_step, b_step, n, out + c * out_c, out_r, out_c);
}

// out[r * out_r + c * out_c] = dot(a + r * a_step, b + c * b_step) over n elements for any rows x cols, in blocks of
// up to 4 x kDotCols.
template <typename acc_t>
void dot_rows(const acc_t* a, int64_t a_step, int64_t rows, const acc_t* b, int64_t b_step, int64_t cols, int64_t n,
              acc_t* out, int64_t out_r, int64_t out_c) {
  int64_t r = 0;
  const auto block = [&](auto rows_at_once) {
    constexpr int R = decltype(rows_at_once)::value;
    dot_rows_of<R>(a + r * a_step, a_step, b, b_step, cols, n, out + r * out_r, out_r, out_c);
    r += R;
  };
  while (r + 4 <= rows) block(std::integral_constant<int, 4>{});
  while (r + 2 <= rows) block(std::integral_constant<int, 2>{});
  if (r < rows) block(std::integral_constant<int, 1>{});
}

}  // namespace CPU_CAPABILITY
}  // namespace pytransformer::cpu
