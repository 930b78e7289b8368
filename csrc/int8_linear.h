#pragma once
// int8_linear: out [..., N] = (x [..., K] @ weight^T) * scale + bias with an int8 weight [N, K] and per-output-channel
// float scales [N]; x_bits 16: weight-only quantization (x stays floating point, or 16 bits, see the CPU kernel),
// x_bits 8: x quantized per row to 8 bits too. Argument checks and the rounding of x to 8 bits, shared by the glue.
#include "common.h"
#include "int8_linear_params.h"

#include <c10/util/accumulate.h>

namespace pytransformer {

// The CPU kernels (csrc/cpu/int8_linear_kernel.cpp) compute in the accumulation type `acc` (float32, float64 for
// float64 x); every array is contiguous. Few rows (any number with integer dot products, called on blocks of rows):
// out [M, N] = (x [M, K] @ weight^T) * scale [N] + bias [N] (bias may be nullptr); x_quant_bits 16 or 8: the kernel
// quantizes each row of float32 x to that many bits and sums in integers (only where has_int_dot_products()), 0: x as
// it is (the glue decides which, see x_for_kernels in cpu/int8_linear.cpp).
// Many rows: deq [n, K] = weight[:n] * scale[:n, None], a block of dequantized weight rows for a GEMM.
using Int8GemvCpuFn = void (*)(const Int8LinearParams& p, at::ScalarType acc, const void* x, const int8_t* weight,
                               const void* scale, const void* bias, void* out, int64_t x_quant_bits);
using Int8DequantizeCpuFn = void (*)(at::ScalarType acc, int64_t n, int64_t in_features, const int8_t* weight,
                                     const void* scale, void* deq);
// Many rows, with AVX2 or AVX-512 only (float32): out [M, N] = (x [M, K] @ weight^T) * scale + bias by the GEMM of
// outer products (cpu/gemm.h), the weight widened to float32 as it is packed.
using Int8GemmCpuFn = void (*)(const Int8LinearParams& p, const float* x, const int8_t* weight, const float* scale,
                               const float* bias, float* out);
// Many rows, with AMX int8 tiles only (float32): out [M, N] = (x [M, K] @ weight^T) * scale + bias with each row of x
// quantized to x_quant_bits (16 or 8) and the products summed in integers, the same outputs as Int8GemvCpuFn's with
// integer dot products; K from 1 to kAmxMaxK.
using Int8AmxCpuFn = void (*)(const Int8LinearParams& p, const float* x, const int8_t* weight, const float* scale,
                              const float* bias, float* out, int64_t x_quant_bits);
constexpr int64_t kAmxMaxK = 65536;  // the int32 sums of the AMX kernel hold any K up to this

// x_bits: 16 (weight-only quantization) or 8 (x quantized per row to 8 bits too); pytransformer/ops/_checks.py mirrors
// it (known_x_bits), and pytransformer/ops/int8_linear.py holds the default.
inline void check_x_bits(int64_t x_bits) {
  TORCH_CHECK_VALUE(x_bits == 8 || x_bits == 16, "x_bits: expected 8 or 16, got ", x_bits);
}

inline Int8LinearParams check_int8_linear_args(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                                               const std::optional<at::Tensor>& bias, int64_t x_bits) {
  check_x_bits(x_bits);
  check_float_dtype(x, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1, "x: expected a tensor [..., K], got a 0-d tensor");
  const int64_t K = x.size(-1);
  check_like(weight, "weight", x, "x", /*same_dtype=*/false);
  TORCH_CHECK_VALUE(weight.scalar_type() == at::kChar, "weight: expected an int8 tensor [N, K], got dtype ",
                    weight.scalar_type());
  TORCH_CHECK_VALUE(weight.dim() == 2 && weight.size(1) == K, "weight: expected int8 [N, K] with K = ", K,
                    " (the last dim of x), got shape ", weight.sizes());
  const int64_t N = weight.size(0);
  for (const auto& [t, name] : {std::pair{&scale, "scale"}, std::pair{bias ? &*bias : nullptr, "bias"}}) {
    if (!t) continue;
    check_float_dtype(*t, name);
    check_like(*t, name, x, "x", /*same_dtype=*/false);
    TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == N, name, ": expected shape [N] = [", N,
                      "] (the rows of weight), got ", t->sizes());
  }
  return {c10::multiply_integers(x.sizes().slice(0, x.dim() - 1)), N, K};
}

// x [M, K] with each row rounded to 8 bits in the arithmetic of the CPU's VNNI kernel (cpu/gemv.h, quantize_rows), in
// float32 (float64 for float64 x): q = round(x * pre * (127 / big)) to nearest, ties to even, with big = max|x row| *
// pre and pre = 2^100 for a row below 2^-100 (else 1), then q * (big / 127) / pre, in x's dtype. A row of zeros stays
// zeros; a row with an inf or NaN becomes NaN. For the paths that use x as it is.
inline at::Tensor round_x_to_8_bits(const at::Tensor& x) {
  const at::Tensor xf = x.scalar_type() == at::kDouble ? x : x.to(at::kFloat);
  const at::Tensor amax = xf.abs().amax(-1, /*keepdim=*/true);
  const at::Tensor pre = amax.new_full({}, 0x1p100).where(amax.lt(0x1p-100), 1.0);
  const at::Tensor big = amax.mul(pre);
  const at::Tensor mul = big.new_full({}, 127.0).div(big).where(big.gt(0), 0.0);
  return xf.mul(pre).mul(mul).round().mul(big.div(127)).div(pre).to(x.scalar_type());
}

namespace cpu {
// Whether int8_linear on the CPU quantizes float32 (or narrower) x per row and sums its products in integers at this
// many rows of x (cpu/int8_linear.cpp): with integer dot products (has_int_dot_products), on the row-by-row kernel's
// or the AMX path's.
bool int8_sums_in_integers(int64_t rows, int64_t in_features);
// Whether int8_linear's many-rows products run on AMX int8 tiles (where the processor has them and Linux grants
// them); enable false turns them off and true back on, for A/B measurements.
bool int8_amx(std::optional<bool> enable);
}  // namespace cpu
}  // namespace pytransformer
