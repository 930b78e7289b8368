// CPU kernels of int8_linear, compiled once per ISA level (see isa.h; the glue is int8_linear.cpp): out [M, N] = (x [M, K] @ weight^T) * scale + bias
// with an int8 weight [N, K] (weight-only quantization).
//
// Few rows (decoding, M <= kMaxGemvRows): work items are blocks of 4 output features; their int8 weight rows are read
// once, widened chunk by chunk into an L1-resident buffer and dotted with all M rows of x (dot_rows: blocks of 4 weight
// rows by up to 4 rows of x, each load serving 4 products), so the product reads 1 byte per weight from memory instead
// of the float layer's 4. Many rows (prefill): the product is compute-bound, so blocks of weight rows are dequantized
// (times scale) into a buffer of 16 MiB and multiplied with ATen's GEMM. float16/bfloat16 x is computed in float32,
// float64 in float64.
#include "isa.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../int8_linear.h"
#include "dot_rows.h"

namespace pytransformer::cpu {

extern KernelTable<Int8GemvCpuFn> int8_gemv_kernel;
extern KernelTable<Int8DequantizeCpuFn> int8_dequantize_kernel;

inline namespace CPU_CAPABILITY {

// dst[i] = src[i] * s for n elements (a plain loop that the compiler vectorises for the file's ISA level).
template <typename acc_t>
void widen(const int8_t* src, acc_t* dst, int64_t n, acc_t s) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<acc_t>(src[i]) * s;
}

constexpr int64_t kRowsPerItem = 4;  // weight rows per work item of the few-rows kernel
constexpr int64_t kChunk = 1024;     // weight columns widened at a time (4 x 1024 x 4 B = 16 KiB)

template <typename acc_t>
void int8_gemv_typed(const Int8LinearParams& p, const void* x, const int8_t* wp, const void* scale, const void* bias,
                     void* out) {
  const int64_t M = p.rows, N = p.out_features, K = p.in_features;
  const acc_t* xp = static_cast<const acc_t*>(x);
  const acc_t* sp = static_cast<const acc_t*>(scale);
  const acc_t* bp = static_cast<const acc_t*>(bias);
  acc_t* op = static_cast<acc_t*>(out);
  const int64_t items = (N + kRowsPerItem - 1) / kRowsPerItem;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, kRowsPerItem * M * K));
  at::parallel_for(0, items, grain, [&](int64_t i0, int64_t i1) {
    std::vector<acc_t> rows(kRowsPerItem * std::min(K, kChunk));
    std::vector<acc_t> part(M * kRowsPerItem), sum(M * kRowsPerItem);  // [M, 4]
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i * kRowsPerItem, nb = std::min(kRowsPerItem, N - n);
      std::fill(sum.begin(), sum.end(), acc_t(0));
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t kc = std::min(kChunk, K - k0);
        for (int64_t r = 0; r < nb; ++r) widen<acc_t>(wp + (n + r) * K + k0, rows.data() + r * kc, kc, acc_t(1));
        dot_rows<acc_t>(rows.data(), kc, nb, xp + k0, K, M, kc, part.data(), 1, kRowsPerItem);
        for (int64_t j = 0; j < M * kRowsPerItem; ++j) sum[j] += part[j];
      }
      for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < nb; ++r)
          op[m * N + n + r] = sum[m * kRowsPerItem + r] * sp[n + r] + (bp ? bp[n + r] : acc_t(0));
    }
  });
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
               const void* bias, void* out) {
  AT_DISPATCH_FLOATING_TYPES(acc, "int8_linear", [&] { int8_gemv_typed<scalar_t>(p, x, weight, scale, bias, out); });
}

void int8_dequantize(at::ScalarType acc, int64_t n, int64_t in_features, const int8_t* weight, const void* scale,
                     void* deq) {
  AT_DISPATCH_FLOATING_TYPES(acc, "int8_linear",
                             [&] { int8_dequantize_typed<scalar_t>(n, in_features, weight, scale, deq); });
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(int8_gemv_kernel, &CPU_CAPABILITY::int8_gemv);
PT_REGISTER_CPU_KERNEL(int8_dequantize_kernel, &CPU_CAPABILITY::int8_dequantize);

}  // namespace pytransformer::cpu
