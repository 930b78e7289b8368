// CPU kernels of attention (forward and backward), compiled once per ISA level (see isa.h); the glue is attention.cpp.
//
// Tiled FlashAttention with an online softmax. A task is one (batch row, query head, block of kBlockQ queries) in the
// forward and one (batch row, query head) in the backward. Score tiles are kept transposed, S^T [keys, queries], so
// that the softmax statistics of a query are vector lanes (no horizontal reductions) and every product is one
// register-blocked micro-GEMM, C += A B, with A read as broadcast scalars and B as rows of vectors:
//   forward:  S^T = K Qt            (Qt [D, kBlockQ] packed per task, pre-scaled)
//             O  += P V             (A = P^T read column-wise)
//   backward: dV += P^T dO,  dP^T = V dOt,  dK += dS^T Q,  dQ += dS K   (dS = P * (dP - rowsum(dO * O)))
// The glue hands the kernels tensors in the accumulation type (float32, or float64) whose last dim is contiguous and,
// where it is the vector (N) dim of a product, padded with zeros to a multiple of 64 bytes.
#include "isa.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <array>
#include <atomic>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "../attention.h"
#include "vec_util.h"

namespace pytransformer::cpu {

extern KernelTable<AttentionCpuFwdFn> attention_fwd_kernel;
extern KernelTable<AttentionCpuBwdFn> attention_bwd_kernel;

inline namespace CPU_CAPABILITY {
using at::vec::Vectorized;

constexpr int64_t kBlockQ = 64;  // queries per tile (a multiple of kPadBytes / sizeof(float))
constexpr int64_t kBlockK = 64;  // keys per tile

// Micro-GEMM register tile: kMR rows of A by kNV vectors of B.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int kMR = 4, kNV = 4;
#else
constexpr int kMR = 4, kNV = 2;
#endif

// C[MR, NV vectors] (+)= A[MR, K] B[K, NV vectors]; A[m, k] = A[m * a_m + k * a_k], B and C rows are ldb / ldc apart.
template <typename T, int MR, int NV, bool kAccumulate>
void micro_gemm(int64_t K, const T* A, int64_t a_m, int64_t a_k, const T* B, int64_t ldb, T* C, int64_t ldc) {
  using Vec = Vectorized<T>;
  constexpr int64_t kV = Vec::size();
  Vec c[MR][NV];
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NV; ++n) c[m][n] = kAccumulate ? Vec::loadu(C + m * ldc + n * kV) : Vec(T(0));
  for (int64_t k = 0; k < K; ++k) {
    Vec b[NV];
#pragma GCC unroll 8
    for (int n = 0; n < NV; ++n) b[n] = Vec::loadu(B + k * ldb + n * kV);
#pragma GCC unroll 8
    for (int m = 0; m < MR; ++m) {
      const Vec a(A[m * a_m + k * a_k]);
#pragma GCC unroll 8
      for (int n = 0; n < NV; ++n) c[m][n] = at::vec::fmadd(a, b[n], c[m][n]);
    }
  }
#pragma GCC unroll 8
  for (int m = 0; m < MR; ++m)
#pragma GCC unroll 8
    for (int n = 0; n < NV; ++n) c[m][n].store(C + m * ldc + n * kV);
}

template <typename T, bool kAccumulate>
using MicroGemmFn = void (*)(int64_t, const T*, int64_t, int64_t, const T*, int64_t, T*, int64_t);

// micro_gemm instances indexed by [MR - 1][NV - 1], for the edges of a product.
template <typename T, bool kAccumulate, int... Ms, int... Ns>
constexpr auto micro_gemm_table(std::integer_sequence<int, Ms...>, std::integer_sequence<int, Ns...> ns) {
  auto row = [](auto m) {
    return std::array<MicroGemmFn<T, kAccumulate>, kNV>{&micro_gemm<T, decltype(m)::value + 1, Ns + 1, kAccumulate>...};
  };
  return std::array<std::array<MicroGemmFn<T, kAccumulate>, kNV>, kMR>{row(std::integral_constant<int, Ms>{})...};
}

// C[M, N] (+)= A[M, K] B[K, N] with N a multiple of the vector size.
template <typename T, bool kAccumulate>
void tile_gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t a_m, int64_t a_k, const T* B, int64_t ldb,
               T* C, int64_t ldc) {
  static constexpr auto table = micro_gemm_table<T, kAccumulate>(std::make_integer_sequence<int, kMR>{},
                                                                 std::make_integer_sequence<int, kNV>{});
  constexpr int64_t kV = Vectorized<T>::size();
  for (int64_t n0 = 0; n0 < N; n0 += kNV * kV) {
    const int64_t nv = std::min<int64_t>(kNV, (N - n0) / kV);
    for (int64_t m0 = 0; m0 < M; m0 += kMR) {
      const int64_t mr = std::min<int64_t>(kMR, M - m0);
      table[mr - 1][nv - 1](K, A + m0 * a_m, a_m, a_k, B + n0, ldb, C + m0 * ldc + n0, ldc);
    }
  }
}

