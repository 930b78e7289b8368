// CPU kernels of masked_softmax (forward and backward), compiled once per ISA level (see isa.h); the glue is
// masked_softmax.cpp.
// Forward, per row of scores.view(-1, Lk), rows split over threads: over the n visible columns (n < Lk only in
// causal rows, whose other columns are never read) a = scale * x + bias goes into a float (double for float64) row
// buffer while the max is taken; then a = exp(a - max) in place while summing; then out = a / sum, zeros past n.
// The bias row is the mask read through its strides (0 / -inf for a bool mask), rebuilt only when the mask row
// changes, and read in place when it is a contiguous float32/float64 row.
#include "isa.h"
#include "vec_util.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "../masked_softmax.h"

namespace pytransformer::cpu {

extern KernelTable<void (*)(const MaskedSoftmaxFwdParams&)> masked_softmax_fwd_kernel;
extern KernelTable<void (*)(const MaskedSoftmaxBwdParams&)> masked_softmax_bwd_kernel;

inline namespace CPU_CAPABILITY {
using at::vec::Vectorized;

// bias[j] = mask element j as an additive bias for j < n. M = uint8_t reads a bool mask (1 kept -> 0, 0 removed ->
// -inf; read as bytes, which GCC vectorises where it does not for bool).
template <typename M, typename acc_t>
void mask_bias(const M* __restrict__ m, int64_t stride, int64_t n, acc_t* __restrict__ bias) {
  using bits_t = std::conditional_t<sizeof(acc_t) == 4, uint32_t, uint64_t>;
  constexpr bits_t ninf_bits = std::bit_cast<bits_t>(-std::numeric_limits<acc_t>::infinity());
  auto value = [](M v) {
    if constexpr (std::is_same_v<M, uint8_t>)  // branch-free: no mispredictions on random masks
      return std::bit_cast<acc_t>(static_cast<bits_t>(static_cast<bits_t>(v) - 1) & ninf_bits);
    else
      return static_cast<acc_t>(v);
  };
  if (stride == 1) {
    for (int64_t j = 0; j < n; ++j) bias[j] = value(m[j]);
  } else {
    for (int64_t j = 0; j < n; ++j) bias[j] = value(m[j * stride]);
  }
}

// a[j] = scale * x[j] + bias[j] for j < n (a -inf bias removes the entry whatever x is; bias may be null);
// returns max(a), -inf when n == 0. `a` may alias `x`.
template <typename acc_t>
acc_t scale_bias_max(const acc_t* x, const acc_t* bias, acc_t scale, int64_t n, acc_t* a) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t kV = Vec::size();
  const Vec vscale(scale), vninf(-std::numeric_limits<acc_t>::infinity());
  auto step = [&](int64_t j, int64_t count) {
    Vec v = Vec::loadu(x + j, count) * vscale;
    if (bias) {
      const Vec b = Vec::loadu(bias + j, count);
      v = Vec::blendv(v + b, b, b == vninf);
    }
    v.store(a + j, count);
    return count == kV ? v : Vec::set(vninf, v, count);
  };
  // Four running maxima: at::vec::maximum propagates NaN, a chain of several dependent instructions.
  Vec m0 = vninf, m1 = vninf, m2 = vninf, m3 = vninf;
  int64_t j = 0;
  for (; j + 4 * kV <= n; j += 4 * kV) {
    m0 = at::vec::maximum(m0, step(j, kV)), m1 = at::vec::maximum(m1, step(j + kV, kV));
    m2 = at::vec::maximum(m2, step(j + 2 * kV, kV)), m3 = at::vec::maximum(m3, step(j + 3 * kV, kV));
  }
  for (; j + kV <= n; j += kV) m0 = at::vec::maximum(m0, step(j, kV));
  if (j < n) m1 = at::vec::maximum(m1, step(j, n - j));
  auto vmax = [](Vec p, Vec q) { return at::vec::maximum(p, q); };
  return at::vec::vec_reduce_all<acc_t>(vmax, vmax(vmax(m0, m1), vmax(m2, m3)));
}

// a[j] = exp(a[j] - max) in place for j < n; returns the sum. exp_u20 is ATen's fast float exp (about 20 ulp, the
// exact exp for double).
template <typename acc_t>
acc_t exp_sum(acc_t* a, acc_t max, int64_t n) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t kV = Vec::size();
  const Vec vmax(max);
  Vec s0(0), s1(0);
  int64_t j = 0;
  for (; j + 2 * kV <= n; j += 2 * kV) {
    const Vec e0 = (Vec::loadu(a + j) - vmax).exp_u20(), e1 = (Vec::loadu(a + j + kV) - vmax).exp_u20();
    e0.store(a + j), e1.store(a + j + kV);
    s0 += e0, s1 += e1;
  }
  for (; j < n; j += kV) {
    const int64_t count = std::min(kV, n - j);
    const Vec e = Vec::set(Vec(0), (Vec::loadu(a + j, count) - vmax).exp_u20(), count);
    e.store(a + j, count);
    s0 += e;
  }
  return at::vec::vec_reduce_all<acc_t>(VecPlus(), s0 + s1);
}

