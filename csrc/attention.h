#pragma once
// attention (forward and backward): argument checks shared by the CPU and CUDA glue, and AttentionParams
// (attention_params.h, the kernels' parameters) made from tensors.
//
// Shapes: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] -> out [B, Hq, Lq, Dv], lse [B, Hq, Lq].
// Visibility of key j to query i of batch row b is the AND of: the mask (bool: True = may attend; float: added to
// the score, -inf removes), causal (j <= i + Lk - Lq), window W (j > i + Lk - Lq - W, implies causal) and
// key_lengths (j < key_lengths[b]). lse is the row's log-sum-exp of the scaled, masked scores in the accumulation
// type (float32; float64 for float64 input), -inf for a row that sees no key (its output is zero).
#include "attention_params.h"
#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace pytransformer {

// ---- argument checks (host only) ----

inline int64_t check_positive_window(std::optional<int64_t> window) {
  TORCH_CHECK_VALUE(!window || *window >= 1, "window: expected a positive number of keys, got ", *window);
  return window ? *window : 0;
}

// Checks q, k, v, mask, window and key_lengths against each other (see the shapes above), and a finite scale.
inline void check_attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const std::optional<at::Tensor>& mask, std::optional<int64_t> window,
                                 const std::optional<at::Tensor>& key_lengths, double scale) {
  check_float_dtype(q, "q");
  check_dim(q, "q", 4, "[B, Hq, Lq, D]");
  check_dim(k, "k", 4, "[B, Hkv, Lk, D]");
  check_dim(v, "v", 4, "[B, Hkv, Lk, Dv]");
  check_like(k, "k", q, "q");
  check_like(v, "v", q, "q");
  const int64_t B = q.size(0), Hq = q.size(1), Lq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Lk = k.size(2);
  TORCH_CHECK_VALUE(D >= 1 && v.size(3) >= 1, "q, v: expected head dims D >= 1 and Dv >= 1, got q ", q.sizes(),
                    " and v ", v.sizes());
  TORCH_CHECK_VALUE(k.size(0) == B && k.size(3) == D && Hkv >= 1, "k: expected shape [", B, ", Hkv, Lk, ", D,
                    "] (B and D of q, Hkv >= 1), got ", k.sizes());
  TORCH_CHECK_VALUE(Hq % Hkv == 0, "k: the number of query heads (", Hq,
                    ") must be a multiple of the number of key/value heads (", Hkv, ")");
  TORCH_CHECK_VALUE(v.size(0) == B && v.size(1) == Hkv && v.size(2) == Lk, "v: expected shape [", B, ", ", Hkv, ", ",
                    Lk, ", Dv] (B, Hkv and Lk of k), got ", v.sizes());
  check_positive_window(window);
  TORCH_CHECK_VALUE(std::isfinite(scale), "scale: expected a finite value, got ", scale);
  if (mask) {
    check_like(*mask, "mask", q, "q", false);
    TORCH_CHECK_VALUE(mask->scalar_type() == at::kBool || at::isFloatingType(mask->scalar_type()),
                      "mask: expected a bool (True = may attend) or floating (added to the scores) tensor, got ",
                      mask->scalar_type());
    const int64_t full[4] = {B, Hq, Lq, Lk};
    bool ok = mask->dim() <= 4;
    for (int64_t d = 0; ok && d < mask->dim(); ++d) {
      const int64_t s = mask->size(mask->dim() - 1 - d);
      ok = s == 1 || s == full[3 - d];
    }
    TORCH_CHECK_VALUE(ok, "mask: expected a shape that broadcasts to [B, Hq, Lq, Lk] = [", B, ", ", Hq, ", ", Lq, ", ",
                      Lk, "], got ", mask->sizes());
  }
  if (key_lengths) {
    check_like(*key_lengths, "key_lengths", q, "q", false);
    TORCH_CHECK_VALUE(!at::isFloatingType(key_lengths->scalar_type()) && !at::isComplexType(key_lengths->scalar_type()) &&
                          key_lengths->scalar_type() != at::kBool,
                      "key_lengths: expected an integer tensor, got ", key_lengths->scalar_type());
    TORCH_CHECK_VALUE(key_lengths->dim() == 1 && key_lengths->size(0) == B, "key_lengths: expected shape [", B,
                      "] (one length per batch row), got ", key_lengths->sizes());
  }
}

inline at::ScalarType attention_acc_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// lse of the forward: [B, Hq, Lq] in the accumulation type.
inline at::Tensor empty_lse(const at::Tensor& q) {
  return q.new_empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(attention_acc_dtype(q)));
}

