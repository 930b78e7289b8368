// CPU kernel of decode_attention, compiled once per ISA level (see isa.h); the glue is decode_attention.cpp.
//
// q [B, Hq, T, D] attends to the first cache_lengths[b] rows of k_cache / v_cache [B, Hkv, capacity, D|Dv], read in
// place. Work items are (row b, cache head, chunk of keys): each holds all G = Hq / Hkv query heads of the cache head
// and all T queries (M = G * T query rows), so every key and value row is read once per item, and runs an online
// softmax over its chunk in blocks of kBlock keys. Items write a partial result (running max, sum of exponentials,
// unnormalised output) per query row; a second pass merges the chunks of a row (log-sum-exp) into the output.
// float16/bfloat16 blocks are widened to float32 once per item and block; float64 stays float64. With AVX-512, float32
// caches of head dims 1 to 128 go a block at a time through attend_block: the scores of 16 keys in one vector, the
// softmax update in registers, and the rows read next (this item's next block, or the next item's first) asked for
// line by line as the block's own are read.
#include "isa.h"
#include "vec_util.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "../decode_attention.h"
#include "dot_rows.h"

namespace pytransformer::cpu {

extern KernelTable<DecodeAttentionCpuFn> decode_attention_kernel;

inline namespace CPU_CAPABILITY {
using at::vec::Vectorized;

constexpr int64_t kBlock = 32;     // keys scored together before the softmax update
constexpr int64_t kMinChunk = 256;  // fewest keys in a work item when a row is split along the sequence
constexpr int kMaxVectorsD = 8;      // the most vectors of 16 in a key row that attend_block takes (D <= 128)

// For the R rows y_r = y + r * y_step: y_r[i] = y_r[i] * alpha[r] + sum_k w_r[k] * x_k[i] over n elements, with
// w_r = w + r * w_step and the `count` rows x_k = x + k * x_step; each load of x serves every row.
template <int R, typename acc_t>
void accumulate_rows(acc_t* y, int64_t y_step, const acc_t* alpha, const acc_t* w, int64_t w_step, const acc_t* x,
                     int64_t x_step, int64_t count, int64_t n) {
  using Vec = Vectorized<acc_t>;
  constexpr int64_t kV = Vec::size();
  for (int64_t i = 0; i < n; i += kV) {
    const int64_t len = std::min(kV, n - i);
    Vec acc[R];
    for (int r = 0; r < R; ++r)
      acc[r] = (len == kV ? Vec::loadu(y + r * y_step + i) : Vec::loadu(y + r * y_step + i, len)) * Vec(alpha[r]);
    for (int64_t k = 0; k < count; ++k) {
      const acc_t* xk = x + k * x_step + i;
      const Vec xv = len == kV ? Vec::loadu(xk) : Vec::loadu(xk, len);
      for (int r = 0; r < R; ++r) acc[r] = at::vec::fmadd(Vec(w[r * w_step + k]), xv, acc[r]);
    }
    for (int r = 0; r < R; ++r) acc[r].store(y + r * y_step + i, len);
  }
}

// accumulate_rows for any number of rows, four at a time.
template <typename acc_t>
void accumulate_rows(acc_t* y, int64_t y_step, int64_t rows, const acc_t* alpha, const acc_t* w, int64_t w_step,
                     const acc_t* x, int64_t x_step, int64_t count, int64_t n) {
  for_blocks<4>(rows, [&](auto R, int64_t r) {
    accumulate_rows<decltype(R)::value>(y + r * y_step, y_step, alpha + r, w + r * w_step, w_step, x, x_step, count, n);
  });
}

// Rows [j0, j0 + n) of a cache head (row stride `step` elements) as acc_t rows of width `width`: the rows themselves
// when no conversion is needed (returned step: `step`), else widened into `buf` (returned step: `width`).
template <typename scalar_t, typename acc_t>
const acc_t* rows_as_acc(const scalar_t* base, int64_t step, int64_t j0, int64_t n, int64_t width, acc_t* buf,
                         int64_t& out_step) {
  if constexpr (std::is_same_v<scalar_t, acc_t>) {
    out_step = step;
    return base + j0 * step;
  } else {
    for (int64_t i = 0; i < n; ++i) convert_n(base + (j0 + i) * step, buf + i * width, width);
    out_step = width;
    return buf;
  }
}

// Requests rows [j0, j0 + n) of a cache head (row stride `step` elements, `width` elements each) into the CPU cache:
// a work item streams its keys and values from memory, and the hardware prefetchers alone leave it latency-bound.
template <typename scalar_t>
void prefetch_rows(const scalar_t* base, int64_t step, int64_t j0, int64_t n, int64_t width) {
  constexpr int64_t kLine = 64;
  for (int64_t i = 0; i < n; ++i) {
    const char* row = reinterpret_cast<const char*>(base + (j0 + i) * step);
    for (int64_t off = 0; off < width * static_cast<int64_t>(sizeof(scalar_t)); off += kLine) __builtin_prefetch(row + off);
  }
}

// Calls f(row0, rows, lo, hi) for each run of consecutive queries that see the same keys [lo, hi) of a block (query
// rows row0 .. row0 + rows, G a query), skipping queries that see none of them. Each run's values are weighted in by
// one pass over those keys alone: a hidden key's value, NaN or inf included, never reaches a query (0 * NaN is NaN).
template <class F>
void for_query_runs(int64_t T, int64_t G, const int64_t* lo, const int64_t* hi, F&& f) {
  for (int64_t t0 = 0, t1; t0 < T; t0 = t1) {
    for (t1 = t0 + 1; t1 < T && lo[t1] == lo[t0] && hi[t1] == hi[t0]; ++t1) {
    }
    if (lo[t0] < hi[t0]) f(t0 * G, (t1 - t0) * G, lo[t0], hi[t0]);
  }
}

#if defined(CPU_CAPABILITY_AVX512)
// Lane j < count: the dot product of query row q with key row j of k (row stride k_step) over D elements, in ND
// vectors (ND = ceil(D / 16), the query's vectors held in registers); lanes from count on: 0. 16 keys at once, each a
// vector of partial sums, then their lanes summed together (sum_lanes_of<16>). As key row j is read, row j of `ahead`
// (the same stride) is asked for when j < ahead_count: the rows read next, a request per line read, where a burst of
// requests for a whole block held the loads up behind them.
template <int ND>
inline __m512 scores_16(const float* q, int64_t D, const float* k, int64_t k_step, int64_t count, const float* ahead,
                        int64_t ahead_count) {
  const int64_t tail = D - 16 * (ND - 1);  // elements in the last vector, 1 to 16
  const __mmask16 last = first_lanes(tail);
  const auto load = [&](const float* p, int i) __attribute__((always_inline)) {
    return i + 1 < ND ? _mm512_loadu_ps(p + 16 * i) : _mm512_maskz_loadu_ps(last, p + 16 * i);
  };
  __m512 qv[ND], acc[16];
#pragma GCC unroll 8
  for (int i = 0; i < ND; ++i) qv[i] = load(q, i);
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) {
    acc[j] = _mm512_setzero_ps();
    if (j >= count) continue;
    if (j < ahead_count)
#pragma GCC unroll 8
      for (int i = 0; i < ND; ++i) __builtin_prefetch(ahead + j * k_step + 16 * i);
#pragma GCC unroll 8
    for (int i = 0; i < ND; ++i) acc[j] = _mm512_fmadd_ps(load(k + j * k_step, i), qv[i], acc[j]);
  }
  return sum_lanes_of<16>(acc);
}

// For the R query rows m of acc (row stride Dv): acc[m] = acc[m] * alpha[m] + sum_{j < n} p[m * kBlock + j] * v_j over
// Dv elements, v_j = v + j * v_step; each value vector loaded once for the R rows, 4 vectors of Dv at a time.
// As value row j is read, the lines it reads of row j of `ahead` are asked for, for j < ahead_count (see scores_16).
template <int R>
void accumulate_block(float* acc, int64_t Dv, const float* alpha, const float* p, const float* v, int64_t v_step,
                      int64_t n, const float* ahead, int64_t ahead_count) {
  for (int64_t d0 = 0; d0 < Dv; d0 += 64) {
    __mmask16 mask[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) mask[i] = first_lanes(Dv - d0 - 16 * i);
    __m512 a[R][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i)
        a[r][i] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[i], acc + r * Dv + d0 + 16 * i), _mm512_set1_ps(alpha[r]));
    for (int64_t j = 0; j < n; ++j) {
      __m512 vv[4];
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) vv[i] = _mm512_maskz_loadu_ps(mask[i], v + j * v_step + d0 + 16 * i);
      if (j < ahead_count)
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i)
          if (mask[i]) __builtin_prefetch(ahead + j * v_step + d0 + 16 * i);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 pj = _mm512_set1_ps(p[r * kBlock + j]);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) a[r][i] = _mm512_fmadd_ps(pj, vv[i], a[r][i]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int i = 0; i < 4; ++i) _mm512_mask_storeu_ps(acc + r * Dv + d0 + 16 * i, mask[i], a[r][i]);
  }
}

