#pragma once
// Small at::vec helpers shared by the CPU kernels; compiled per ISA level like the kernels that include them.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <type_traits>
#include <vector>

namespace pytransformer::cpu {
inline namespace CPU_CAPABILITY {

// max(a, b) that propagates NaN from either side, as torch's max does (std::max(a, NaN) returns a).
template <typename acc_t>
inline acc_t max_nan(acc_t a, acc_t b) {
  return (a > b || a != a) ? a : b;
}

// dst[i] = src[i] converted, for i < n. Between float32 and the 16-bit float types, vectors of them with AVX2 and
// AVX-512 (at::vec::convert takes them an element at a time below AVX-512), rounded to nearest even as c10's
// conversions are; every other pair by at::vec::convert.
template <typename From, typename To>
void convert_n(const From* src, To* dst, int64_t n) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  constexpr bool kWiden = std::is_same_v<To, float> && at::vec::is_reduced_floating_point_v<From>;
  constexpr bool kNarrow = std::is_same_v<From, float> && at::vec::is_reduced_floating_point_v<To>;
  if constexpr (kWiden || kNarrow) {
    using Vf = at::vec::Vectorized<float>;
    constexpr int64_t kV = Vf::size();  // two vectors of float32 to one of the 16-bit type
    static_assert(at::vec::Vectorized<std::conditional_t<kWiden, From, To>>::size() == 2 * kV);
    int64_t i = 0;
    for (; i + 2 * kV <= n; i += 2 * kV) {
      if constexpr (kWiden) {
        const auto [lo, hi] = at::vec::convert_to_float<From>(at::vec::Vectorized<From>::loadu(src + i));
        lo.store(dst + i);
        hi.store(dst + i + kV);
      } else {
        at::vec::convert_from_float<To>(Vf::loadu(src + i), Vf::loadu(src + i + kV)).store(dst + i);
      }
    }
    for (; i < n; ++i) dst[i] = static_cast<To>(src[i]);
    return;
  }
#endif
  at::vec::convert(src, dst, n);
}

// The first n elements of a row of `T` as `acc_t`: the row itself when the types agree, else widened into `buf`.
template <typename T, typename acc_t>
const acc_t* widen_row(const T* row, int64_t n, std::vector<acc_t>& buf) {
  if constexpr (std::is_same_v<T, acc_t>) {
    return row;
  } else {
    convert_n(row, buf.data(), n);
    return buf.data();
  }
}

// a + b, the sum of at::vec's reductions (vec_reduce_all, reduce_all) in place of std::plus<Vec>: the standard headers
// come before a kernel unit's target pragma (tools/build_config.py), so a std::plus<Vec> that the compiler does not
// inline is baseline code, which returns a vector in memory where this level's code returns it in registers (a crash).
struct VecPlus {
  template <typename Vec>
  Vec operator()(const Vec& a, const Vec& b) const {
    return a + b;
  }
};

// sum(a * b) over n elements, with four accumulators (one would serialise on the fma latency).
template <typename acc_t>
acc_t dot(const acc_t* a, const acc_t* b, int64_t n) {
  using Vec = at::vec::Vectorized<acc_t>;
  constexpr int64_t kV = Vec::size();
  Vec s0(0), s1(0), s2(0), s3(0);
  int64_t j = 0;
  for (; j + 4 * kV <= n; j += 4 * kV) {
    s0 = at::vec::fmadd(Vec::loadu(a + j), Vec::loadu(b + j), s0);
    s1 = at::vec::fmadd(Vec::loadu(a + j + kV), Vec::loadu(b + j + kV), s1);
    s2 = at::vec::fmadd(Vec::loadu(a + j + 2 * kV), Vec::loadu(b + j + 2 * kV), s2);
    s3 = at::vec::fmadd(Vec::loadu(a + j + 3 * kV), Vec::loadu(b + j + 3 * kV), s3);
  }
  for (; j + kV <= n; j += kV) s0 = at::vec::fmadd(Vec::loadu(a + j), Vec::loadu(b + j), s0);
  if (j < n) s1 += Vec::set(Vec(0), Vec::loadu(a + j, n - j) * Vec::loadu(b + j, n - j), n - j);
  return at::vec::vec_reduce_all<acc_t>(VecPlus(), (s0 + s1) + (s2 + s3));
}

#if defined(CPU_CAPABILITY_AVX512)
// The mask of the first n of a vector's 16 float lanes (none for n <= 0, all from 16): the part of a row from a
// vector's start that is left, for masked loads and stores.
inline __mmask16 first_lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : n > 0 ? static_cast<__mmask16>((1u << n) - 1) : __mmask16(0);
}
#endif

}  // namespace CPU_CAPABILITY
}  // namespace pytransformer::cpu
