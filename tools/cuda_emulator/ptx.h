#pragma once
// Host bodies of the instruction primitives of csrc/cuda/mma.cuh (included there, inside namespace
// pytransformer::cuda, when PT_CUDA_EMULATOR is defined): lane_id, ldmatrix (.x1/.x2/.x4, .trans), mma.sync
// m16n8k16 .row.col (f16, bf16; float32 accumulators) and cp.async with commit/wait. Everything else of mma.cuh (the
// fragment loaders' address math, pack2) runs as shipped. The warp's lanes meet in emu::warp_exchange, so that each
// lane computes its part of an ldmatrix / mma.sync from what all 32 lanes hold. The fragment layouts are the PTX ISA's
// (tests/ops/test_ptx_layouts.py checks these bodies against tables written from it). cp.async copies land when the
// thread waits for their group (cp_async_wait), not before, so that a read of a tile before its wait sees stale data
// here as it may on the GPU.
#include <array>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <type_traits>

namespace pytransformer::cuda {

inline int lane_id() { return static_cast<int>(emu::linear_tid() % 32); }

// Lanes 8i..8i+7 give the rows of matrix i (each row 8 16-bit elements, 16-byte aligned); lane (g, t) = (l / 4, l % 4)
// gets, of matrix i, row g elements 2t, 2t + 1 (.trans: column g, rows 2t, 2t + 1), the lower index in the low half.
template <bool kTrans, int kNum>
EMU_RUNTIME inline void ldmatrix(uint32_t (&r)[kNum], const void* row_addr) {
  static_assert(kNum == 1 || kNum == 2 || kNum == 4);
  emu::Quiet quiet;  // the rows are read for their lanes: checked as the reads of the lanes that give their addresses
  const unsigned lane = emu::linear_tid() % 32, g = lane / 4, t = lane % 4;
  if (lane < 8u * kNum) {
    emu::check_smem_access(row_addr, 16, "ldmatrix row");
    emu::check_alignment(row_addr, 16, false);
    emu::shared_access(row_addr, 16, false);
  }
  const auto rows = emu::warp_exchange(static_cast<const uint16_t*>(row_addr));  // [lane] -> its row of 8 values
  for (int i = 0; i < kNum; ++i) {
    const uint16_t lo = kTrans ? rows[8 * i + 2 * t][g] : rows[8 * i + g][2 * t];
    const uint16_t hi = kTrans ? rows[8 * i + 2 * t + 1][g] : rows[8 * i + g][2 * t + 1];
    r[i] = uint32_t(lo) | uint32_t(hi) << 16;
  }
}

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

// The tensor cores' float32 accumulation (as measured on A100: Fasi, Higham, Mikaitis, Pranesh, "Numerical behavior
// of NVIDIA tensor cores", PeerJ CS 2021): the products of 16-bit inputs are exact, each block of 8 of them is added to
// the accumulator in one step and the sum is rounded toward zero (truncated) to float32, not to nearest.
inline float toward_zero(double sum) {
  const float f = float(sum);
  return std::fabs(double(f)) > std::fabs(sum) ? std::nextafter(f, 0.f) : f;
}

// c += a * b, m16n8k16 .row.col: lane (g, t) holds a0 = A[g][2t, 2t+1], a1 = A[g+8][..], a2 = A[g][2t+8, 2t+9],
// a3 = A[g+8][2t+8..]; b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]; c0, c1 = C[g][2t, 2t+1], c2, c3 = C[g+8][..].
template <typename T>
EMU_RUNTIME inline void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t* b) {
  emu::Quiet quiet;
  struct Operands {
    uint32_t a[4], b[2];
  };
  const auto all = emu::warp_exchange(Operands{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}});
  auto A = [&](int row, int k) {  // element (row, k) of A from the lane and register that hold it
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
    for (int k0 = 0; k0 < 16; k0 += 8) {  // float32 accumulation as the tensor cores do it: see toward_zero
      double sum = acc;
      for (int k = k0; k < k0 + 8; ++k) sum += double(A(row, k)) * double(B(k, col));
      acc = toward_zero(sum);
    }
    c[e] = acc;
  }
}

inline void cp_async_16(void* dst, const void* src, bool valid) {
  emu::check_smem_access(dst, 16, "cp.async destination");
  emu::check_alignment(dst, 16, true);
  if (valid) emu::check_alignment(src, 16, false);
  emu::async_copy(dst, valid ? src : nullptr, 16);
}
inline void cp_async_commit() { emu::async_commit(); }
template <int kPending>
inline void cp_async_wait() {
  emu::async_wait(kPending);
}

}  // namespace pytransformer::cuda
