// CPU kernels of layer_norm and rms_norm (forward and backward), compiled once per ISA level (see isa.h); the glue is
// norm.cpp.
// LayerNorm statistics take two passes over the row: m = mean(x), then shifted sums s1 = sum(x - m),
// s2 = sum((x - m)^2) (mean = m + s1 / n, var = s2 / n - (s1 / n)^2), accurate for any offset of the row (a shift by
// one sample of the row, x0, loses the variance to cancellation when x0 is far from the mean). float16/bfloat16 rows
// are widened into a float buffer first.
#include "isa.h"
#include "vec_util.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <cmath>
#include <vector>

#include "../norm.h"

namespace pytransformer::cpu {

extern KernelTable<void (*)(const NormFwdParams&)> norm_fwd_kernel;
extern KernelTable<void (*)(const NormBwdParams&)> norm_bwd_kernel;

inline namespace CPU_CAPABILITY {
using at::vec::Vectorized;

// Sum of a and of a^2 after subtracting `shift`, over n elements, vectorised with two accumulators each.
template <typename acc_t>
void shifted_sums(const acc_t* a, int64_t n, acc_t shift, acc_t& s1, acc_t& s2) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t kV = Vec::size();
  const Vec k(shift);
  Vec v1a(0), v1b(0), v2a(0), v2b(0);
  int64_t i = 0;
  for (; i + 2 * kV <= n; i += 2 * kV) {
    Vec d0 = Vec::loadu(a + i) - k, d1 = Vec::loadu(a + i + kV) - k;
    v1a += d0, v1b += d1;
    v2a = at::vec::fmadd(d0, d0, v2a), v2b = at::vec::fmadd(d1, d1, v2b);
  }
  if (i + kV <= n) {
    Vec d = Vec::loadu(a + i) - k;
    v1a += d, v2a = at::vec::fmadd(d, d, v2a);
    i += kV;
  }
  if (i < n) {  // masked tail: lanes past n load as `shift` and contribute zero
    Vec d = Vec::set(k, Vec::loadu(a + i, n - i), n - i) - k;
    v1a += d, v2a = at::vec::fmadd(d, d, v2a);
  }
  s1 = at::vec::vec_reduce_all<acc_t>(VecPlus(), v1a + v1b);
  s2 = at::vec::vec_reduce_all<acc_t>(VecPlus(), v2a + v2b);
}

template <typename T>
void norm_fwd_typed(const NormFwdParams& p) {
  using acc_t = at::opmath_type<T>;
  using Vec = Vectorized<acc_t>;
  const int64_t rows = p.rows, n = p.n;
  const bool center = p.center;
  const double eps = p.eps;
  const T* xp = static_cast<const T*>(p.x);
  T* yp = static_cast<T*>(p.y);
  acc_t* meanp = static_cast<acc_t*>(p.mean);
  acc_t* rstdp = static_cast<acc_t*>(p.rstd);
  // Affine parameters as acc_t vectors (1 and 0 when absent).
  std::vector<acc_t> wv(n, acc_t(1)), bv(n, acc_t(0));
  if (p.weight) convert_n(static_cast<const T*>(p.weight), wv.data(), n);
  if (p.bias) convert_n(static_cast<const T*>(p.bias), bv.data(), n);
  at::parallel_for(0, rows, std::max<int64_t>(1, 16384 / n), [&](int64_t begin, int64_t end) {
    std::vector<acc_t> xbuf(std::is_same_v<T, acc_t> ? 0 : n), ybuf(std::is_same_v<T, acc_t> ? 0 : n);
    for (int64_t r = begin; r < end; ++r) {
      const acc_t* a = widen_row(xp + r * n, n, xbuf);
      acc_t mu = 0, var;
      if (center) {
        const acc_t m = at::vec::reduce_all<acc_t>(VecPlus(), a, n) / n;
        acc_t s1, s2;
        shifted_sums(a, n, m, s1, s2);
        const acc_t d = s1 / n;
        mu = m + d;
        var = std::max(s2 / n - d * d, acc_t(0));
      } else {
        acc_t s1, s2;
        shifted_sums(a, n, acc_t(0), s1, s2);
        var = s2 / n;
      }
      const acc_t rs = acc_t(1) / std::sqrt(var + acc_t(eps));
      meanp[r] = mu, rstdp[r] = rs;
      acc_t* out = std::is_same_v<T, acc_t> ? reinterpret_cast<acc_t*>(yp + r * n) : ybuf.data();
      // xhat = (x - mean) * rstd: exact for x == mean (a single element normalises to 0); x * rstd - mean * rstd as
      // one fma is off by the rounding of mean * rstd, up to ~1e-4 for |mean| ~ 10 and eps-sized variances.
      const Vec vrs(rs), vmu(mu);
      at::vec::map3<acc_t>([&](Vec xv, Vec wvv, Vec bvv) { return at::vec::fmadd((xv - vmu) * vrs, wvv, bvv); }, out,
                           a, wv.data(), bv.data(), n);
      if constexpr (!std::is_same_v<T, acc_t>) convert_n(ybuf.data(), yp + r * n, n);
    }
  });
}

template <typename T>
void norm_bwd_typed(const NormBwdParams& p) {
  using acc_t = at::opmath_type<T>;
  using Vec = Vectorized<acc_t>;
  const int64_t rows = p.rows, n = p.n;
  const bool center = p.center;
  const T *xp = static_cast<const T*>(p.x), *gp = static_cast<const T*>(p.grad_out);
  T* dxp = static_cast<T*>(p.grad_x);
  // RMSNorm has no mean: rows are not centred.
  const acc_t *meanp = static_cast<const acc_t*>(p.mean), *rstdp = static_cast<const acc_t*>(p.rstd);
  std::vector<acc_t> wv(n, acc_t(1));
  if (p.weight) convert_n(static_cast<const T*>(p.weight), wv.data(), n);
  const bool want_dw = p.grad_weight != nullptr, want_db = p.grad_bias != nullptr;
  // Per-thread partial sums of the weight and bias gradients, reduced after the parallel loop (no atomics).
  const int nthreads = at::get_num_threads();
  std::vector<acc_t> dw_part(want_dw ? nthreads * n : 0, acc_t(0)), db_part(want_db ? nthreads * n : 0, acc_t(0));
  at::parallel_for(0, rows, std::max<int64_t>(1, 8192 / n), [&](int64_t begin, int64_t end) {
    const int tid = at::get_thread_num();
    std::vector<acc_t> xbuf(std::is_same_v<T, acc_t> ? 0 : n), gbuf(xbuf.size()), dxbuf(xbuf.size());
    acc_t* dwp = want_dw ? dw_part.data() + tid * n : nullptr;
    acc_t* dbp = want_db ? db_part.data() + tid * n : nullptr;
    for (int64_t r = begin; r < end; ++r) {
      const acc_t* a = widen_row(xp + r * n, n, xbuf);
      const acc_t* gr = widen_row(gp + r * n, n, gbuf);
      const acc_t mu = meanp ? meanp[r] : acc_t(0), rs = rstdp[r];
      const Vec vrs(rs), vmu(mu);  // xhat = (x - mean) * rstd, as in the forward
      // One pass: sums of gw = g * w and gw * xhat, and this thread's partial weight and bias gradients.
      Vec s_gw(0), s_gwx(0);
      int64_t i = 0;
      constexpr int64_t kV = Vec::size();
      for (; i + kV <= n; i += kV) {
        const Vec gv = Vec::loadu(gr + i), gwv = gv * Vec::loadu(wv.data() + i);
        const Vec xhat = (Vec::loadu(a + i) - vmu) * vrs;
        s_gw += gwv, s_gwx = at::vec::fmadd(gwv, xhat, s_gwx);
        if (dwp) at::vec::fmadd(gv, xhat, Vec::loadu(dwp + i)).store(dwp + i);
        if (dbp) (Vec::loadu(dbp + i) + gv).store(dbp + i);
      }
      acc_t sum_gw = at::vec::vec_reduce_all<acc_t>(VecPlus(), s_gw);
      acc_t sum_gwx = at::vec::vec_reduce_all<acc_t>(VecPlus(), s_gwx);
      for (; i < n; ++i) {
        const acc_t xhat = (a[i] - mu) * rs, gw = gr[i] * wv[i];
        sum_gw += gw, sum_gwx += gw * xhat;
        if (dwp) dwp[i] += gr[i] * xhat;
        if (dbp) dbp[i] += gr[i];
      }
      // dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)); RMSNorm drops the mean(gw) term.
      const Vec c_gw(center ? sum_gw / n : acc_t(0)), c_gwx(sum_gwx / n);
      acc_t* out = std::is_same_v<T, acc_t> ? reinterpret_cast<acc_t*>(dxp + r * n) : dxbuf.data();
      at::vec::map3<acc_t>(
          [&](Vec gv, Vec wvv, Vec xv) {
            const Vec xhat = (xv - vmu) * vrs;
            return (gv * wvv - c_gw - xhat * c_gwx) * vrs;
          },
          out, gr, wv.data(), a, n);
      if constexpr (!std::is_same_v<T, acc_t>) convert_n(dxbuf.data(), dxp + r * n, n);
    }
  });
  auto reduce_parts = [&](const std::vector<acc_t>& parts, void* out) {
    std::vector<acc_t> total(parts.begin(), parts.begin() + n);
    for (int t = 1; t < nthreads; ++t)
      at::vec::map2<acc_t>([](Vec s, Vec p) { return s + p; }, total.data(), total.data(), parts.data() + t * n, n);
    convert_n(total.data(), static_cast<T*>(out), n);
  };
  if (want_dw) reduce_parts(dw_part, p.grad_weight);
  if (want_db) reduce_parts(db_part, p.grad_bias);
}

void norm_fwd(const NormFwdParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "norm_fwd", [&] { norm_fwd_typed<scalar_t>(p); });
}

void norm_bwd(const NormBwdParams& p) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, p.dtype, "norm_bwd", [&] { norm_bwd_typed<scalar_t>(p); });
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(norm_fwd_kernel, &CPU_CAPABILITY::norm_fwd);
PT_REGISTER_CPU_KERNEL(norm_bwd_kernel, &CPU_CAPABILITY::norm_bwd);

}  // namespace pytransformer::cpu
