// CPU kernel of linear, compiled once per ISA level (see isa.h; the glue is linear.cpp): the few-rows product
// out [M, N] = x [M, K] @ weight [N, K]^T + bias, weight streaming over all threads (gemv.h). x, bias and out are
// float32; the weight is float32, bfloat16 or float16, widened to float32 as it is loaded (a bfloat16 weight is half
// the bytes to read, so half the time), with float32 accumulation.
#include "isa.h"

#include "../linear.h"
#include "gemv.h"

namespace pytransformer::cpu {

extern KernelTable<LinearGemvCpuFn> linear_gemv_kernel;

inline namespace CPU_CAPABILITY {
void linear_gemv(const LinearParams& p, at::ScalarType weight_dtype, const float* x, const void* weight,
                 const float* bias, float* out) {
  const auto run = [&](const auto* w) {
    gemv_rows<float>(p.rows, p.out_features, p.in_features, x, w, nullptr, bias, out);
  };
  switch (weight_dtype) {  // the glue passes float32, bfloat16 or float16 weights only
    case at::kBFloat16: return run(static_cast<const c10::BFloat16*>(weight));
    case at::kHalf: return run(static_cast<const c10::Half*>(weight));
    default: return run(static_cast<const float*>(weight));
  }
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(linear_gemv_kernel, &CPU_CAPABILITY::linear_gemv);

}  // namespace pytransformer::cpu