// f(std::integral_constant<int, ND>) for ND = ceil(D / 16), 1 <= ND <= kMaxVectorsD.
template <class F>
void with_vectors(int64_t D, F&& f) {
  switch ((D + 15) / 16) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

// The key and value rows that attend_block asks for as it reads a block's: the next block of the work item, or the
// first block of the thread's next item (count 0: none).
struct NextRows {
  const float *k, *v;
  int64_t count;
};

// One block of n <= kBlock keys for all M query rows (float32 rows; the scaled queries qs [M, D]): the scores of each
// row (16 keys a vector, scores_16), the online softmax update in those vectors (keys outside [lo[t], hi[t]) of query
// t = m / G score -inf), then the visible values weighted into acc [M, Dv] (accumulate_block over for_query_runs).
// State and results as in
// attend_block_rows: mx, sum [M]; alpha and probs (kBlock a row) are scratch.
template <int ND>
void attend_block(const float* qs, int64_t M, int64_t G, int64_t D, int64_t Dv, const float* k, int64_t k_step,
                  const float* v, int64_t v_step, int64_t n, const NextRows& next, const int64_t* lo,
                  const int64_t* hi, float* mx, float* sum, float* acc, float* alpha, float* probs) {
  static_assert(kBlock == 32, "attend_block takes a block as two vectors of 16 scores");
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t m = 0; m < M; ++m) {
    const int64_t t = m / G;
    const uint64_t below_hi = (uint64_t(1) << hi[t]) - 1, below_lo = (uint64_t(1) << lo[t]) - 1;
    const uint32_t visible = lo[t] < hi[t] ? static_cast<uint32_t>(below_hi & ~below_lo) : 0;  // bit j: key j
    float* pm = probs + m * kBlock;
    if (visible == 0) {
      alpha[m] = 1.0f;
      std::fill(pm, pm + kBlock, 0.0f);
      continue;
    }
    const __mmask16 vis0 = static_cast<__mmask16>(visible), vis1 = static_cast<__mmask16>(visible >> 16);
    // the next keys asked for by the first row's pass over the keys
    const int64_t pf = m == 0 ? next.count : 0;
    __m512 s0 = scores_16<ND>(qs + m * D, D, k, k_step, std::min<int64_t>(n, 16), next.k, std::min<int64_t>(pf, 16));
    __m512 s1 = n > 16 ? scores_16<ND>(qs + m * D, D, k + 16 * k_step, k_step, n - 16, next.k + 16 * k_step, pf - 16)
                       : neg_inf;
    const bool nan = (_mm512_mask_cmp_ps_mask(vis0, s0, s0, _CMP_UNORD_Q) |
                      _mm512_mask_cmp_ps_mask(vis1, s1, s1, _CMP_UNORD_Q)) != 0;
    s0 = _mm512_mask_blend_ps(vis0, neg_inf, s0);
    s1 = _mm512_mask_blend_ps(vis1, neg_inf, s1);
    const float block_max = nan ? std::numeric_limits<float>::quiet_NaN()
                                : _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
    const float new_max = max_nan(mx[m], block_max);  // NaN (in q or a visible key) stays NaN
    alpha[m] = std::exp(mx[m] - new_max);              // 0 while the row was empty
    const Vectorized<float> nm(new_max);
    const __m512 p0 = (Vectorized<float>(s0) - nm).exp(), p1 = (Vectorized<float>(s1) - nm).exp();
    _mm512_storeu_ps(pm, p0);
    _mm512_storeu_ps(pm + 16, p1);
    sum[m] = sum[m] * alpha[m] + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
    mx[m] = new_max;
  }
  int64_t ahead = next.count;  // asked for by the first pass over the values
  for_query_runs(M / G, G, lo, hi, [&](int64_t r0, int64_t rows, int64_t l, int64_t h) {
    for_blocks<4>(rows, [&](auto R, int64_t r) {
      accumulate_block<decltype(R)::value>(acc + (r0 + r) * Dv, Dv, alpha + r0 + r, probs + (r0 + r) * kBlock + l,
                                           v + l * v_step, v_step, h - l, next.v, std::exchange(ahead, 0));
    });
  });
}
#endif

