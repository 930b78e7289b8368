// CPU glue of decode_attention: argument checks, allocation, the kernel of the best ISA level
// (decode_attention_kernel.cpp), registration.
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include "../decode_attention.h"
#include "isa.h"

namespace pytransformer::cpu {
KernelTable<DecodeAttentionCpuFn> decode_attention_kernel;

namespace {
at::Tensor decode_attention_cpu(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                const at::Tensor& cache_lengths, double scale, std::optional<int64_t> window,
                                std::optional<int64_t> max_length) {
  const at::Tensor q = unit_last_stride(q_in), k = unit_last_stride(k_in), v = unit_last_stride(v_in);
  const DecodeAttentionParams p = check_decode_attention_args(q, k, v, cache_lengths, scale, window);
  if (max_length) check_length_bound(*max_length, p);
  const at::Tensor lengths = cache_lengths.to(at::kLong).contiguous();  // [B]
  check_cache_lengths(lengths.const_data_ptr<int64_t>(), p);
  at::Tensor out = at::empty({p.batch, p.q_heads, p.q_len, p.v_head_dim}, q.options());  // [B, Hq, T, Dv]
  decode_attention_kernel.get()(p, q.scalar_type(), q.const_data_ptr(), k.const_data_ptr(), v.const_data_ptr(),
                                lengths.const_data_ptr<int64_t>(), out.mutable_data_ptr());
  return out;
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) { m.impl("decode_attention", &decode_attention_cpu); }

}  // namespace pytransformer::cpu
