// CPU glue of attention: argument checks, operands in the accumulation type with padded rows, the kernels of the best
// ISA level (attention_kernel.cpp), GQA reduction of grad_k / grad_v, registration.
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "../attention.h"
#include "isa.h"

namespace pytransformer::cpu {
KernelTable<AttentionCpuFwdFn> attention_fwd_kernel;
KernelTable<AttentionCpuBwdFn> attention_bwd_kernel;

namespace {
// t in the accumulation type with a contiguous last dim, zero-padded to a multiple of kPadBytes when `pad`
// (no copy when t already is so).
at::Tensor prepare(const at::Tensor& t, at::ScalarType acc, bool pad) {
  at::Tensor r = t.to(acc);
  if (r.stride(-1) != 1) r = r.contiguous();
  const int64_t n = r.size(-1), width = round_up(n, kPadBytes / static_cast<int64_t>(c10::elementSize(acc)));
  return pad && width != n ? at::constant_pad_nd(r, {0, width - n}) : r;
}

std::tuple<at::Tensor, at::Tensor> attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const std::optional<at::Tensor>& mask, bool causal,
                                                 std::optional<int64_t> window,
                                                 const std::optional<at::Tensor>& key_lengths, double scale) {
  check_attention_args(q, k, v, mask, window, key_lengths, scale);
  const at::ScalarType acc = attention_acc_dtype(q);
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), v.size(3)}, q.options());
  at::Tensor lse = empty_lse(q);
  if (out.numel() == 0) return {out, lse};
  at::Tensor out_acc = q.scalar_type() == acc ? out : at::empty(out.sizes(), out.options().dtype(acc));
  at::Tensor q_ = prepare(q, acc, false), k_ = prepare(k, acc, false), v_ = prepare(v, acc, true);
  at::Tensor mask_ = prepare_mask(mask, q, k.size(2)), lengths = prepare_key_lengths(key_lengths);
  const AttentionParams p = make_attention_params(q_, k_, v_, out_acc, lse, mask_, causal, window, lengths, q.size(3),
                                                  v.size(3), scale);
  attention_fwd_kernel.get()(p, acc == at::kDouble);
  if (!out_acc.is_same(out)) out.copy_(out_acc);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_cpu(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& mask, bool causal, std::optional<int64_t> window,
    const std::optional<at::Tensor>& key_lengths, double scale) {
  check_attention_args(q, k, v, mask, window, key_lengths, scale);
  check_attention_backward_args(grad_out, q, v, out, lse);
  const at::ScalarType acc = attention_acc_dtype(q);
  const int64_t B = q.size(0), Hq = q.size(1), Hkv = k.size(1), Lq = q.size(2), Lk = k.size(2);
  const int64_t D = q.size(3), Dv = v.size(3);
  at::Tensor q_ = prepare(q, acc, true), k_ = prepare(k, acc, true), v_ = prepare(v, acc, false);
  at::Tensor go_ = prepare(grad_out, acc, true), out_ = prepare(out, acc, false);
  at::Tensor mask_ = prepare_mask(mask, q, Lk), lengths = prepare_key_lengths(key_lengths), lse_ = lse.contiguous();
  const int64_t Dp = q_.size(3), Dvp = go_.size(3);
  // Gradients in the accumulation type, padded; grad_k/grad_v per query head (summed over each GQA group below).
  at::Tensor gq = at::empty({B, Hq, Lq, Dp}, q.options().dtype(acc));
  at::Tensor gk = at::zeros({B, Hq, Lk, Dp}, q.options().dtype(acc));
  at::Tensor gv = at::zeros({B, Hq, Lk, Dvp}, q.options().dtype(acc));
  if (gq.numel() > 0) {
    AttentionBackwardParams bp{};
    bp.fwd = make_attention_params(q_, k_, v_, out_, lse_, mask_, causal, window, lengths, D, Dv, scale);
    set_operand(go_, bp.grad_out, bp.go_stride);
    set_operand(gq, bp.grad_q, bp.gq_stride);
    set_operand(gk, bp.grad_k, bp.gk_stride);
    set_operand(gv, bp.grad_v, bp.gv_stride);
    attention_bwd_kernel.get()(bp, acc == at::kDouble);
  }
  auto finish = [&](at::Tensor g, int64_t n, int64_t heads) {
    if (heads != Hq) g = at::sum(g.view({B, heads, Hq / heads, g.size(2), g.size(3)}), 2);
    if (g.size(3) != n) g = g.narrow(3, 0, n).contiguous();
    return g.to(q.scalar_type());
  };
  return {finish(gq, D, Hq), finish(gk, D, Hkv), finish(gv, Dv, Hkv)};
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) {
  m.impl("attention", &attention_cpu);
  m.impl("attention_backward", &attention_backward_cpu);
}
}  // namespace pytransformer::cpu
