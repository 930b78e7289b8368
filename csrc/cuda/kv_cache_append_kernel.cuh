#pragma once
// CUDA kernel of kv_cache_append: copies k_new / v_new [B, Hkv, T, D|Dv] into the caches [B, Hkv, capacity, D|Dv] at
// rows positions[b] .. positions[b] + T - 1. A pure copy: bytes = 2 * B * Hkv * T * (D + Dv) * elem (read + write),
// no arithmetic; the floor is those bytes over the copy bandwidth.
//
// Layout: blockIdx.z picks the tensor (0: keys, 1: values), blockIdx.y walks the (b, head) planes, blockIdx.x the
// rows t of a plane. A row of n elements is kVec-element chunks (16-byte packs when every row is aligned, else single
// elements); a group of row_threads = min(32, pow2 >= chunks) threads copies a row, a block holds several row groups,
// and each thread loads kAppendUnroll rows' chunks before storing any (several 16-byte loads in flight a thread).
#include "common.cuh"
#include "kv_cache_append_launch.h"

namespace pytransformer::cuda {

constexpr int kAppendThreads = 256;
constexpr int kAppendUnroll = 4;

// Threads per row for rows of `chunks` chunks: a power of two, at most a warp.
__host__ __device__ __forceinline__ int append_row_threads(int64_t chunks) {
  int t = 1;
  while (t < 32 && t < chunks) t *= 2;
  return t;
}

// U: the unit copied, uint4 (a 16-byte pack: one vector load and store) or E.
template <typename E, typename U>
__global__ void __launch_bounds__(kAppendThreads) kv_cache_append_kernel(AppendArgs<E> a) {
  constexpr int kVec = sizeof(U) / sizeof(E);
  const KvCacheAppendParams& p = a.p;
  const bool values = blockIdx.z == 1;
  const int64_t* cs = values ? p.v_cache_stride : p.k_cache_stride;  // [B, Hkv, L, D] element strides
  const int64_t* ns = values ? p.v_new_stride : p.k_new_stride;
  const int64_t chunks = (values ? p.v_head_dim : p.head_dim) / kVec;
  const int row_threads = append_row_threads(chunks);
  const int lane = threadIdx.x % row_threads, rows_per_block = blockDim.x / row_threads;
  const int64_t row_step = int64_t(gridDim.x) * rows_per_block;  // between the rows a thread copies
  for (int64_t bh = blockIdx.y; bh < p.batch * p.kv_heads; bh += gridDim.y) {
    const int64_t b = bh / p.kv_heads, h = bh % p.kv_heads, pos = a.positions.at(b);
    if (pos < 0 || pos > p.capacity - p.new_len) continue;  // only under graph capture (see glue.h)
    E* dst = a.cache[values] + b * cs[0] + h * cs[1] + pos * cs[2];
    const E* src = a.src[values] + b * ns[0] + h * ns[1];
    for (int64_t t = blockIdx.x * rows_per_block + threadIdx.x / row_threads; t < p.new_len;
         t += kAppendUnroll * row_step) {
      for (int64_t c = lane; c < chunks; c += row_threads) {
        U v[kAppendUnroll];
#pragma unroll
        for (int u = 0; u < kAppendUnroll; ++u) {
          const int64_t tu = t + u * row_step;
          if (tu < p.new_len) v[u] = *reinterpret_cast<const U*>(src + tu * ns[2] + c * kVec * ns[3]);
        }
#pragma unroll
        for (int u = 0; u < kAppendUnroll; ++u) {
          const int64_t tu = t + u * row_step;
          if (tu < p.new_len) *reinterpret_cast<U*>(dst + tu * cs[2] + c * kVec * cs[3]) = v[u];
        }
      }
    }
  }
}

template <typename E>
void launch_kv_cache_append(const AppendArgs<E>& a, bool packed, cudaStream_t stream) {
  constexpr int kPack = 16 / sizeof(E);
  const int vec = packed ? kPack : 1;
  const int row_threads = append_row_threads((std::max(a.p.head_dim, a.p.v_head_dim) + vec - 1) / vec);
  const int64_t rows_per_block = kAppendThreads / row_threads;
  const int64_t planes = a.p.batch * a.p.kv_heads;
  const dim3 grid(unsigned(std::min<int64_t>((a.p.new_len + rows_per_block * kAppendUnroll - 1) /
                                                 (rows_per_block * kAppendUnroll), int64_t(1) << 20)),
                  unsigned(std::min<int64_t>(planes, 65535)), 2);
  if (packed) {
    kv_cache_append_kernel<E, uint4><<<grid, kAppendThreads, 0, stream>>>(a);
  } else {
    kv_cache_append_kernel<E, E><<<grid, kAppendThreads, 0, stream>>>(a);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace pytransformer::cuda
