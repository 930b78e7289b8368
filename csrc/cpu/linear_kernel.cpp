// CPU kernel of linear, compiled once per ISA level (see isa.h; the glue is linear.cpp): the few-rows product
// out [M, N] = x [M, K] @ weight [N, K]^T + bias, weight streaming over all threads (gemv.h). x, weight, bias and out
// are float32, bfloat16 or float16; narrow weights are widened to float32 as they are loaded (a bfloat16 weight is half
// the bytes to read, so half the time) and accumulated in float32, and out is rounded to the dtype once.
#include "isa.h"

#include "../linear.h"
#include "gemv.h"

namespace pytransformer::cpu {

extern KernelTable<LinearGemvCpuFn> linear_gemv_kernel;

inline namespace CPU_CAPABILITY {
void linear_gemv(const LinearParams& p, at::ScalarType dtype, const void* x, const void* weight, const void* bias,
                 void* out) {
  const auto run = [&](auto io) {
    using T = decltype(io);
    gemv_rows<float>(p.rows, p.out_features, p.in_features, static_cast<const T*>(x), static_cast<const T*>(weight),
                     nullptr, static_cast<const T*>(bias), static_cast<T*>(out), /*x_quant_bits=*/0);
  };
  switch (dtype) {  // the glue passes float32, bfloat16 or float16 only
    case at::kBFloat16: return run(c10::BFloat16());
    case at::kHalf: return run(c10::Half());
    default: return run(float());
  }
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(linear_gemv_kernel, &CPU_CAPABILITY::linear_gemv);

}  // namespace pytransformer::cpu
