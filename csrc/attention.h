#pragma once
// attention (forward and backward): argument checks shared by the CPU and CUDA glue, and AttentionParams, the plain
// struct (sizes, element strides, raw pointers, flags) that the kernels take, so that kernels never see a Tensor.
//
// Shapes: q [B, Hq, Lq, D], k [B, Hkv, Lk, D], v [B, Hkv, Lk, Dv] -> out [B, Hq, Lq, Dv], lse [B, Hq, Lq].
// Visibility of key j to query i of batch row b is the AND of: the mask (bool: True = may attend; float: added to
// the score, -inf removes), causal (j <= i + Lk - Lq), window W (j > i + Lk - Lq - W, implies causal) and
// key_lengths (j < key_lengths[b]). lse is the row's log-sum-exp of the scaled, masked scores in the accumulation
// type (float32; float64 for float64 input), -inf for a row that sees no key (its output is zero).
#include "common.h"

#include <ATen/ops/empty.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#ifdef __CUDACC__
#define PT_HOST_DEVICE __host__ __device__
#else
#define PT_HOST_DEVICE
#endif

namespace pytransformer {

enum class MaskKind : int { kNone = 0, kBool = 1, kFloat = 2 };

// Everything an attention kernel needs. Strides are in elements and cover [B, H, L] (the last dim of every tensor is
// contiguous); a broadcast dimension has stride 0. Float masks are in the accumulation type.
struct AttentionParams {
  int64_t batch, heads_q, heads_kv, len_q, len_k, dim, dim_v;
  const void* q;
  const void* k;
  const void* v;
  int64_t q_stride[3], k_stride[3], v_stride[3];
  void* out;  // [B, Hq, Lq, Dv] (strided like o_stride)
  int64_t o_stride[3];
  void* lse;  // [B, Hq, Lq], contiguous
  MaskKind mask_kind;
  const void* mask;  // [B, Hq, Lq, Lk] through mask_stride (broadcast dims have stride 0)
  int64_t mask_stride[4];
  bool causal;                 // true whenever window > 0
  int64_t window;              // 0: no window
  const int64_t* key_lengths;  // [B] or nullptr
  double scale;
  // CUDA only (nullptr elsewhere): the tensor-core kernels set *non_finite = 1 when a row they write is not finite;
  // given it, the SIMT kernels are the fix-up pass after them (cuda/attention_mma.cuh, "Hidden keys and mma.sync").
  int* non_finite;
};

// The backward adds the incoming gradient, the saved forward output and the gradients it writes (same conventions;
// grad_k/grad_v are per query head, [B, Hq, Lk, *], so that a GQA group's sum is left to the caller).
struct AttentionBackwardParams {
  AttentionParams fwd;  // fwd.out is the saved output, fwd.lse the saved log-sum-exp
  const void* grad_out;
  int64_t go_stride[3];
  void* grad_q;
  void* grad_k;
  void* grad_v;
  int64_t gq_stride[3], gk_stride[3], gv_stride[3];
};

// The rest is shared host (and device) code: one copy per compiler (see PT_HOST_NAMESPACE in common.h). The structs
// above stay outside it: they are the kernels' parameter types, part of the kernels' names.
inline namespace PT_HOST_NAMESPACE {

// Absolute position of query i: bottom-right alignment, so the last query sits on the last key.
PT_HOST_DEVICE inline int64_t query_position(const AttentionParams& p, int64_t i) { return i + p.len_k - p.len_q; }

// Keys [lo, hi) that causal, window and key_lengths leave visible to at least one of the queries [i0, i1) of batch row
// b (i0 < i1); keys outside it are invisible to all of them and whole blocks of them are skipped. lo >= hi: none.
struct KeyRange {
  int64_t lo, hi;
};
PT_HOST_DEVICE inline KeyRange visible_keys(const AttentionParams& p, int64_t b, int64_t i0, int64_t i1) {
  int64_t lo = 0, hi = p.len_k;
  if (p.key_lengths) hi = p.key_lengths[b] < hi ? p.key_lengths[b] : hi;
  if (p.causal) {
    const int64_t last = query_position(p, i1 - 1) + 1;
    hi = last < hi ? last : hi;
  }
  if (p.window > 0) {
    const int64_t first = query_position(p, i0) - p.window + 1;
    lo = first > lo ? first : lo;
  }
  return {lo, hi};
}

// Queries [lo, hi) that causal and window leave seeing key j (key_lengths and the mask are checked separately): the
// transpose of visible_keys for one key. lo >= hi: none.
PT_HOST_DEVICE inline KeyRange visible_queries(const AttentionParams& p, int64_t j) {
  int64_t lo = 0, hi = p.len_q;
  const int64_t shift = p.len_k - p.len_q;  // query i sits at position i + shift
  if (p.causal) lo = j - shift > lo ? j - shift : lo;
  if (p.window > 0) hi = j - shift + p.window < hi ? j - shift + p.window : hi;
  return {lo, hi};
}

// Whether causal/window hide some key of [j0, j1) from some query of [i0, i1) (then per-element masking is needed).
PT_HOST_DEVICE inline bool block_partially_hidden(const AttentionParams& p, int64_t i0, int64_t i1, int64_t j0,
                                                  int64_t j1) {
  if (!p.causal) return false;
  if (j1 - 1 > query_position(p, i0)) return true;
  return p.window > 0 && j0 <= query_position(p, i1 - 1) - p.window;
}

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
  return at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(attention_acc_dtype(q)));
}

inline void check_attention_backward_args(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& v,
                                          const at::Tensor& out, const at::Tensor& lse) {
  const auto expected = std::vector<int64_t>{q.size(0), q.size(1), q.size(2), v.size(3)};
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

}  // namespace PT_HOST_NAMESPACE

namespace cpu {
// The CPU kernels (csrc/cpu/attention_kernel.cpp) take operands in the accumulation type (float64 when `is_double`,
// else float32) whose last dim is contiguous and, where it is the vector dim of a product, zero-padded to a multiple
// of kPadBytes (the widest vector of any ISA level).
using AttentionCpuFwdFn = void (*)(const AttentionParams& p, bool is_double);
using AttentionCpuBwdFn = void (*)(const AttentionBackwardParams& p, bool is_double);
constexpr int64_t kPadBytes = 64;
}  // namespace cpu

}  // namespace pytransformer
