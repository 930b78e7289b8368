// The masked_softmax kernels for every storage type (masked_softmax_launch.h).
#include "masked_softmax_kernel.cuh"

namespace pytransformer::cuda {

#define PT_INSTANTIATE_MASKED_SOFTMAX(T)                                                        \
  template void launch_masked_softmax_fwd<T>(const SoftmaxFwdParams<T>&, bool, cudaStream_t); \
  template void launch_masked_softmax_bwd<T>(const SoftmaxBwdParams<T>&, bool, cudaStream_t);
PT_FOR_FLOAT_TYPES(PT_INSTANTIATE_MASKED_SOFTMAX)

}  // namespace pytransformer::cuda
