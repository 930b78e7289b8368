// CPU kernel of kv_cache_append, compiled once per ISA level (see isa.h; a memcpy needs no vector ISA, but every op's
// kernels have the same shape); the glue is kv_cache_append.cpp. Copies k_new / v_new [B, Hkv, T, D|Dv] into the
// caches [B, Hkv, capacity, D|Dv] at positions[b] .. positions[b] + T - 1, in place: a memcpy per run of rows of one
// head (per row, or element by element, for strided operands). The glue has checked every position.
#include "isa.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../kv_cache_append.h"

namespace pytransformer::cpu {

extern KernelTable<KvCacheAppendCpuFn> kv_cache_append_kernel;

inline namespace CPU_CAPABILITY {

// Copies `rows` rows of `n` elements of type E from src (row stride `src_row`, element stride `src_step`) to dst:
// one memcpy when both are dense blocks, else a memcpy per row when rows are contiguous, else element by element.
template <typename E>
void copy_rows(char* dst, int64_t dst_row, int64_t dst_step, const char* src, int64_t src_row, int64_t src_step,
               int64_t rows, int64_t n) {
  if (dst_step == 1 && src_step == 1) {
    if ((dst_row == n && src_row == n) || rows == 1) {
      std::memcpy(dst, src, rows * n * sizeof(E));
      return;
    }
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(dst + r * dst_row * sizeof(E), src + r * src_row * sizeof(E), n * sizeof(E));
    return;
  }
  E* d = reinterpret_cast<E*>(dst);
  const E* s = reinterpret_cast<const E*>(src);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) d[r * dst_row + i * dst_step] = s[r * src_row + i * src_step];
}

// Rows r = (b, h, t) of k_new and v_new go to cache row positions[b] + t of head h; a thread's share of the rows is
// copied as runs of one (b, h) each.
template <typename E>
void append_rows(const KvCacheAppendParams& p, char* kc, char* vc, const char* kn, const char* vn,
                 const int64_t* positions) {
  const int64_t rows = p.batch * p.kv_heads * p.new_len;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / ((p.head_dim + p.v_head_dim) * sizeof(E)));
  const int64_t *kcs = p.k_cache_stride, *vcs = p.v_cache_stride, *kns = p.k_new_stride, *vns = p.v_new_stride;
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end;) {
      const int64_t t = r % p.new_len, h = (r / p.new_len) % p.kv_heads, b = r / (p.new_len * p.kv_heads);
      const int64_t run = std::min(end - r, p.new_len - t), pos = positions[b] + t;
      copy_rows<E>(kc + (b * kcs[0] + h * kcs[1] + pos * kcs[2]) * sizeof(E), kcs[2], kcs[3],
                   kn + (b * kns[0] + h * kns[1] + t * kns[2]) * sizeof(E), kns[2], kns[3], run, p.head_dim);
      copy_rows<E>(vc + (b * vcs[0] + h * vcs[1] + pos * vcs[2]) * sizeof(E), vcs[2], vcs[3],
                   vn + (b * vns[0] + h * vns[1] + t * vns[2]) * sizeof(E), vns[2], vns[3], run, p.v_head_dim);
      r += run;
    }
  });
}

void kv_cache_append(const KvCacheAppendParams& p, int64_t element_size, void* k_cache, void* v_cache,
                     const void* k_new, const void* v_new, const int64_t* positions) {
  char *kc = static_cast<char*>(k_cache), *vc = static_cast<char*>(v_cache);
  const char *kn = static_cast<const char*>(k_new), *vn = static_cast<const char*>(v_new);
  switch (element_size) {  // a float type: 2, 4 or 8 bytes, copied bit for bit
    case 2: return append_rows<uint16_t>(p, kc, vc, kn, vn, positions);
    case 4: return append_rows<uint32_t>(p, kc, vc, kn, vn, positions);
    default: return append_rows<uint64_t>(p, kc, vc, kn, vn, positions);
  }
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(kv_cache_append_kernel, &CPU_CAPABILITY::kv_cache_append);

}  // namespace pytransformer::cpu
