// CPU kernel of linear, compiled once per ISA level (see isa.h; the glue is linear.cpp): out [M, N] = x [M, K] @
// weight [N, K]^T + bias. x, weight, bias and out are float32, bfloat16 or float16; narrow weights are widened to
// float32 as they are loaded (a bfloat16 weight is half the bytes to read, so half the time) and accumulated in
// float32, and out is rounded to the dtype once. Few rows (decoding) stream the weight over all threads (gemv.h), in
// calls of up to kRowBlock rows; from kGemmRows rows (prefill) AVX2 and AVX-512 take a GEMM of outer products (gemm.h:
// every dtype with AVX2, float32 with AVX-512).
#include "isa.h"

#include <type_traits>

#include "../linear.h"
#include "gemm.h"
#include "gemv.h"

namespace pytransformer::cpu {

extern KernelTable<LinearCpuFn> linear_kernel;

inline namespace CPU_CAPABILITY {
namespace {
// The most rows of x a call of the weight-streaming kernel takes: more go by in calls of this many rows.
constexpr int64_t kRowBlock = 32;

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
// The fewest rows that take the GEMM (gemm.h): with fewer, gemv_rows measured as fast with the weights read from
// memory, as in decoding. With AVX2 (an EPYC Zen 3) every type from 24 rows (cpu_kernel_notes_2026-12-02_zen3_gemm.md);
// with AVX-512 float32 once the rows need a second pass of the streaming kernel over the weights (more than kRowBlock):
// on an AVX-512 Xeon, with weights read from memory, the GEMM took 0.67-0.93x its time at 40 and 47 rows, and at 24 and
// 32 rows 0.88-1.07x, depending on the layer (cpu_linear_rows_2026-12-05_xeon.md); on a Zen 5 the streaming kernel
// took 1.10 ms at 47 rows where the GEMM took 0.94 at 48 (cpu_linear_2026-12-02_zen5_gemm.md).
constexpr int64_t kGemmRows = kGemmLanes == 8 ? 24 : kRowBlock + 1;
// With AVX2, 16-bit weights whose shape fits gemv_rows' assembly blocks (wide_blocks_fit) from kRowBlock + 1: one pass
// of the blocks over the weights took 0.82-0.99x the GEMM's time at 24 to 32 rows, two passes 1.04-1.12x at 40 and 48
// (TinyLlama's layers; cpu_linear_2026-12-06_zen3_f16_blocks.md).
template <typename T>
int64_t gemm_rows(int64_t N, int64_t K) {
#if defined(CPU_CAPABILITY_AVX2)
  if constexpr (!std::is_same_v<T, float>)
    if (wide_blocks_fit(N, K)) return kRowBlock + 1;
#endif
  return kGemmRows;
}
// Which types take the GEMM: float32 at both levels, the 16-bit types with AVX2 only (not measured with AVX-512, where
// the glue gives bfloat16 with AVX-512 BF16 dot products to ATen from 29 rows).
template <typename T>
constexpr bool kGemmTakes = std::is_same_v<T, float> || kGemmLanes == 8;
#endif
}  // namespace

void linear(const LinearParams& p, at::ScalarType dtype, const void* x, const void* weight, const void* bias,
            void* out) {
  const auto run = [&](auto io) {
    using T = decltype(io);
    const auto* xp = static_cast<const T*>(x);
    auto* op = static_cast<T*>(out);
#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
    if constexpr (kGemmTakes<T>)
      if (p.rows >= gemm_rows<T>(p.out_features, p.in_features))
        return gemm(p.rows, p.out_features, p.in_features, xp, static_cast<const T*>(weight), /*scale=*/nullptr,
                    static_cast<const T*>(bias), op);
#endif
    for_row_blocks(p.rows, kRowBlock, [&](int64_t m0, int64_t mb) {  // rows [m0, m0 + mb) of x and out
      gemv_rows<float>(mb, p.out_features, p.in_features, xp + m0 * p.in_features, static_cast<const T*>(weight),
                       nullptr, static_cast<const T*>(bias), op + m0 * p.out_features, /*x_quant_bits=*/0);
    });
  };
  switch (dtype) {  // the glue passes float32, bfloat16 or float16 only
    case at::kBFloat16: return run(c10::BFloat16());
    case at::kHalf: return run(c10::Half());
    default: return run(float());
  }
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(linear_kernel, &CPU_CAPABILITY::linear);

}  // namespace pytransformer::cpu