// A work item: batch row b, cache head h and the keys [j0, j1) of one chunk.
struct WorkItem {
  int64_t b, h, j0, j1;
};

// The keys [first, end) that row b's queries see, cut into `chunks` chunks: items item_base + h * chunks + c.
struct RowPlan {
  int64_t first, end, chunks, item_base;
};

// The work of a call: the keys each row's queries see (a window drops the keys before the first query's window), cut
// into chunks of `chunk` keys, so that there are about 4 work items per thread but never fewer than kMinChunk keys
// per item.
struct DecodePlan {
  std::vector<RowPlan> rows;
  int64_t chunk = 0, items = 0;

  DecodePlan(const DecodeAttentionParams& p, const int64_t* lengths) : rows(p.batch) {
    int64_t total_keys = 0;
    for (int64_t b = 0; b < p.batch; ++b) {
      rows[b].first = p.window > 0 ? std::max<int64_t>(0, lengths[b] - p.q_len - p.window + 1) : 0;
      rows[b].end = lengths[b];
      total_keys += (rows[b].end - rows[b].first) * p.kv_heads;
    }
    const int64_t target = at::divup(total_keys, 4 * static_cast<int64_t>(at::get_num_threads()));
    chunk = at::divup(std::max(kMinChunk, target), kBlock) * kBlock;
    for (auto& r : rows) {
      r.chunks = at::divup(r.end - r.first, chunk);
      r.item_base = items;
      items += r.chunks * p.kv_heads;
    }
  }

