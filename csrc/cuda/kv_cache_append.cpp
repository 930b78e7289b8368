// CUDA glue of kv_cache_append: the shared checks of kv_cache_append.h, the positions checked on the host unless the
// stream is capturing a CUDA graph (then the kernel skips rows that do not fit: see glue.h), then the copy kernel of
// kv_cache_append_launch.h on the current stream of the caches' device.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <initializer_list>

#include "../kv_cache_append.h"
#include "glue.h"
#include "kv_cache_append_launch.h"

namespace pytransformer::cuda {
namespace {

void kv_cache_append(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k_new,
                     const at::Tensor& v_new, const at::Tensor& positions, std::optional<int64_t> max_position) {
  const KvCacheAppendParams p = check_kv_cache_append_args(k_cache, v_cache, k_new, v_new, positions);
  c10::cuda::CUDAGuard guard(k_cache.device());
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (max_position) {
    check_append_bound(*max_position, p);  // no device read (see glue.h)
  } else {
    check_on_host_unless_capturing(positions, stream, [&](const int64_t* pos) { check_append_positions(pos, p); });
  }
  if (p.new_len == 0 || p.batch * p.kv_heads == 0) return;
  at::Tensor pos_keep;
  const IndexVector pos = index_vector(positions, pos_keep);
  bool packed = true;
  for (const at::Tensor* t : {&k_cache, &v_cache, &k_new, &v_new}) packed = packed && rows_packable(*t);
  auto launch = [&](auto tag) {
    using E = typename decltype(tag)::type;
    AppendArgs<E> a{p,
                    pos,
                    {static_cast<E*>(k_cache.data_ptr()), static_cast<E*>(v_cache.data_ptr())},
                    {static_cast<const E*>(k_new.const_data_ptr()), static_cast<const E*>(v_new.const_data_ptr())}};
    launch_kv_cache_append(a, packed, stream);
  };
  if (k_cache.element_size() == 2) {  // float16 / bfloat16, copied bit for bit
    launch(std::type_identity<uint16_t>{});
  } else {
    launch(std::type_identity<uint32_t>{});
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CUDA, m) { m.impl("kv_cache_append", &kv_cache_append); }

}  // namespace pytransformer::cuda
