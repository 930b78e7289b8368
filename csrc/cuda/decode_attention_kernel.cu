// The decode_attention kernels for every storage type (decode_attention_launch.h).
#include "decode_attention_kernel.cuh"

namespace pytransformer::cuda {

#define PT_INSTANTIATE_DECODE_ATTENTION(T) \
  template void launch_decode_attention<T>(DecodeArgs<T>, bool, cudaStream_t, FloatAlloc);
PT_FOR_FLOAT_TYPES(PT_INSTANTIATE_DECODE_ATTENTION)

}  // namespace pytransformer::cuda
