#pragma once
// The launch function of the decode_attention kernels (decode_attention_kernel.cuh) as the glue
// (decode_attention.cpp) calls it, and its parameters: T is the storage type (float, __half, __nv_bfloat16),
// instantiated in decode_attention_kernel.cu.
#include "../decode_attention_params.h"
#include "launch.h"

namespace pytransformer::cuda {

constexpr int kDecodeMaxHeadDim = 256;  // D and Dv: the registers of a thread hold up to 8 elements of a row

template <typename T>
struct DecodeArgs {
  DecodeAttentionParams p;
  const T* q;        // [B, Hq, T, D] through p.q_stride
  const T* k;        // [B, Hkv, capacity, D] through p.k_stride
  const T* v;        // [B, Hkv, capacity, Dv] through p.v_stride
  T* out;            // [B, Hq, T, Dv] contiguous
  float* part_o;     // [splits, B * Hq * T, Dv] unnormalised outputs, or null when splits == 1
  float2* part_ml;   // [splits, B * Hq * T] (running max in log2 units, sum of exponentials), 16-byte aligned
  IndexVector lengths;
  float scale_log2;  // scale * log2(e)
  int lanes;         // threads per key row
  int passes;        // ceil(M / kRows)
  int splits;
};

// Stream-ordered; the caller has checked the arguments and set the device. `packed`: K and V rows 16-byte aligned
// (base pointers and row strides) and D, Dv multiples of the pack. The launch sets lanes, passes and splits, and
// takes the partials' buffer from alloc_floats when it splits the keys.
template <typename T>
void launch_decode_attention(DecodeArgs<T> a, bool packed, cudaStream_t stream, FloatAlloc alloc_floats);

}  // namespace pytransformer::cuda