  WorkItem locate(int64_t item) const {
    const int64_t b = std::upper_bound(rows.begin(), rows.end(), item,
                                       [](int64_t i, const RowPlan& r) { return i < r.item_base; }) - rows.begin() - 1;
    const RowPlan& row = rows[b];
    const int64_t h = (item - row.item_base) / row.chunks, c = (item - row.item_base) % row.chunks;
    const int64_t j0 = row.first + c * chunk;
    return {b, h, j0, std::min(row.end, j0 + chunk)};
  }
};

// The operands of a call and the shape of a work item: M = G * T query rows, row m = t * G + g for query t of query
// head h * G + g.
template <typename scalar_t>
struct DecodeInputs {
  const DecodeAttentionParams& p;
  const scalar_t *q, *k, *v;
  int64_t G = p.q_heads / p.kv_heads, T = p.q_len, M = G * T, D = p.head_dim, Dv = p.v_head_dim;

  const scalar_t* k_head(int64_t b, int64_t h) const { return k + b * p.k_stride[0] + h * p.k_stride[1]; }
  const scalar_t* v_head(int64_t b, int64_t h) const { return v + b * p.v_stride[0] + h * p.v_stride[1]; }
};

// Partial results per work item and query row: running max, sum of exponentials, unnormalised output [Dv].
template <typename acc_t>
struct Partials {
  std::vector<acc_t> max, sum, out;
  Partials(int64_t items, int64_t M, int64_t Dv) : max(items * M), sum(items * M), out(items * M * Dv) {}
};

// A thread's scratch: the scaled queries [M, D], a block's scores, probabilities (kBlock a query row) and rescale
// factors, the widened key and value rows of a block (float16/bfloat16 caches) and each query's visible keys in it.
template <typename scalar_t>
struct Scratch {
  using acc_t = at::opmath_type<scalar_t>;
  static constexpr bool kWiden = !std::is_same_v<scalar_t, acc_t>;
  std::vector<acc_t> qs, scores, probs, alpha, kbuf, vbuf;
  std::vector<int64_t> lo, hi;
  explicit Scratch(const DecodeInputs<scalar_t>& in)
      : qs(in.M * in.D), scores(in.M * kBlock), probs(in.M * kBlock), alpha(in.M), kbuf(kWiden ? kBlock * in.D : 0),
        vbuf(kWiden ? kBlock * in.Dv : 0), lo(in.T), hi(in.T) {}
};

