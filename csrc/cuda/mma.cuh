#pragma once
// Warp-level tensor-core and async-copy primitives (sm_80+) through inline PTX, for the attention kernels.
//
// mma.sync.m16n8k16 (row.col), 16-bit inputs, float32 accumulators. Lane l of a warp is (g, t) = (l / 4, l % 4):
//   A 16x16 (4 regs of 2 elements): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B 16x8  (2 regs):               b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C 16x8  (4 floats):             c0, c1 = C[g][2t..2t+1], c2, c3 = C[g+8][2t..2t+1]
// ldmatrix.x4 loads four 8x8 16-bit matrices from shared memory (.x1, .x2: one, two); lanes 8i..8i+7 give the row
// addresses of matrix i and every lane gets, of each matrix, row g, elements 2t..2t+1 (.trans: column g, elements
// 2t..2t+1). The four loaders below place the matrices so that the registers come out as the fragments above, from 16x16 blocks of
// row-major shared-memory tiles with `ld` elements per row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace pytransformer::cuda {

using Frag = uint32_t[4];  // an A fragment, or B fragments of two adjacent n-tiles ({b0, b1}, {b0, b1})

// ---- instruction primitives ----
// The only code of this file that a host build replaces: with PT_CUDA_EMULATOR defined, the host emulator
// (tools/cuda_emulator/ptx.h) supplies these same functions, and everything else here (the fragment loaders' address
// math, pack2) runs as written. Tensor-core code needs sm_80 (mma.sync with bf16, cp.async): PT_TENSOR_CORES is 0 in
// a device pass for an older architecture, where the tensor-core kernels compile to empty bodies (the glue never
// launches them there: use_mma checks the device's compute capability).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define PT_TENSOR_CORES 1
#else
#define PT_TENSOR_CORES 0
#endif

#ifdef PT_CUDA_EMULATOR
}  // namespace pytransformer::cuda
#include "ptx.h"
namespace pytransformer::cuda {
#else

// The lane index, read afresh at each call (volatile: not shared with an earlier read), so that code off the hot
// path (the attention kernels' per-element masking) does not keep a lane-derived value live, or spilled, across it.
__device__ __forceinline__ int lane_id() {
  int lane;
  asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane));
  return lane;
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ldmatrix .x1, .x2 or .x4 (kNum matrices): lanes 8i..8i+7 pass the row addresses of matrix i (the other lanes'
// addresses are ignored); r[i] is matrix i's fragment. "memory": the shared memory it reads is written by ordinary
// stores the compiler must not move past it.
template <bool kTrans, int kNum>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[kNum], const void* row_addr) {
  static_assert(kNum == 1 || kNum == 2 || kNum == 4);
#define PT_LDMATRIX(SHAPE, REGS, ...)                                                                              \
  if constexpr (kTrans) {                                                                                          \
    asm volatile("ldmatrix.sync.aligned.m8n8." SHAPE ".trans.shared.b16 " REGS ";\n"                               \
                 : __VA_ARGS__ : "r"(smem_addr(row_addr)) : "memory");                                             \
  } else {                                                                                                         \
    asm volatile("ldmatrix.sync.aligned.m8n8." SHAPE ".shared.b16 " REGS ";\n"                                     \
                 : __VA_ARGS__ : "r"(smem_addr(row_addr)) : "memory");                                             \
  }
  if constexpr (kNum == 1) {
    PT_LDMATRIX("x1", "{%0}, [%1]", "=r"(r[0]))
  } else if constexpr (kNum == 2) {
    PT_LDMATRIX("x2", "{%0, %1}, [%2]", "=r"(r[0]), "=r"(r[1]))
  } else {
    PT_LDMATRIX("x4", "{%0, %1, %2, %3}, [%4]", "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]))
  }
#undef PT_LDMATRIX
}

// c += a * b for one 16x8 tile (m16n8k16, .row.col, float32 accumulators); b points at the tile's {b0, b1}.
#define PT_MMA_16816(TYPE)                                                                                  \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE                                      \
               ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"                    \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                            \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const Frag& a, const uint32_t* b) {
  if constexpr (std::is_same_v<T, __half>) {
    PT_MMA_16816("f16");
  } else {
    static_assert(std::is_same_v<T, __nv_bfloat16>);
    PT_MMA_16816("bf16");
  }
}
#undef PT_MMA_16816

// 16 bytes from global `src` to shared `dst`, asynchronously; with !valid the 16 bytes are zeros (src not read).
// "memory" on these three: shared memory changes behind the compiler's back until the wait.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

#endif  // PT_CUDA_EMULATOR

// ---- fragment loaders and packing (as shipped on every target) ----

// Matrix i of the x4 load at (row0 + 8 * (i % 2), col0 + 8 * (i / 2)): an A fragment of A = S[row0.., col0..]
// (kTrans = false), or B fragments of B = S[row0.., col0..] for the n-tiles col0 and col0 + 8 (kTrans = true).
template <bool kTrans, typename T>
__device__ __forceinline__ void ldsm_rows_first(uint32_t (&r)[4], const T* s, int ld, int row0, int col0) {
  const int l = threadIdx.x % 32;
  ldmatrix<kTrans>(r, s + (row0 + l % 8 + 8 * (l / 8 % 2)) * ld + col0 + 8 * (l / 16));
}

// Matrix i at (row0 + 8 * (i / 2), col0 + 8 * (i % 2)): B fragments of B^T = S[row0.., col0..] for the n-tiles
// row0 and row0 + 8 (kTrans = false), or an A fragment of A^T = S[row0.., col0..] (kTrans = true).
template <bool kTrans, typename T>
__device__ __forceinline__ void ldsm_cols_first(uint32_t (&r)[4], const T* s, int ld, int row0, int col0) {
  const int l = threadIdx.x % 32;
  ldmatrix<kTrans>(r, s + (row0 + l % 8 + 8 * (l / 16)) * ld + col0 + 8 * (l / 8 % 2));
}

// A fragment of A = S[row0.., k0..] (S row-major [m][k]).
template <typename T>
__device__ __forceinline__ void load_a(Frag& a, const T* s, int ld, int row0, int k0) {
  ldsm_rows_first<false>(a, s, ld, row0, k0);
}
// A fragment of A = S^T[m0.., k0..] (S row-major [k][m]).
template <typename T>
__device__ __forceinline__ void load_a_t(Frag& a, const T* s, int ld, int k0, int m0) {
  ldsm_cols_first<true>(a, s, ld, k0, m0);
}
// B fragments of n-tiles n0, n0 + 8 for B = S^T (S row-major [n][k], e.g. K in Q K^T).
template <typename T>
__device__ __forceinline__ void load_b_nk(Frag& b, const T* s, int ld, int n0, int k0) {
  ldsm_cols_first<false>(b, s, ld, n0, k0);
}
// B fragments of n-tiles n0, n0 + 8 for B = S (S row-major [k][n], e.g. V in P V).
template <typename T>
__device__ __forceinline__ void load_b_kn(Frag& b, const T* s, int ld, int k0, int n0) {
  ldsm_rows_first<true>(b, s, ld, k0, n0);
}

// Two float32 values as a register of two T (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    r = *reinterpret_cast<const uint32_t*>(&h);
  }
  return r;
}

}  // namespace pytransformer::cuda
