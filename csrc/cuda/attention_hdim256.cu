// Tensor-core attention kernels for head dims up to 256 (one file per head dim keeps the build parallel).
#include "attention_mma.cuh"

PT_INSTANTIATE_ATTENTION_MMA(256)