// The queries of cache head h of row b times the scale, as acc_t rows qs [M, D].
template <typename scalar_t, typename acc_t>
void load_queries(const DecodeInputs<scalar_t>& in, int64_t b, int64_t h, acc_t* qs) {
  using Vec = Vectorized<acc_t>;
  for (int64_t t = 0; t < in.T; ++t)
    for (int64_t g = 0; g < in.G; ++g) {
      acc_t* dst = qs + (t * in.G + g) * in.D;
      convert_n(in.q + b * in.p.q_stride[0] + (h * in.G + g) * in.p.q_stride[1] + t * in.p.q_stride[2], dst, in.D);
      at::vec::map([s = Vec(acc_t(in.p.scale))](Vec x) { return x * s; }, dst, dst, in.D);
    }
}

// Query t (position end - T + t) sees the keys in (pos - window, pos]: those of the block [jb, jb + n) are the
// offsets [lo[t], hi[t]).
inline void block_visibility(const DecodeAttentionParams& p, int64_t end, int64_t jb, int64_t n, int64_t* lo,
                             int64_t* hi) {
  for (int64_t t = 0; t < p.q_len; ++t) {
    const int64_t pos = end - p.q_len + t;
    lo[t] = std::max(jb, p.window > 0 ? pos - p.window + 1 : jb) - jb;
    hi[t] = std::min(jb + n, pos + 1) - jb;
  }
}

// The scores [M, kBlock] of a block (key rows krows, k_step apart): query t's visible keys scored by one dot_rows call
// over its G query heads; hidden keys and the unused tail of the block score -inf.
template <typename scalar_t, typename acc_t>
void score_block(const DecodeInputs<scalar_t>& in, const acc_t* qs, const acc_t* krows, int64_t k_step,
                 const int64_t* lo, const int64_t* hi, acc_t* scores) {
  std::fill(scores, scores + in.M * kBlock, -std::numeric_limits<acc_t>::infinity());
  for (int64_t t = 0; t < in.T; ++t)
    if (lo[t] < hi[t])
      dot_rows(qs + t * in.G * in.D, in.D, in.G, krows + lo[t] * k_step, k_step, hi[t] - lo[t], in.D,
               scores + t * in.G * kBlock + lo[t], kBlock, 1);
}

// Online softmax update of the M query rows with a block's scores [M, kBlock]: rescale by alpha = e^(old max - new
// max) and add the block's probabilities probs = e^(score - new max); a row with no visible key here keeps its state
// (alpha 1, probs 0).
template <typename acc_t>
void softmax_update(const acc_t* scores, int64_t M, acc_t* mx, acc_t* sum, acc_t* alpha, acc_t* probs) {
  using Vec = Vectorized<acc_t>;
  for (int64_t m = 0; m < M; ++m) {
    const acc_t* s = scores + m * kBlock;
    acc_t* pm = probs + m * kBlock;
    const acc_t block_max = at::vec::reduce_all<acc_t>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, s, kBlock);
    if (block_max == -std::numeric_limits<acc_t>::infinity()) {
      alpha[m] = acc_t(1);
      std::fill(pm, pm + kBlock, acc_t(0));
      continue;
    }
    const acc_t new_max = max_nan(mx[m], block_max);  // NaN (in q or a visible key) stays NaN
    alpha[m] = std::exp(mx[m] - new_max);              // 0 while the row was empty
    at::vec::map([nm = Vec(new_max)](Vec x) { return (x - nm).exp(); }, pm, s, kBlock);
    sum[m] = sum[m] * alpha[m] + at::vec::reduce_all<acc_t>(VecPlus(), pm, kBlock);
    mx[m] = new_max;
  }
}

// The running state of a work item's M query rows: max, sum of exponentials and unnormalised output [M, Dv].
template <typename acc_t>
struct ItemState {
  acc_t *mx, *sum, *acc;
};

