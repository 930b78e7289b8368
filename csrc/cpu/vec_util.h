#pragma once
// Small at::vec helpers shared by the CPU kernels; compiled per ISA level like the kernels that include them.
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

// The first n elements of a row of `T` as `acc_t`: the row itself when the types agree, else widened into `buf`.
template <typename T, typename acc_t>
const acc_t* widen_row(const T* row, int64_t n, std::vector<acc_t>& buf) {
  if constexpr (std::is_same_v<T, acc_t>) {
    return row;
  } else {
    at::vec::convert(row, buf.data(), n);
    return buf.data();
  }
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