inline void check_attention_backward_args(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& v,
                                          const at::Tensor& out, const at::Tensor& lse) {
  const std::vector<int64_t> shape{q.size(0), q.size(1), q.size(2), v.size(3)};
  const at::IntArrayRef expected(shape);
  check_like(grad_out, "grad_out", q, "q");
  TORCH_CHECK_VALUE(grad_out.sizes() == expected, "grad_out: expected shape ", expected, ", got ", grad_out.sizes());
  check_like(out, "out", q, "q");
  TORCH_CHECK_VALUE(out.sizes() == expected, "out: expected shape ", expected, ", got ", out.sizes());
  TORCH_CHECK_VALUE(lse.device() == q.device() && lse.scalar_type() == attention_acc_dtype(q) &&
                        lse.sizes() == q.sizes().slice(0, 3),
                    "lse: expected the forward's log-sum-exp, ", attention_acc_dtype(q), " of shape ",
                    q.sizes().slice(0, 3), ", got ", lse.scalar_type(), " of shape ", lse.sizes());
}

// The mask as [B, Hq, Lq, Lk] strides over its own storage (float masks converted to the accumulation type), or an
// undefined tensor.
inline at::Tensor prepare_mask(const std::optional<at::Tensor>& mask, const at::Tensor& q, int64_t len_k) {
  if (!mask) return at::Tensor();
  at::Tensor m = mask->scalar_type() == at::kBool ? *mask : mask->to(attention_acc_dtype(q));
  return m.expand({q.size(0), q.size(1), q.size(2), len_k});
}

// key_lengths as int64, contiguous, or an undefined tensor.
inline at::Tensor prepare_key_lengths(const std::optional<at::Tensor>& key_lengths) {
  return key_lengths ? key_lengths->to(at::kLong).contiguous() : at::Tensor();
}

// Sets ptr and the [B, H, L] strides of `t` ([B, H, L, *] with a contiguous last dim).
template <class Ptr>
void set_operand(const at::Tensor& t, Ptr& ptr, int64_t (&stride)[3]) {
  ptr = static_cast<Ptr>(t.data_ptr());
  for (int d = 0; d < 3; ++d) stride[d] = t.stride(d);
}

// AttentionParams over prepared tensors: q, k, v and out have contiguous last dims (their head dims are read from
// them, so padded copies work), mask is expanded to [B, Hq, Lq, Lk] (float masks in the accumulation type), lse is
// contiguous and key_lengths is int64 and contiguous.
inline AttentionParams make_attention_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& out, const at::Tensor& lse, const at::Tensor& mask,
                                             bool causal, std::optional<int64_t> window,
                                             const at::Tensor& key_lengths, int64_t dim, int64_t dim_v,
                                             double scale) {
  AttentionParams p{};
  p.batch = q.size(0), p.heads_q = q.size(1), p.heads_kv = k.size(1), p.len_q = q.size(2), p.len_k = k.size(2);
  p.dim = dim, p.dim_v = dim_v;
  set_operand(q, p.q, p.q_stride);
  set_operand(k, p.k, p.k_stride);
  set_operand(v, p.v, p.v_stride);
  set_operand(out, p.out, p.o_stride);
  p.lse = lse.data_ptr();
  p.mask_kind = !mask.defined() ? MaskKind::kNone : mask.scalar_type() == at::kBool ? MaskKind::kBool : MaskKind::kFloat;
  if (mask.defined()) {
    p.mask = mask.data_ptr();
    for (int d = 0; d < 4; ++d) p.mask_stride[d] = mask.stride(d);
  }
  p.window = check_positive_window(window);
  p.causal = causal || p.window > 0;
  p.key_lengths = key_lengths.defined() ? key_lengths.const_data_ptr<int64_t>() : nullptr;
  p.scale = scale;
  return p;
}

namespace cpu {
// The CPU kernels (csrc/cpu/attention_kernel.cpp) take operands in the accumulation type (float64 when `is_double`,
// else float32) whose last dim is contiguous and, where it is the vector dim of a product, zero-padded to a multiple
// of kPadBytes (the widest vector of any ISA level).
using AttentionCpuFwdFn = void (*)(const AttentionParams& p, bool is_double);
using AttentionCpuBwdFn = void (*)(const AttentionBackwardParams& p, bool is_double);
constexpr int64_t kPadBytes = 64;
}  // namespace cpu

}  // namespace pytransformer