// One block of n keys from jb for the M query rows, by dot_rows, the softmax update and accumulate_rows (each query's
// visible keys alone, for_query_runs); the next block's n_next rows are asked for all at once, once this block's keys
// are read.
template <typename scalar_t, typename acc_t>
void attend_block_rows(const DecodeInputs<scalar_t>& in, Scratch<scalar_t>& s, const scalar_t* kh,
                       const scalar_t* vh, int64_t jb, int64_t n, int64_t n_next, const ItemState<acc_t>& st) {
  int64_t k_step, v_step;
  const acc_t* krows = rows_as_acc(kh, in.p.k_stride[2], jb, n, in.D, s.kbuf.data(), k_step);
  if (n_next > 0) {
    prefetch_rows(kh, in.p.k_stride[2], jb + kBlock, n_next, in.D);
    prefetch_rows(vh, in.p.v_stride[2], jb + kBlock, n_next, in.Dv);
  }
  score_block(in, s.qs.data(), krows, k_step, s.lo.data(), s.hi.data(), s.scores.data());
  softmax_update(s.scores.data(), in.M, st.mx, st.sum, s.alpha.data(), s.probs.data());
  const acc_t* vrows = rows_as_acc(vh, in.p.v_stride[2], jb, n, in.Dv, s.vbuf.data(), v_step);
  for_query_runs(in.T, in.G, s.lo.data(), s.hi.data(), [&](int64_t r0, int64_t rows, int64_t lo, int64_t hi) {
    accumulate_rows(st.acc + r0 * in.Dv, in.Dv, rows, s.alpha.data() + r0, s.probs.data() + r0 * kBlock + lo, kBlock,
                    vrows + lo * v_step, v_step, hi - lo, in.Dv);
  });
}

// Whether float32 caches of head dim D go through attend_block (AVX-512, D <= 16 * kMaxVectorsD): it takes less time
// than the blocks above there; float16 and bfloat16 caches, widened a block at a time, keep the blocks above
// (benchmarks/results/cpu_decode_attention_2026-11-28_named_steps.md).
#if defined(CPU_CAPABILITY_AVX512)
template <typename scalar_t>
bool takes_vector_block(int64_t D) {
  return std::is_same_v<scalar_t, float> && D >= 1 && D <= 16 * kMaxVectorsD;
}

// One block of n keys from jb for the M query rows by attend_block, which asks for the rows read next line by line:
// the item's next n_next rows, or else the first block of the thread's next item (next_item < 0: none).
inline void attend_block_vector(const DecodeInputs<float>& in, Scratch<float>& s, const DecodePlan& plan,
                                const float* kh, const float* vh, int64_t jb, int64_t n, int64_t n_next,
                                int64_t next_item, const ItemState<float>& st) {
  const int64_t k_step = in.p.k_stride[2], v_step = in.p.v_stride[2];
  NextRows ahead{nullptr, nullptr, 0};
  if (n_next > 0) {
    ahead = {kh + (jb + kBlock) * k_step, vh + (jb + kBlock) * v_step, n_next};
  } else if (next_item >= 0) {
    const WorkItem w = plan.locate(next_item);
    ahead = {in.k_head(w.b, w.h) + w.j0 * k_step, in.v_head(w.b, w.h) + w.j0 * v_step, std::min(kBlock, w.j1 - w.j0)};
  }
  with_vectors(in.D, [&](auto nd) {
    attend_block<decltype(nd)::value>(s.qs.data(), in.M, in.G, in.D, in.Dv, kh + jb * k_step, k_step,
                                      vh + jb * v_step, v_step, n, ahead, s.lo.data(), s.hi.data(), st.mx, st.sum,
                                      st.acc, s.alpha.data(), s.probs.data());
  });
}
#endif

// Work item `item` into its partial results: its scaled queries, then its keys a block at a time (next_item: the
// thread's next item, or -1).
template <typename scalar_t, typename acc_t>
void attend_item(const DecodeInputs<scalar_t>& in, const DecodePlan& plan, int64_t item, int64_t next_item,
                 Scratch<scalar_t>& s, Partials<acc_t>& part) {
  const WorkItem w = plan.locate(item);
  load_queries(in, w.b, w.h, s.qs.data());
  const ItemState<acc_t> st{part.max.data() + item * in.M, part.sum.data() + item * in.M,
                            part.out.data() + item * in.M * in.Dv};
  std::fill(st.mx, st.mx + in.M, -std::numeric_limits<acc_t>::infinity());
  std::fill(st.sum, st.sum + in.M, acc_t(0));
  std::fill(st.acc, st.acc + in.M * in.Dv, acc_t(0));
  const scalar_t* kh = in.k_head(w.b, w.h);
  const scalar_t* vh = in.v_head(w.b, w.h);
#if defined(CPU_CAPABILITY_AVX512)
  const bool vector_block = takes_vector_block<scalar_t>(in.D);
#endif
  for (int64_t jb = w.j0; jb < w.j1; jb += kBlock) {
    const int64_t n = std::min(kBlock, w.j1 - jb);
    const int64_t n_next = std::clamp<int64_t>(w.j1 - jb - kBlock, 0, kBlock);  // keys in the next block
    block_visibility(in.p, plan.rows[w.b].end, jb, n, s.lo.data(), s.hi.data());
#if defined(CPU_CAPABILITY_AVX512)
    if constexpr (std::is_same_v<scalar_t, float>) {
      if (vector_block) {
        attend_block_vector(in, s, plan, kh, vh, jb, n, n_next, next_item, st);
        continue;
      }
    }
#endif
    attend_block_rows(in, s, kh, vh, jb, n, n_next, st);
  }
}