// Applies the mask and the causal/window boundary to the score tile S^T [nk, kBlockQ] of keys j0.. and queries i0..
// (hidden entries become -inf; float masks are added). Key padding and invisible whole blocks never get here.
template <typename T>
void mask_tile(const AttentionParams& p, int64_t b, int64_t h, int64_t i0, int64_t nq, int64_t j0, int64_t nk, T* S) {
  using Vec = Vectorized<T>;
  constexpr int64_t kV = Vec::size();
  const T ninf = -std::numeric_limits<T>::infinity();
  if (p.mask_kind != MaskKind::kNone) {
    const int64_t si = p.mask_stride[2], sj = p.mask_stride[3];
    const int64_t offset = b * p.mask_stride[0] + h * p.mask_stride[1] + i0 * si + j0 * sj;
    if (p.mask_kind == MaskKind::kBool) {
      const bool* mask = static_cast<const bool*>(p.mask) + offset;
      for (int64_t j = 0; j < nk; ++j)
        if (si == 0) {
          if (!mask[j * sj]) std::fill(S + j * kBlockQ, S + j * kBlockQ + nq, ninf);
        } else {
          for (int64_t i = 0; i < nq; ++i)
            if (!mask[i * si + j * sj]) S[j * kBlockQ + i] = ninf;
        }
    } else {
      // A -inf entry sets the score rather than adds to it: a NaN or inf score of a hidden key stays hidden.
      const T* mask = static_cast<const T*>(p.mask) + offset;
      for (int64_t j = 0; j < nk; ++j)
        if (si == 0) {
          if (mask[j * sj] == ninf) {
            std::fill(S + j * kBlockQ, S + j * kBlockQ + nq, ninf);
            continue;
          }
          const Vec add(mask[j * sj]);
          for (int64_t i = 0; i < nq; i += kV) (Vec::loadu(S + j * kBlockQ + i) + add).store(S + j * kBlockQ + i);
        } else {
          for (int64_t i = 0; i < nq; ++i) {
            const T m = mask[i * si + j * sj];
            S[j * kBlockQ + i] = m == ninf ? ninf : S[j * kBlockQ + i] + m;
          }
        }
    }
  }
  if (block_partially_hidden(p, i0, i0 + nq, j0, j0 + nk)) {
    // Query i0 + i (position i0 + i + Lk - Lq) sees key j0 + j iff i >= j0 + j - shift (and i < that + W).
    const int64_t shift = query_position(p, i0);
    for (int64_t j = 0; j < nk; ++j) {
      T* row = S + j * kBlockQ;
      const int64_t first = std::clamp<int64_t>(j0 + j - shift, 0, kBlockQ);
      std::fill(row, row + first, ninf);
      if (p.window > 0) std::fill(row + std::clamp<int64_t>(j0 + j - shift + p.window, 0, kBlockQ), row + kBlockQ, ninf);
    }
  }
}