// out[j] = a[j] * factor for j < n (a is overwritten when T is narrower than acc_t).
template <typename T, typename acc_t>
void scale_to(acc_t* a, acc_t factor, int64_t n, T* out) {
  using Vec = Vectorized<acc_t>;
  const Vec f(factor);
  if constexpr (std::is_same_v<T, acc_t>) {
    at::vec::map<acc_t>([f](Vec v) { return v * f; }, out, a, n);
  } else {
    at::vec::map<acc_t>([f](Vec v) { return v * f; }, a, a, n);
    convert_n(a, out, n);
  }
}

// M: uint8_t for a bool mask, T for a float mask (unused without a mask).
template <typename T, typename M>
void fwd_typed(const MaskedSoftmaxFwdParams& p) {
  using acc_t = at::opmath_type<T>;
  const int64_t rows = p.rows, lk = p.lk, lq = p.lq;
  const double scale = p.scale;
  const MaskLayout& ml = p.mask_layout;
  const T* xp = static_cast<const T*>(p.scores);
  T* op = static_cast<T*>(p.out);
  const M* mp = static_cast<const M*>(p.mask);
  const bool mask_in_place = std::is_same_v<M, acc_t> && ml.col_stride == 1;
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / lk), [&](int64_t begin, int64_t end) {
    std::vector<acc_t> buf(lk), bias(mp && !mask_in_place ? lk : 0);
    int64_t bias_offset = -1, bias_cols = 0;  // the mask row held in `bias`, and how many columns of it
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = lq ? causal_cols(r, lq, lk) : lk;
      T* o = op + r * lk;
      const acc_t* b = nullptr;
      if (mp) {
        const int64_t offset = mask_row_offset(ml, r);
        if constexpr (std::is_same_v<M, acc_t>) {
          if (mask_in_place) b = mp + offset;
        }
        if (!b) {
          if (offset != bias_offset || n > bias_cols) {
            mask_bias(mp + offset, ml.col_stride, n, bias.data());
            bias_offset = offset, bias_cols = n;
          }
          b = bias.data();
        }
      }
      const acc_t mx = scale_bias_max(widen_row(xp + r * lk, n, buf), b, acc_t(scale), n, buf.data());
      if (mx == -std::numeric_limits<acc_t>::infinity()) {  // no visible entry (or n == 0)
        std::memset(o, 0, lk * sizeof(T));
        continue;
      }
      if (!std::isfinite(mx)) {  // a NaN or +inf entry: a NaN row, as softmax gives (inf - inf)
        std::fill(o, o + lk, static_cast<T>(std::numeric_limits<acc_t>::quiet_NaN()));
        continue;
      }
      const acc_t sum = exp_sum(buf.data(), mx, n);
      scale_to(buf.data(), acc_t(1) / sum, n, o);
      std::memset(o + n, 0, (lk - n) * sizeof(T));
    }
  });
}

// grad = scale * y * (g - sum(g * y)) per row.
template <typename T>
void bwd_typed(const MaskedSoftmaxBwdParams& p) {
  using acc_t = at::opmath_type<T>;
  using Vec = Vectorized<acc_t>;
  const int64_t rows = p.rows, lk = p.lk;
  const double scale = p.scale;
  const T *gp = static_cast<const T*>(p.grad_out), *yp = static_cast<const T*>(p.out);
  T* dp = static_cast<T*>(p.grad_scores);
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / lk), [&](int64_t begin, int64_t end) {
    const int64_t bufsize = std::is_same_v<T, acc_t> ? 0 : lk;
    std::vector<acc_t> gbuf(bufsize), ybuf(bufsize), dbuf(bufsize);
    for (int64_t r = begin; r < end; ++r) {
      const acc_t* gr = widen_row(gp + r * lk, lk, gbuf);
      const acc_t* yr = widen_row(yp + r * lk, lk, ybuf);
      const Vec vdot(dot(gr, yr, lk)), vscale(scale);
      acc_t* d = std::is_same_v<T, acc_t> ? reinterpret_cast<acc_t*>(dp + r * lk) : dbuf.data();
      at::vec::map2<acc_t>([&](Vec gv, Vec yv) { return vscale * yv * (gv - vdot); }, d, gr, yr, lk);
      if constexpr (!std::is_same_v<T, acc_t>) convert_n(dbuf.data(), dp + r * lk, lk);
    }
  });
}

void masked_softmax_fwd(const MaskedSoftmaxFwdParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "masked_softmax_fwd", [&] {
    if (p.mask_is_bool)
      fwd_typed<scalar_t, uint8_t>(p);
    else
      fwd_typed<scalar_t, scalar_t>(p);
  });
}

void masked_softmax_bwd(const MaskedSoftmaxBwdParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "masked_softmax_bwd",
                                  [&] { bwd_typed<scalar_t>(p); });
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(masked_softmax_fwd_kernel, &CPU_CAPABILITY::masked_softmax_fwd);
PT_REGISTER_CPU_KERNEL(masked_softmax_bwd_kernel, &CPU_CAPABILITY::masked_softmax_bwd);

}  // namespace pytransformer::cpu
