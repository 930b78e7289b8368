// The kv_cache_append kernel for elements of 2 and 4 bytes (kv_cache_append_launch.h).
#include "kv_cache_append_kernel.cuh"

namespace pytransformer::cuda {

template void launch_kv_cache_append<uint16_t>(const AppendArgs<uint16_t>&, bool, cudaStream_t);
template void launch_kv_cache_append<uint32_t>(const AppendArgs<uint32_t>&, bool, cudaStream_t);

}  // namespace pytransformer::cuda
