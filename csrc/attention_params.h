#pragma once
// attention's kernel parameters: AttentionParams, the plain struct (sizes, element strides, raw pointers, flags) that
// the CPU and CUDA kernels take, so that kernels never see a Tensor, and the visibility geometry (which keys a query
// sees) that kernels and glue share. Shapes and masking conventions: attention.h. Only standard headers: a unit of
// CUDA kernels alone (cuda/attention_hdim<D>.cu) compiles without parsing torch's.
#include <cstdint>

#include "host_namespace.h"

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

// The rest is shared host (and device) code: one copy per compiler (see host_namespace.h). The structs
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

}  // namespace PT_HOST_NAMESPACE
}  // namespace pytransformer
