#pragma once
// int8_linear's kernel parameters, shared by the CPU and CUDA kernels (conventions: int8_linear.h). Only standard
// headers: the CUDA kernel unit (cuda/int8_linear_kernel.cu) compiles without parsing torch's.
#include <cstdint>

namespace pytransformer {

struct Int8LinearParams {
  int64_t rows, out_features, in_features;  // M (x's leading dims flattened), N, K
};

}  // namespace pytransformer
