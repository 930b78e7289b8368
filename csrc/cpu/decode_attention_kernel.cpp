// CPU kernel of decode_attention, compiled once per ISA level (see isa.h); the glue is decode_attention.cpp.
//
// q [B, Hq, T, D] attends to the first cache_lengths[b] rows of k_cache / v_cache [B, Hkv, capacity, D|Dv], read in
// place. Work items are (row b, cache head, chunk of keys): each holds all G = Hq / Hkv query heads of the cache head
// and all T queries (M = G * T query rows), so every key and value row is read once per item, and runs an online
// softmax over its chunk in blocks of kBlock keys. Items write a partial result (running max, sum of exponentials,
// unnormalised output) per query row; a second pass merges the chunks of a row (log-sum-exp) into the output.
// float16/bfloat16 blocks are widened to float32 once per item and block; float64 stays float64.
#include "isa.h"
#include "vec_util.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "../decode_attention.h"
#include "dot_rows.h"

namespace pytransformer::cpu {

extern KernelTable<DecodeAttentionCpuFn> decode_attention_kernel;

inline namespace CPU_CAPABILITY {
using at::vec::Vectorized;

constexpr int64_t kBlock = 32;     // keys scored together before the softmax update
constexpr int64_t kMinChunk = 256;  // fewest keys in a work item when a row is split along the sequence

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
    for (int64_t i = 0; i < n; ++i) at::vec::convert(base + (j0 + i) * step, buf + i * width, width);
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

// The key range [first, end) that row b's queries can see, split into chunks of `chunk` keys.
struct RowPlan {
  int64_t first, end, chunks, item_base;
};

template <typename scalar_t>
void decode_attention_typed(const DecodeAttentionParams& p, const void* q, const void* k, const void* v,
                            const int64_t* lengths, void* out) {
  using acc_t = at::opmath_type<scalar_t>;
  using Vec = Vectorized<acc_t>;
  constexpr acc_t kNegInf = -std::numeric_limits<acc_t>::infinity();
  const int64_t B = p.batch, Hkv = p.kv_heads, T = p.q_len, D = p.head_dim, Dv = p.v_head_dim;
  const int64_t G = p.q_heads / Hkv, M = G * T;

  // Plan: the keys each row sees (a window drops the keys before the first query's window) and the chunk size,
  // chosen so that there are about 4 work items per thread but never fewer than kMinChunk keys per item.
  std::vector<RowPlan> rows(B);
  int64_t total_keys = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t n = lengths[b];
    rows[b].first = p.window > 0 ? std::max<int64_t>(0, n - T - p.window + 1) : 0;
    rows[b].end = n;
    total_keys += (n - rows[b].first) * Hkv;
  }
  const int64_t target = at::divup(total_keys, 4 * static_cast<int64_t>(at::get_num_threads()));
  const int64_t chunk = at::divup(std::max(kMinChunk, target), kBlock) * kBlock;
  int64_t items = 0;
  for (auto& r : rows) {
    r.chunks = at::divup(r.end - r.first, chunk);
    r.item_base = items;
    items += r.chunks * Hkv;  // item = item_base + head * chunks + c
  }

  // Partial results per item and query row m = g * T + t (query head kv_head * G + g, query t).
  std::vector<acc_t> part_max(items * M), part_sum(items * M), part_out(items * M * Dv);
  const scalar_t* qp = static_cast<const scalar_t*>(q);
  const scalar_t* kp = static_cast<const scalar_t*>(k);
  const scalar_t* vp = static_cast<const scalar_t*>(v);

  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> qs(M * D), scores(M * kBlock), probs(M * kBlock), alpha(M);
    constexpr bool widen = !std::is_same_v<scalar_t, acc_t>;
    std::vector<acc_t> kbuf(widen ? kBlock * D : 0), vbuf(widen ? kBlock * Dv : 0);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = std::upper_bound(rows.begin(), rows.end(), item,
                                         [](int64_t i, const RowPlan& r) { return i < r.item_base; }) - rows.begin() - 1;
      const RowPlan& row = rows[b];
      const int64_t h = (item - row.item_base) / row.chunks, c = (item - row.item_base) % row.chunks;
      const int64_t j0 = row.first + c * chunk, j1 = std::min(row.end, j0 + chunk);
      // Scaled queries as acc_t rows [M, D].
      for (int64_t g = 0; g < G; ++g)
        for (int64_t t = 0; t < T; ++t) {
          acc_t* dst = qs.data() + (g * T + t) * D;
          const scalar_t* src = qp + b * p.q_stride[0] + (h * G + g) * p.q_stride[1] + t * p.q_stride[2];
          at::vec::convert(src, dst, D);
          at::vec::map([s = Vec(acc_t(p.scale))](Vec x) { return x * s; }, dst, dst, D);
        }
      acc_t* mx = part_max.data() + item * M;
      acc_t* sum = part_sum.data() + item * M;
      acc_t* acc = part_out.data() + item * M * Dv;
      std::fill(mx, mx + M, kNegInf);
      std::fill(sum, sum + M, acc_t(0));
      std::fill(acc, acc + M * Dv, acc_t(0));
      const scalar_t* kh = kp + b * p.k_stride[0] + h * p.k_stride[1];
      const scalar_t* vh = vp + b * p.v_stride[0] + h * p.v_stride[1];
      for (int64_t jb = j0; jb < j1; jb += kBlock) {
        const int64_t n = std::min(kBlock, j1 - jb);
        int64_t k_step, v_step;
        const acc_t* krows = rows_as_acc(kh, p.k_stride[2], jb, n, D, kbuf.data(), k_step);
        if (jb + kBlock < j1) {  // the next block's key and value rows
          const int64_t next = std::min(kBlock, j1 - jb - kBlock);
          prefetch_rows(kh, p.k_stride[2], jb + kBlock, next, D);
          prefetch_rows(vh, p.v_stride[2], jb + kBlock, next, Dv);
        }
        // Scores [M, kBlock]: query t (position row.end - T + t) sees the keys in (pos - window, pos], one range of
        // the block scored by one dot_rows call (its G query heads by blocks of keys); invisible keys and the unused
        // tail of the block score -inf.
        std::fill(scores.begin(), scores.end(), kNegInf);
        for (int64_t t = 0; t < T; ++t) {
          const int64_t pos = row.end - T + t;
          const int64_t lo = std::max(jb, p.window > 0 ? pos - p.window + 1 : jb), hi = std::min(jb + n, pos + 1);
          if (lo < hi)
            dot_rows(qs.data() + t * D, T * D, G, krows + (lo - jb) * k_step, k_step, hi - lo, D,
                     scores.data() + t * kBlock + (lo - jb), T * kBlock, 1);
        }
        // Online softmax update of each query row with this block: rescale by alpha = e^(old max - new max) and
        // add the block's probabilities probs = e^(score - new max) (a row with no visible key here: alpha 1, probs 0).
        for (int64_t m = 0; m < M; ++m) {
          const acc_t* s = scores.data() + m * kBlock;
          acc_t* pm = probs.data() + m * kBlock;
          const acc_t block_max = at::vec::reduce_all<acc_t>([](Vec a, Vec b) { return at::vec::maximum(a, b); }, s,
                                                             kBlock);
          if (block_max == kNegInf) {
            alpha[m] = acc_t(1);
            std::fill(pm, pm + kBlock, acc_t(0));
            continue;
          }
          const acc_t new_max = max_nan(mx[m], block_max);  // NaN (in q or a visible key) stays NaN
          alpha[m] = std::exp(mx[m] - new_max);  // 0 while the row was empty
          at::vec::map([nm = Vec(new_max)](Vec x) { return (x - nm).exp(); }, pm, s, kBlock);
          sum[m] = sum[m] * alpha[m] + at::vec::reduce_all<acc_t>(std::plus<Vec>(), pm, kBlock);
          mx[m] = new_max;
        }
        const acc_t* vrows = rows_as_acc(vh, p.v_stride[2], jb, n, Dv, vbuf.data(), v_step);
        accumulate_rows(acc, Dv, M, alpha.data(), probs.data(), kBlock, vrows, v_step, n, Dv);
      }
    }
  });

  // Merge the chunks of each (row, query row): out = sum_c e^(max_c - max) out_c / sum_c e^(max_c - max) sum_c.
  scalar_t* op = static_cast<scalar_t*>(out);
  at::parallel_for(0, B * Hkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<acc_t> merged(Dv);
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / Hkv, h = bh % Hkv;
      const RowPlan& row = rows[b];
      const int64_t first_item = row.item_base + h * row.chunks;
      for (int64_t m = 0; m < M; ++m) {
        acc_t gmax = kNegInf;
        for (int64_t c = 0; c < row.chunks; ++c) gmax = max_nan(gmax, part_max[(first_item + c) * M + m]);
        std::fill(merged.begin(), merged.end(), acc_t(0));
        if (gmax != kNegInf) {  // else no visible key: zeros
          acc_t denom = 0;
          for (int64_t c = 0; c < row.chunks; ++c) {
            const int64_t part = (first_item + c) * M + m;
            const acc_t w = std::exp(part_max[part] - gmax);
            denom += w * part_sum[part];
            const acc_t one = 1;
            accumulate_rows<1>(merged.data(), 0, &one, &w, 0, part_out.data() + part * Dv, 0, 1, Dv);
          }
          at::vec::map([r = Vec(acc_t(1) / denom)](Vec x) { return x * r; }, merged.data(), merged.data(), Dv);
        }
        const int64_t g = m / T, t = m % T;
        at::vec::convert(merged.data(), op + ((b * p.q_heads + h * G + g) * T + t) * Dv, Dv);
      }
    }
  });
}

void decode_attention(const DecodeAttentionParams& p, at::ScalarType dtype, const void* q, const void* k, const void* v,
                      const int64_t* lengths, void* out) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, dtype, "decode_attention",
                                  [&] { decode_attention_typed<scalar_t>(p, q, k, v, lengths, out); });
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(decode_attention_kernel, &CPU_CAPABILITY::decode_attention);

}  // namespace pytransformer::cpu
