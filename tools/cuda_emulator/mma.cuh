#pragma once
// Host stand-in for csrc/cuda/mma.cuh (same functions, same fragment layouts; see there). The warp's lanes meet in
// emu::warp_exchange, so that each lane computes its part of ldmatrix / mma.sync from what all 32 lanes hold.
// cp.async copies land when the thread waits for their group (cp_async_wait), not before, so that a read of a tile
// before its wait sees stale data here as it may on the GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace pytransformer::cuda {

using Frag = uint32_t[4];

inline int lane_id() { return static_cast<int>(emu::linear_tid() % 32); }

template <bool kTrans>
inline void ldmatrix_x4(uint32_t (&r)[4], const void* row_addr) {
  emu::check_smem_access(row_addr, 16, "ldmatrix row");
  const auto rows = emu::warp_exchange(static_cast<const uint16_t*>(row_addr));  // [lane] -> its row of 8 values
  const unsigned lane = emu::linear_tid() % 32, g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const uint16_t lo = kTrans ? rows[8 * i + 2 * t][g] : rows[8 * i + g][2 * t];
    const uint16_t hi = kTrans ? rows[8 * i + 2 * t + 1][g] : rows[8 * i + g][2 * t + 1];
    r[i] = uint32_t(lo) | uint32_t(hi) << 16;
  }
}

template <bool kTrans, typename T>
inline void ldsm_rows_first(uint32_t (&r)[4], const T* s, int ld, int row0, int col0) {
  const int l = emu::linear_tid() % 32;
  ldmatrix_x4<kTrans>(r, s + (row0 + l % 8 + 8 * (l / 8 % 2)) * ld + col0 + 8 * (l / 16));
}
template <bool kTrans, typename T>
inline void ldsm_cols_first(uint32_t (&r)[4], const T* s, int ld, int row0, int col0) {
  const int l = emu::linear_tid() % 32;
  ldmatrix_x4<kTrans>(r, s + (row0 + l % 8 + 8 * (l / 16)) * ld + col0 + 8 * (l / 8 % 2));
}
template <typename T>
inline void load_a(Frag& a, const T* s, int ld, int row0, int k0) { ldsm_rows_first<false>(a, s, ld, row0, k0); }
template <typename T>
inline void load_a_t(Frag& a, const T* s, int ld, int k0, int m0) { ldsm_cols_first<true>(a, s, ld, k0, m0); }
template <typename T>
inline void load_b_nk(Frag& b, const T* s, int ld, int n0, int k0) { ldsm_cols_first<false>(b, s, ld, n0, k0); }
template <typename T>
inline void load_b_kn(Frag& b, const T* s, int ld, int k0, int n0) { ldsm_rows_first<true>(b, s, ld, k0, n0); }

template <typename T>
inline float half_bits_to_float(uint16_t bits) {
  if constexpr (std::is_same_v<T, __half>) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  } else {
    const uint32_t w = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &w, 4);
    return f;
  }
}

template <typename T>
inline void mma_16816(float (&c)[4], const Frag& a, const uint32_t* b) {
  struct Operands {
    uint32_t a[4], b[2];
  };
  const auto all = emu::warp_exchange(Operands{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}});
  // Element (row, k) of A and (k, col) of B from the lanes that hold them (layouts in csrc/cuda/mma.cuh).
  auto A = [&](int row, int k) {
    const int lane = 4 * (row % 8) + (k % 8) / 2, reg = (row / 8) + 2 * (k / 8);
    return half_bits_to_float<T>(uint16_t(all[lane].a[reg] >> (16 * (k % 2))));
  };
  auto B = [&](int k, int col) {
    const int lane = 4 * col + (k % 8) / 2, reg = k / 8;
    return half_bits_to_float<T>(uint16_t(all[lane].b[reg] >> (16 * (k % 2))));
  };
  const unsigned lane = emu::linear_tid() % 32, g = lane / 4, t = lane % 4;
  for (int e = 0; e < 4; ++e) {
    const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
    float acc = c[e];
    for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
    c[e] = acc;
  }
}

template <typename T>
inline uint32_t pack2(float lo, float hi) {
  uint32_t r;
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    std::memcpy(&r, &h, 4);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    std::memcpy(&r, &h, 4);
  }
  return r;
}

inline void cp_async_16(void* dst, const void* src, bool valid) {
  emu::check_smem_access(dst, 16, "cp.async destination");
  if (valid && reinterpret_cast<uintptr_t>(src) % 16) {
    fprintf(stderr, "emu: cp.async source %p not 16-byte aligned\n", src);
    abort();
  }
  emu::async_copy(dst, valid ? src : nullptr, 16);
}
inline void cp_async_commit() { emu::async_commit(); }
template <int kPending>
inline void cp_async_wait() {
  emu::async_wait(kPending);
}

}  // namespace pytransformer::cuda