// Whether the tile of queries [i0, i0 + nq) and keys [j0, j0 + nk) may hide a key from a query (a mask, or the
// causal/window edge crossing it): then some weights of the tile are zero by rule, not by rounding.
inline bool tile_may_hide(const AttentionParams& p, int64_t i0, int64_t nq, int64_t j0, int64_t nk) {
  return p.mask_kind != MaskKind::kNone || block_partially_hidden(p, i0, i0 + nq, j0, j0 + nk);
}

// Whether the rows [0, n) of B (n elements each, ldb apart) hold only finite values: x * 0 is NaN for NaN and inf.
template <typename T>
bool rows_finite(const T* B, int64_t ldb, int64_t rows, int64_t n) {
  using Vec = Vectorized<T>;
  constexpr int64_t kV = Vec::size();
  Vec acc(T(0));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < n; d += kV) acc = at::vec::fmadd(Vec::loadu(B + r * ldb + d), Vec(T(0)), acc);
  return !std::isnan(at::vec::vec_reduce_all<T>(VecPlus(), acc));
}

// C[nq, N] += W^T B over a tile's nk keys: W [nk, kBlockQ] the tile's weights (P, or dS for dQ), B the keys' rows
// (V, or K for dQ, ldb apart). A hidden key (weight 0) never reaches a query, even with NaN or inf in its row of B:
// such rows are added one by one to the queries that weigh them (0 * NaN would be NaN), the rows between them by
// tile_gemm. Tiles that hide nothing, or whose rows of B are finite, take tile_gemm alone.
template <typename T>
void add_weighted_keys(const AttentionParams& p, int64_t i0, int64_t nq, int64_t j0, int64_t nk, const T* W,
                       const T* B, int64_t ldb, int64_t N, T* C, int64_t ldc) {
  if (!tile_may_hide(p, i0, nq, j0, nk) || rows_finite(B, ldb, nk, N)) {
    tile_gemm<T, true>(nq, N, nk, W, 1, kBlockQ, B, ldb, C, ldc);
    return;
  }
  int64_t k0 = 0;  // the first key not added yet
  for (int64_t k = 0; k < nk; ++k) {
    if (rows_finite(B + k * ldb, ldb, 1, N)) continue;
    if (k > k0) tile_gemm<T, true>(nq, N, k - k0, W + k0 * kBlockQ, 1, kBlockQ, B + k0 * ldb, ldb, C, ldc);
    for (int64_t i = 0; i < nq; ++i)
      if (W[k * kBlockQ + i] != T(0))
        for (int64_t d = 0; d < N; ++d) C[i * ldc + d] += W[k * kBlockQ + i] * B[k * ldb + d];
    k0 = k + 1;
  }
  if (nk > k0) tile_gemm<T, true>(nq, N, nk - k0, W + k0 * kBlockQ, 1, kBlockQ, B + k0 * ldb, ldb, C, ldc);
}

// n rounded up to a multiple of kPadBytes worth of T: the row length of padded operands and buffers.
template <typename T>
int64_t padded(int64_t n) {
  return round_up(n, kPadBytes / sizeof(T));
}

template <typename T>
const T* row_ptr(const void* base, const int64_t (&stride)[3], int64_t b, int64_t h, int64_t i) {
  return static_cast<const T*>(base) + b * stride[0] + h * stride[1] + i * stride[2];
}

template <typename T>
T* row_ptr(void* base, const int64_t (&stride)[3], int64_t b, int64_t h, int64_t i) {
  return static_cast<T*>(base) + b * stride[0] + h * stride[1] + i * stride[2];
}

