#pragma once
// masked_softmax's kernel parameters and the row geometry that the CPU and CUDA kernels share: where each row of a
// mask starts, and which columns causal masking leaves visible (conventions: masked_softmax.h). Only standard headers:
// the CUDA kernel unit (cuda/masked_softmax_kernel.cu) compiles without parsing torch's.
#include <cstdint>

#include "host_namespace.h"

namespace pytransformer {

// Where each row of a mask expanded to scores' shape starts. Rows are scores' leading dims flattened row-major;
// those dims are coalesced (size-1 dims dropped, mergeable neighbours merged) into at most kMaxDims, so that a
// [Lq, Lk] mask over [B, H, Lq, Lk] scores is 2 dims {B*H: stride 0, Lq: stride Lk}. Plain data: pass it to a
// CUDA kernel by value.
struct MaskLayout {
  static constexpr int kMaxDims = 6;
  int ndim = 0;                     // coalesced leading dims, outermost first
  int64_t sizes[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};   // in elements
  int64_t col_stride = 0;           // stride of the last dim: 1 contiguous, 0 broadcast
};

// The functions are shared host (and device) code: one copy per compiler (see host_namespace.h).
inline namespace PT_HOST_NAMESPACE {

// The offset (in elements) of row `row`'s first element in a mask laid out as `ml` says.
PT_HOST_DEVICE inline int64_t mask_row_offset(const MaskLayout& ml, int64_t row) {
  int64_t off = 0;
  for (int d = ml.ndim - 1; d >= 0; --d) {
    off += (row % ml.sizes[d]) * ml.strides[d];
    row /= ml.sizes[d];
  }
  return off;
}

// Number of leading columns that causal masking leaves visible in row `row` of scores.view(-1, lk) whose
// second-to-last dim is lq: query i = row % lq sees keys j <= i + lk - lq (0 columns when that is negative).
PT_HOST_DEVICE inline int64_t causal_cols(int64_t row, int64_t lq, int64_t lk) {
  const int64_t n = row % lq + lk - lq + 1;
  return n < 0 ? 0 : (n > lk ? lk : n);
}

}  // namespace PT_HOST_NAMESPACE
}  // namespace pytransformer
