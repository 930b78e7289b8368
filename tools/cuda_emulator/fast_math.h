#pragma once
// The float32 numerics of the CUDA build (nvcc --use_fast_math, tools/build_config.py) on the host: build.py rewrites
// the kernels' calls of exp2f, __expf, log2f, logf and rsqrtf, and their reciprocals 1.f / x, as calls of the
// approximate instructions below (other float divisions stay exact IEEE divisions: see README.md), and a
// launch runs with denormals flushed (MXCSR FTZ and DAZ, see emu::launch). Each instruction returns the correctly
// rounded result moved by a deterministic amount (a hash of the input) within the error bound the PTX ISA documents
// for it, so that results differ from exact math by errors of the hardware's size; subnormal inputs and results are
// flushed to sign-preserving zero (.ftz). mma.sync's float32 accumulation is modeled in ptx.h.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace emu::fast {

inline uint32_t hash(float x) {
  uint32_t h = std::bit_cast<uint32_t>(x) * 0x9e3779b1u;
  return h ^ (h >> 16);
}
// A deterministic value in [-1, 1] for input x.
inline double unit(float x) { return double(hash(x) % 2049u) / 1024.0 - 1.0; }
inline float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.f, x) : x; }

// ex2.approx.ftz.f32: "maximum ulp error is 2 ulp from correctly rounded result across the full range of inputs".
inline float ex2(float x) {
  x = ftz(x);
  float r = float(std::exp2(double(x)));
  if (!std::isfinite(r) || r == 0.f || x == 0.f) return r;  // the ISA's table: 2^(+-0) = 1 exactly
  for (int k = int(hash(x) % 5u) - 2; k; k += k > 0 ? -1 : 1) r = std::nextafter(r, k > 0 ? INFINITY : 0.f);
  return ftz(std::isfinite(r) ? r : std::numeric_limits<float>::max());
}
// lg2.approx.ftz.f32: maximum absolute error 2^-22 for inputs in (0.5, 2), relative error 2^-22 elsewhere.
inline float lg2(float x) {
  x = ftz(x);
  const double r = std::log2(double(x));
  if (!std::isfinite(r)) return float(r);
  const double e = unit(x) * 0x1p-22;
  return float(x > 0.5f && x < 2.f ? r + e : r * (1.0 + e));
}
// rcp.approx.ftz.f32 (what --use_fast_math compiles a float reciprocal 1.f / x to): "maximum ulp error is 1 across
// the full range of inputs".
inline float rcp(float x) {
  x = ftz(x);
  const double r = 1.0 / double(x);
  if (!std::isfinite(float(r)) || float(r) == 0.f) return float(r);
  // The exact result moved by up to half a float32 ulp, then rounded: within 1 ulp of the exact reciprocal.
  return ftz(float(r + unit(x) * 0.5 * std::ldexp(1.0, std::ilogb(r) - 23)));
}
// rsqrt.approx.ftz.f32: maximum relative error 2^-22.9 over the positive finite range.
inline float rsqrt(float x) {
  x = ftz(x);
  const double r = 1.0 / std::sqrt(double(x));
  return std::isfinite(r) ? ftz(float(r * (1.0 + unit(x) * 0x1.125p-23))) : float(r);  // 2^-22.9 = 0x1.125p-23
}

// What --use_fast_math compiles these to: exp2f -> ex2.approx.ftz; __expf(x) (and expf) -> ex2.approx.ftz of
// x * log2(e) rounded to float32; log2f -> lg2.approx.ftz; logf -> lg2.approx.ftz times ln(2); rsqrtf -> rsqrt.approx.
inline float exp2f(float x) { return ex2(x); }
inline float __expf(float x) { return ex2(ftz(x * 1.44269504f)); }
inline float expf(float x) { return __expf(x); }
inline float log2f(float x) { return lg2(x); }
inline float logf(float x) { return ftz(lg2(x) * 0.693147181f); }
inline float rsqrtf(float x) { return rsqrt(x); }

}  // namespace emu::fast