// dst[d, i] = src row i [d] * scale for d < n, i < nq; columns nq.. are zero. dst is [n, kBlockQ].
template <typename T>
void pack_transposed(const T* src, int64_t ld, int64_t nq, int64_t n, T scale, T* dst) {
  for (int64_t d = 0; d < n; ++d) std::fill(dst + d * kBlockQ + nq, dst + (d + 1) * kBlockQ, T(0));
  for (int64_t i = 0; i < nq; ++i)
    for (int64_t d = 0; d < n; ++d) dst[d * kBlockQ + i] = src[i * ld + d] * scale;
}

// dst[0:n] = src[0:n] * s.
template <typename T>
void scale_row(const T* src, int64_t n, T s, T* dst) {
  using Vec = Vectorized<T>;
  constexpr int64_t kV = Vec::size();
  int64_t d = 0;
  for (; d + kV <= n; d += kV) (Vec::loadu(src + d) * Vec(s)).store(dst + d);
  if (d < n) (Vec::loadu(src + d, n - d) * Vec(s)).store(dst + d, n - d);
}

// Runs worker(next_task) once on each intra-op thread; next_task() hands out 0..n-1, one at a time, then -1. Dynamic
// scheduling keeps the threads balanced when tasks differ in cost or another process slows one thread down.
template <class Worker>
void parallel_tasks(int64_t n, const Worker& worker) {
  std::atomic<int64_t> counter{0};
  const auto next_task = [&] {
    const int64_t task = counter.fetch_add(1, std::memory_order_relaxed);
    return task < n ? task : int64_t(-1);
  };
  at::parallel_for(0, std::min<int64_t>(n, at::get_num_threads()), 1, [&](int64_t, int64_t) { worker(next_task); });
}

template <typename T>
void attention_fwd_typed(const AttentionParams& p) {
  using Vec = Vectorized<T>;
  constexpr int64_t kV = Vec::size();
  constexpr T kInf = std::numeric_limits<T>::infinity();
  const int64_t D = p.dim, Dv = p.dim_v, group = p.heads_q / p.heads_kv;
  const int64_t Dvp = padded<T>(Dv);
  const int64_t nqb = (p.len_q + kBlockQ - 1) / kBlockQ;
  parallel_tasks(p.batch * p.heads_q * nqb, [&](const auto& next_task) {
    std::vector<T> qt(D * kBlockQ), s(kBlockK * kBlockQ), o(kBlockQ * Dvp);
    alignas(64) T m[kBlockQ], l[kBlockQ], alpha[kBlockQ];
    for (int64_t task; (task = next_task()) >= 0;) {
      // A head's query blocks from the last: the costliest under causal masking go first.
      const int64_t b = task / (p.heads_q * nqb), h = task / nqb % p.heads_q;
      const int64_t i0 = (nqb - 1 - task % nqb) * kBlockQ;
      // nq queries, computed as nqv columns (whole vectors) of the score tiles
      const int64_t nq = std::min(kBlockQ, p.len_q - i0), nqv = round_up(nq, kV), hk = h / group;
      const KeyRange keys = visible_keys(p, b, i0, i0 + nq);
      const T* k = row_ptr<T>(p.k, p.k_stride, b, hk, 0);
      const T* v = row_ptr<T>(p.v, p.v_stride, b, hk, 0);
      pack_transposed(row_ptr<T>(p.q, p.q_stride, b, h, i0), p.q_stride[2], nq, D, T(p.scale), qt.data());
      std::fill(m, m + kBlockQ, -kInf);
      std::fill(l, l + kBlockQ, T(0));
      std::fill(o.begin(), o.end(), T(0));
      for (int64_t j0 = keys.lo; j0 < keys.hi; j0 += kBlockK) {
        const int64_t nk = std::min(kBlockK, keys.hi - j0);
        tile_gemm<T, false>(nk, nqv, D, k + j0 * p.k_stride[2], p.k_stride[2], 1, qt.data(), kBlockQ, s.data(),
                            kBlockQ);
        mask_tile(p, b, h, i0, nq, j0, nk, s.data());
        // Online softmax, kV queries at a time: new max, rescale factor, exponentials and their sum.
        for (int64_t c = 0; c < nqv; c += kV) {
          const Vec m_old = Vec::loadu(m + c);
          Vec mx = m_old;
          for (int64_t j = 0; j < nk; ++j) mx = at::vec::maximum(mx, Vec::loadu(s.data() + j * kBlockQ + c));
          const Vec m_use = Vec::blendv(mx, Vec(T(0)), mx == Vec(-kInf));  // all hidden so far: exp(-inf - 0) = 0
          const Vec a = (m_old - m_use).exp_u20();
          Vec sum(T(0));
          for (int64_t j = 0; j < nk; ++j) {
            T* sj = s.data() + j * kBlockQ + c;
            const Vec e = (Vec::loadu(sj) - m_use).exp_u20();
            e.store(sj);
            sum += e;
          }
          (Vec::loadu(l + c) * a + sum).store(l + c);
          mx.store(m + c);
          a.store(alpha + c);
        }
        if (j0 > keys.lo)  // the first tile found O = 0
          for (int64_t i = 0; i < nq; ++i)
            if (alpha[i] != T(1)) scale_row(o.data() + i * Dvp, Dvp, alpha[i], o.data() + i * Dvp);
        add_weighted_keys(p, i0, nq, j0, nk, s.data(), v + j0 * p.v_stride[2], p.v_stride[2], Dvp, o.data(), Dvp);
      }
      T* lse = static_cast<T*>(p.lse) + (b * p.heads_q + h) * p.len_q + i0;
      for (int64_t i = 0; i < nq; ++i) {
        const bool seen = l[i] > T(0);
        scale_row(o.data() + i * Dvp, Dv, seen ? T(1) / l[i] : T(0), row_ptr<T>(p.out, p.o_stride, b, h, i0 + i));
        lse[i] = seen ? m[i] + std::log(l[i]) : -kInf;
      }
    }
  });
}