// The output of each (row, query row): its chunks merged by their log-sum-exp weights, out = sum_c e^(max_c - max)
// out_c / sum_c e^(max_c - max) sum_c (zeros where the row sees no key).
template <typename scalar_t, typename acc_t>
void merge_chunks(const DecodeInputs<scalar_t>& in, const DecodePlan& plan, const Partials<acc_t>& part,
                  scalar_t* out) {
  using Vec = Vectorized<acc_t>;
  const int64_t M = in.M, Dv = in.Dv;
  at::parallel_for(0, in.p.batch * in.p.kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> merged(Dv);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / in.p.kv_heads, h = bh % in.p.kv_heads;
      const RowPlan& row = plan.rows[b];
      const int64_t first_item = row.item_base + h * row.chunks;
      for (int64_t m = 0; m < M; ++m) {
        acc_t gmax = -std::numeric_limits<acc_t>::infinity();
        for (int64_t c = 0; c < row.chunks; ++c) gmax = max_nan(gmax, part.max[(first_item + c) * M + m]);
        std::fill(merged.begin(), merged.end(), acc_t(0));
        if (gmax != -std::numeric_limits<acc_t>::infinity()) {
          acc_t denom = 0;
          for (int64_t c = 0; c < row.chunks; ++c) {
            const int64_t part_row = (first_item + c) * M + m;
            const acc_t w = std::exp(part.max[part_row] - gmax), one = 1;
            denom += w * part.sum[part_row];
            accumulate_rows<1>(merged.data(), 0, &one, &w, 0, part.out.data() + part_row * Dv, 0, 1, Dv);
          }
          at::vec::map([r = Vec(acc_t(1) / denom)](Vec x) { return x * r; }, merged.data(), merged.data(), Dv);
        }
        const int64_t t = m / in.G, g = m % in.G;
        convert_n(merged.data(), out + ((b * in.p.q_heads + h * in.G + g) * in.T + t) * Dv, Dv);
      }
    }
  });
}

// Work items (row b, cache head, chunk of keys) hold all G query heads of their cache head and all T queries, so
// every key and value row is read once per item; each writes partial results that merge_chunks combines.
template <typename scalar_t>
void decode_attention_typed(const DecodeAttentionParams& p, const void* q, const void* k, const void* v,
                            const int64_t* lengths, void* out) {
  using acc_t = at::opmath_type<scalar_t>;
  const DecodeInputs<scalar_t> in{p, static_cast<const scalar_t*>(q), static_cast<const scalar_t*>(k),
                                  static_cast<const scalar_t*>(v)};
  const DecodePlan plan(p, lengths);
  Partials<acc_t> part(plan.items, in.M, in.Dv);
  at::parallel_for(0, plan.items, 1, [&](int64_t begin, int64_t end) {
    Scratch<scalar_t> scratch(in);
    for (int64_t item = begin; item < end; ++item)
      attend_item(in, plan, item, item + 1 < end ? item + 1 : -1, scratch, part);
  });
  merge_chunks(in, plan, part, static_cast<scalar_t*>(out));
}

void decode_attention(const DecodeAttentionParams& p, at::ScalarType dtype, const void* q, const void* k, const void* v,
                      const int64_t* lengths, void* out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "decode_attention",
                                  [&] { decode_attention_typed<scalar_t>(p, q, k, v, lengths, out); });
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(decode_attention_kernel, &CPU_CAPABILITY::decode_attention);

}  // namespace pytransformer::cpu
