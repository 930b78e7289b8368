#pragma once
// The launch functions of the masked_softmax kernels (masked_softmax_kernel.cuh) as the glue (masked_softmax.cpp)
// calls them, and their parameters: T is the storage type (float, __half, __nv_bfloat16), instantiated in
// masked_softmax_kernel.cu.
#include "../masked_softmax_params.h"
#include "launch.h"

namespace pytransformer::cuda {

template <typename T>
struct SoftmaxFwdParams {
  const T* scores;    // [rows, lk]
  T* out;             // [rows, lk]
  const void* mask;   // null, or bool / T elements: row r at mask + mask_row_offset(layout, r), column j at
                      // j * col_stride
  bool bool_mask;
  MaskLayout layout;
  int64_t rows, lk;
  int64_t lq;         // causal: scores' second-to-last dim (row r is query r % lq); 0: not causal
  float scale;
};

template <typename T>
struct SoftmaxBwdParams {
  const T* grad_out;  // [rows, lk]
  const T* out;       // [rows, lk]
  T* grad;            // [rows, lk]
  int64_t rows, lk;
  float scale;
};

// Stream-ordered; the caller has checked the arguments and set the device. can_vec: scores and out (grad_out, out and
// grad for the backward) are 16-byte aligned (lk % kPackElems<T> == 0 is checked there).
template <typename T>
void launch_masked_softmax_fwd(const SoftmaxFwdParams<T>& p, bool can_vec, cudaStream_t stream);
template <typename T>
void launch_masked_softmax_bwd(const SoftmaxBwdParams<T>& p, bool can_vec, cudaStream_t stream);

}  // namespace pytransformer::cuda