template <typename T>
void attention_bwd_typed(const AttentionBackwardParams& bp) {
  using Vec = Vectorized<T>;
  constexpr int64_t kV = Vec::size();
  constexpr T kInf = std::numeric_limits<T>::infinity();
  const AttentionParams& p = bp.fwd;
  const int64_t D = p.dim, Dv = p.dim_v, group = p.heads_q / p.heads_kv;
  const T scale = T(p.scale);
  const int64_t Dp = padded<T>(D), Dvp = padded<T>(Dv);
  parallel_tasks(p.batch * p.heads_q, [&](const auto& next_task) {
    std::vector<T> qt(D * kBlockQ), dot_t(Dv * kBlockQ), s(kBlockK * kBlockQ), dp(kBlockK * kBlockQ), dq(kBlockQ * Dp);
    alignas(64) T lse[kBlockQ], delta[kBlockQ];
    for (int64_t task; (task = next_task()) >= 0;) {
      const int64_t b = task / p.heads_q, h = task % p.heads_q, hk = h / group;
      const T* k = row_ptr<T>(p.k, p.k_stride, b, hk, 0);
      const T* v = row_ptr<T>(p.v, p.v_stride, b, hk, 0);
      T* gk = row_ptr<T>(bp.grad_k, bp.gk_stride, b, h, 0);
      T* gv = row_ptr<T>(bp.grad_v, bp.gv_stride, b, h, 0);
      for (int64_t i0 = 0; i0 < p.len_q; i0 += kBlockQ) {
        const int64_t nq = std::min(kBlockQ, p.len_q - i0), nqv = round_up(nq, kV);
        const KeyRange keys = visible_keys(p, b, i0, i0 + nq);
        const T* q = row_ptr<T>(p.q, p.q_stride, b, h, i0);
        const T* go = row_ptr<T>(bp.grad_out, bp.go_stride, b, h, i0);
        std::fill(dq.begin(), dq.end(), T(0));
        if (keys.lo < keys.hi) {
          pack_transposed(q, p.q_stride[2], nq, D, scale, qt.data());
          pack_transposed(go, bp.go_stride[2], nq, Dv, T(1), dot_t.data());
          const T* saved = static_cast<const T*>(p.lse) + (b * p.heads_q + h) * p.len_q + i0;
          for (int64_t i = 0; i < kBlockQ; ++i) {
            // Rows that saw no key (and the padding rows past nq) get P = exp(s - inf) = 0.
            lse[i] = i < nq && saved[i] > -kInf ? saved[i] : kInf;
            delta[i] = i < nq ? dot(go + i * bp.go_stride[2], row_ptr<T>(p.out, p.o_stride, b, h, i0 + i), Dv) : T(0);
          }
        }
        for (int64_t j0 = keys.lo; j0 < keys.hi; j0 += kBlockK) {
          const int64_t nk = std::min(kBlockK, keys.hi - j0);
          const T* kj = k + j0 * p.k_stride[2];
          tile_gemm<T, false>(nk, nqv, D, kj, p.k_stride[2], 1, qt.data(), kBlockQ, s.data(), kBlockQ);
          mask_tile(p, b, h, i0, nq, j0, nk, s.data());
          for (int64_t j = 0; j < nk; ++j)
            for (int64_t c = 0; c < nqv; c += kV) {
              T* sj = s.data() + j * kBlockQ + c;
              (Vec::loadu(sj) - Vec::loadu(lse + c)).exp_u20().store(sj);
            }
          // dV += P^T dO;  dP^T = V dO^T;  dS = P * (dP - delta);  dK += dS^T Q;  dQ += dS K
          tile_gemm<T, true>(nk, Dvp, nq, s.data(), kBlockQ, 1, go, bp.go_stride[2], gv + j0 * bp.gv_stride[2],
                             bp.gv_stride[2]);
          tile_gemm<T, false>(nk, nqv, Dv, v + j0 * p.v_stride[2], p.v_stride[2], 1, dot_t.data(), kBlockQ,
                              dp.data(), kBlockQ);
          // dS = 0 where P = 0 (a hidden entry), whatever dP is: V's row of a hidden key may hold NaN or inf.
          for (int64_t j = 0; j < nk; ++j)
            for (int64_t c = 0; c < nqv; c += kV) {
              T* dpj = dp.data() + j * kBlockQ + c;
              const Vec pj = Vec::loadu(s.data() + j * kBlockQ + c);
              Vec::blendv(pj * (Vec::loadu(dpj) - Vec::loadu(delta + c)), Vec(T(0)), pj == Vec(T(0))).store(dpj);
            }
          tile_gemm<T, true>(nk, Dp, nq, dp.data(), kBlockQ, 1, q, p.q_stride[2], gk + j0 * bp.gk_stride[2],
                             bp.gk_stride[2]);
          add_weighted_keys(p, i0, nq, j0, nk, dp.data(), kj, p.k_stride[2], Dp, dq.data(), Dp);
        }
        for (int64_t i = 0; i < nq; ++i)
          scale_row(dq.data() + i * Dp, Dp, scale, row_ptr<T>(bp.grad_q, bp.gq_stride, b, h, i0 + i));
      }
      for (int64_t j = 0; j < p.len_k; ++j) scale_row(gk + j * bp.gk_stride[2], Dp, scale, gk + j * bp.gk_stride[2]);
    }
  });
}

void attention_fwd(const AttentionParams& p, bool is_double) {
  if (is_double) {
    attention_fwd_typed<double>(p);
  } else {
    attention_fwd_typed<float>(p);
  }
}

void attention_bwd(const AttentionBackwardParams& p, bool is_double) {
  if (is_double) {
    attention_bwd_typed<double>(p);
  } else {
    attention_bwd_typed<float>(p);
  }
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(attention_fwd_kernel, &CPU_CAPABILITY::attention_fwd);
PT_REGISTER_CPU_KERNEL(attention_bwd_kernel, &CPU_CAPABILITY::attention_bwd);

}  // namespace pytransformer::cpu
