// CPU glue of kv_cache_append: argument checks (every position before anything is written, so a bad call leaves the
// caches unchanged), the kernel of the best ISA level (kv_cache_append_kernel.cpp), registration.
#include <torch/library.h>

#include "../kv_cache_append.h"
#include "isa.h"

namespace pytransformer::cpu {
KernelTable<KvCacheAppendCpuFn> kv_cache_append_kernel;

namespace {
void kv_cache_append(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k_new,
                     const at::Tensor& v_new, const at::Tensor& positions, std::optional<int64_t> max_position) {
  const KvCacheAppendParams p = check_kv_cache_append_args(k_cache, v_cache, k_new, v_new, positions);
  if (max_position) check_append_bound(*max_position, p);
  const at::Tensor pos = positions.to(at::kLong).contiguous();  // [B]
  check_append_positions(pos.const_data_ptr<int64_t>(), p);
  if (p.new_len == 0) return;
  kv_cache_append_kernel.get()(p, k_cache.element_size(), k_cache.data_ptr(), v_cache.data_ptr(),
                               k_new.const_data_ptr(), v_new.const_data_ptr(), pos.const_data_ptr<int64_t>());
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) { m.impl("kv_cache_append", &kv_cache_append); }

}  // namespace pytransformer::cpu
