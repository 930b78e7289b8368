// The SIMT attention kernels for every storage type (attention_launch.h).
#include "attention_simt.cuh"

namespace pytransformer::cuda {

#define PT_INSTANTIATE_ATTENTION_SIMT(T)                                                                         \
  template void attention_simt_fwd<T>(const AttentionParams&, cudaStream_t);                                     \
  template void attention_simt_bwd<T>(const AttentionBackwardParams&, const float*, cudaStream_t);               \
  template void attention_simt_dq<T>(const AttentionBackwardParams&, const float*, const float*, cudaStream_t); \
  template void attention_simt_dkv<T>(const AttentionBackwardParams&, const float*, cudaStream_t);              \
  template void attention_delta<T>(const AttentionBackwardParams&, float*, cudaStream_t);
PT_FOR_FLOAT_TYPES(PT_INSTANTIATE_ATTENTION_SIMT)

}  // namespace pytransformer::cuda
