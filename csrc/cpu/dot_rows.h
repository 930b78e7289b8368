#pragma once
// dot_rows: dot products of several rows with one vector, each load of the vector serving every row. Shared by the
// CPU kernels; compiled into each including file's ISA level (namespace CPU_CAPABILITY, see isa.h).
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <functional>

namespace pytransformer::cpu {
inline namespace CPU_CAPABILITY {

// out[r * out_step] = sum_i a_r[i] * b[i] over n elements for the R rows a_r = a + r * a_step: each load of b
// serves every row.
template <int R, typename acc_t>
void dot_rows(const acc_t* a, int64_t a_step, const acc_t* b, int64_t n, acc_t* out, int64_t out_step) {
  using Vec = at::vec::Vectorized<acc_t>;
  constexpr int64_t kV = Vec::size();
  Vec acc[R];
  for (int r = 0; r < R; ++r) acc[r] = Vec(0);
  int64_t i = 0;
  for (; i + kV <= n; i += kV) {
    const Vec bv = Vec::loadu(b + i);
    for (int r = 0; r < R; ++r) acc[r] = at::vec::fmadd(Vec::loadu(a + r * a_step + i), bv, acc[r]);
  }
  if (i < n) {  // zero-filled tail
    const Vec bv = Vec::loadu(b + i, n - i);
    for (int r = 0; r < R; ++r) acc[r] = at::vec::fmadd(Vec::loadu(a + r * a_step + i, n - i), bv, acc[r]);
  }
  for (int r = 0; r < R; ++r) out[r * out_step] = at::vec::vec_reduce_all<acc_t>(std::plus<Vec>(), acc[r]);
}

// dot_rows for any number of rows, four at a time.
template <typename acc_t>
void dot_rows(const acc_t* a, int64_t a_step, int64_t rows, const acc_t* b, int64_t n, acc_t* out, int64_t out_step) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) dot_rows<4>(a + r * a_step, a_step, b, n, out + r * out_step, out_step);
  for (; r + 2 <= rows; r += 2) dot_rows<2>(a + r * a_step, a_step, b, n, out + r * out_step, out_step);
  if (r < rows) dot_rows<1>(a + r * a_step, a_step, b, n, out + r * out_step, out_step);
}

}  // namespace CPU_CAPABILITY
}  // namespace pytransformer::cpu
