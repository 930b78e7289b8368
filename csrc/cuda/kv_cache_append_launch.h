#pragma once
// The launch function of the kv_cache_append kernel (kv_cache_append_kernel.cuh) as the glue (kv_cache_append.cpp)
// calls it, and its parameters; instantiated in kv_cache_append_kernel.cu for elements of 2 and 4 bytes.
#include "../kv_cache_append_params.h"
#include "launch.h"

namespace pytransformer::cuda {

// Elements are copied bit for bit: E is the unsigned type of the element size (2 or 4 bytes).
template <typename E>
struct AppendArgs {
  KvCacheAppendParams p;
  IndexVector positions;
  E* cache[2];      // k_cache, v_cache
  const E* src[2];  // k_new, v_new
};

// Launches the copy (stream-ordered; the caller has checked the arguments and set the device); `packed`: every row
// of the four tensors is 16-byte aligned with a unit last-dim stride and D, Dv are multiples of the pack (the glue
// checks). Requires new_len > 0.
template <typename E>
void launch_kv_cache_append(const AppendArgs<E>& a, bool packed, cudaStream_t stream);

}  // namespace pytransformer::cuda
