// The layer_norm / rms_norm kernels for every storage type (norm_launch.h).
#include "norm_kernel.cuh"

namespace pytransformer::cuda {

#define PT_INSTANTIATE_NORM(T)                                                          \
  template void launch_norm_fwd<T>(const NormFwdParams<T>&, bool, cudaStream_t); \
  template void launch_norm_bwd<T>(NormBwdParams<T>, bool, T*, T*, cudaStream_t, FloatAlloc);
PT_FOR_FLOAT_TYPES(PT_INSTANTIATE_NORM)

}  // namespace pytransformer::cuda
