// The int8_linear kernels for every storage type of x and out (int8_linear_launch.h).
#include "int8_linear_kernel.cuh"

namespace pytransformer::cuda {

#define PT_INSTANTIATE_INT8_LINEAR(T) \
  template void launch_int8_linear<T>(const Int8LinearArgs<T>&, cudaStream_t, FloatAlloc);
PT_FOR_FLOAT_TYPES(PT_INSTANTIATE_INT8_LINEAR)

}  // namespace pytransformer::cuda
