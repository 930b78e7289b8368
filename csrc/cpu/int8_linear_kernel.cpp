// CPU kernels of int8_linear, compiled once per ISA level (see isa.h; the glue is int8_linear.cpp): out [M, N] = (x [M, K] @ weight^T) * scale + bias
// with an int8 weight [N, K].
//
// Few rows (decoding, M <= kMaxGemvRows), and with integer dot products any number of rows (8 a call, see the glue):
// the weight-streaming kernel of the linear layers (gemv.h), so the product reads 1 byte per weight from memory instead
// of the float layer's 4. With integer dot products (AVX-512 VNNI, or AVX2 where it is the best level; float32,
// float16 or bfloat16 x), each row of x is quantized to 16 bits (to nearest, in steps of its largest magnitude /
// 32767; / 24385 at K 11008, fewer over K 8192, so that no int32 sum of the AVX-512 kernel overflows), or with x_bits 8
// to 8 bits (steps of the largest magnitude / 127), and its products with the weights are summed exactly in integers,
// then times the two scales: off from the exact product by at most half a step times sum_k |w[n, k]| * scale[n] (with
// 16 bits typically 1e-5 to 1e-4 of the outputs), the same whatever the number of rows, and the same from both ISA
// levels; a row with an inf or NaN gives NaN. Otherwise the int8 weight rows are widened to float32 as they are
// loaded, each dot product times its scale (x_bits 8: x rounded by the glue). Many rows (prefill) without integer dot
// products: the product is compute-bound, so blocks of weight rows are dequantized (times scale) into a buffer of
// 16 MiB and multiplied with ATen's GEMM (widened_mm.h). float16/bfloat16 x is computed in float32, float64 in
// float64.
#include "isa.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>

#include "../int8_linear.h"
#include "gemm.h"
#include "gemv.h"

namespace pytransformer::cpu {

extern KernelTable<Int8GemvCpuFn> int8_gemv_kernel;
extern KernelTable<Int8DequantizeCpuFn> int8_dequantize_kernel;
extern KernelTable<Int8GemmCpuFn> int8_gemm_kernel;

inline namespace CPU_CAPABILITY {

// dst[i] = src[i] * s for n elements (a plain loop that the compiler vectorises for the file's ISA level).
template <typename acc_t>
void widen(const int8_t* src, acc_t* dst, int64_t n, acc_t s) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<acc_t>(src[i]) * s;
}

template <typename acc_t>
void int8_dequantize_typed(int64_t N, int64_t K, const int8_t* wp, const void* scale, void* deq) {
  const acc_t* sp = static_cast<const acc_t*>(scale);
  acc_t* dp = static_cast<acc_t*>(deq);
  at::parallel_for(0, N, std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, K)), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) widen<acc_t>(wp + n * K, dp + n * K, K, sp[n]);
  });
}

void int8_gemv(const Int8LinearParams& p, at::ScalarType acc, const void* x, const int8_t* weight, const void* scale,
               const void* bias, void* out, int64_t x_quant_bits) {
  AT_DISPATCH_FLOATING_TYPES(acc, "int8_linear", [&] {
    gemv_rows<scalar_t>(p.rows, p.out_features, p.in_features, static_cast<const scalar_t*>(x), weight,
                        static_cast<const scalar_t*>(scale), static_cast<const scalar_t*>(bias),
                        static_cast<scalar_t*>(out), x_quant_bits);
  });
}

void int8_dequantize(at::ScalarType acc, int64_t n, int64_t in_features, const int8_t* weight, const void* scale,
                     void* deq) {
  AT_DISPATCH_FLOATING_TYPES(acc, "int8_linear",
                             [&] { int8_dequantize_typed<scalar_t>(n, in_features, weight, scale, deq); });
}

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
void int8_gemm(const Int8LinearParams& p, const float* x, const int8_t* weight, const float* scale, const float* bias,
               float* out) {
  gemm(p.rows, p.out_features, p.in_features, x, weight, scale, bias, out);
}
#endif
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(int8_gemv_kernel, &CPU_CAPABILITY::int8_gemv);
PT_REGISTER_CPU_KERNEL(int8_dequantize_kernel, &CPU_CAPABILITY::int8_dequantize);
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
PT_REGISTER_CPU_KERNEL(int8_gemm_kernel, &CPU_CAPABILITY::int8_gemm);
#endif

}  // namespace pytransformer::cpu
