// CPU kernel of int8_linear, compiled once per ISA level (see isa.h): out [M, N] = (x [M, K] @ weight^T) * scale + bias
// with an int8 weight [N, K] (weight-only quantization).
//
// Few rows (decoding, M <= kMaxGemvRows): work items are blocks of 4 output features; their int8 weight rows are read
// once, widened chunk by chunk into an L1-resident buffer and dotted with all M rows of x (dot_rows: blocks of 4 weight
// rows by up to 4 rows of x, each load serving 4 products), so the product reads 1 byte per weight from memory instead
// of the float layer's 4. Many rows (prefill): the product is compute-bound, so blocks of weight rows are dequantized
// (times scale) into a buffer of 16 MiB and multiplied with ATen's GEMM. float16/bfloat16 x is computed in float32,
// float64 in float64.
#include "isa.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../int8_linear.h"
#include "dot_rows.h"

namespace pytransformer::cpu {

// out [M, N] (acc type) from x [M, K] (acc type, contiguous); scale and bias [N] in the acc type, bias may be null.
using Int8GemvFn = void (*)(const Int8LinearParams& p, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& scale, const at::Tensor* bias, at::Tensor& out);
// deq [n, K] = weight[:n] * scale[:n, None] in deq's (acc) type, for the first n = deq.size(0) rows.
using Int8DequantizeFn = void (*)(const at::Tensor& weight, const at::Tensor& scale, at::Tensor& deq);
extern KernelTable<Int8GemvFn> int8_gemv_kernel;
extern KernelTable<Int8DequantizeFn> int8_dequantize_kernel;

inline namespace CPU_CAPABILITY {

// dst[i] = src[i] * s for n elements (a plain loop that the compiler vectorises for the file's ISA level).
template <typename acc_t>
void widen(const int8_t* src, acc_t* dst, int64_t n, acc_t s) {
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<acc_t>(src[i]) * s;
}

constexpr int64_t kRowsPerItem = 4;  // weight rows per work item of the few-rows kernel
constexpr int64_t kChunk = 1024;     // weight columns widened at a time (4 x 1024 x 4 B = 16 KiB)

template <typename acc_t>
void int8_gemv_typed(const Int8LinearParams& p, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                     const at::Tensor* bias, at::Tensor& out) {
  const int64_t M = p.rows, N = p.out_features, K = p.in_features;
  const acc_t* xp = x.const_data_ptr<acc_t>();
  const int8_t* wp = weight.const_data_ptr<int8_t>();
  const acc_t* sp = scale.const_data_ptr<acc_t>();
  const acc_t* bp = bias ? bias->const_data_ptr<acc_t>() : nullptr;
  acc_t* op = out.mutable_data_ptr<acc_t>();
  const int64_t items = (N + kRowsPerItem - 1) / kRowsPerItem;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, kRowsPerItem * M * K));
  at::parallel_for(0, items, grain, [&](int64_t i0, int64_t i1) {
    std::vector<acc_t> rows(kRowsPerItem * std::min(K, kChunk));
    std::vector<acc_t> part(M * kRowsPerItem), sum(M * kRowsPerItem);  // [M, 4]
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t n = i * kRowsPerItem, nb = std::min(kRowsPerItem, N - n);
      std::fill(sum.begin(), sum.end(), acc_t(0));
      for (int64_t k0 = 0; k0 < K; k0 += kChunk) {
        const int64_t kc = std::min(kChunk, K - k0);
        for (int64_t r = 0; r < nb; ++r) widen<acc_t>(wp + (n + r) * K + k0, rows.data() + r * kc, kc, acc_t(1));
        dot_rows<acc_t>(rows.data(), kc, nb, xp + k0, K, M, kc, part.data(), 1, kRowsPerItem);
        for (int64_t j = 0; j < M * kRowsPerItem; ++j) sum[j] += part[j];
      }
      for (int64_t m = 0; m < M; ++m)
        for (int64_t r = 0; r < nb; ++r)
          op[m * N + n + r] = sum[m * kRowsPerItem + r] * sp[n + r] + (bp ? bp[n + r] : acc_t(0));
    }
  });
}

template <typename acc_t>
void int8_dequantize_typed(const at::Tensor& weight, const at::Tensor& scale, at::Tensor& deq) {
  const int64_t N = deq.size(0), K = deq.size(1);
  const int8_t* wp = weight.const_data_ptr<int8_t>();
  const acc_t* sp = scale.const_data_ptr<acc_t>();
  acc_t* dp = deq.mutable_data_ptr<acc_t>();
  at::parallel_for(0, N, std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, K)), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) widen<acc_t>(wp + n * K, dp + n * K, K, sp[n]);
  });
}

void int8_gemv(const Int8LinearParams& p, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
               const at::Tensor* bias, at::Tensor& out) {
  AT_DISPATCH_FLOATING_TYPES(out.scalar_type(), "int8_linear",
                             [&] { int8_gemv_typed<scalar_t>(p, x, weight, scale, bias, out); });
}

void int8_dequantize(const at::Tensor& weight, const at::Tensor& scale, at::Tensor& deq) {
  AT_DISPATCH_FLOATING_TYPES(deq.scalar_type(), "int8_linear",
                             [&] { int8_dequantize_typed<scalar_t>(weight, scale, deq); });
}
}  // namespace CPU_CAPABILITY

PT_REGISTER_CPU_KERNEL(int8_gemv_kernel, &CPU_CAPABILITY::int8_gemv);
PT_REGISTER_CPU_KERNEL(int8_dequantize_kernel, &CPU_CAPABILITY::int8_dequantize);

}  // namespace pytransformer::cpu

#if PT_ISA_LEVEL == 0
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <torch/library.h>

namespace pytransformer::cpu {
KernelTable<Int8GemvFn> int8_gemv_kernel;
KernelTable<Int8DequantizeFn> int8_dequantize_kernel;

namespace {
// Up to this many rows of x, the row-by-row kernel (memory-bound: it reads the int8 weight once); more rows go
// through dequantized weight blocks and GEMM.
constexpr int64_t kMaxGemvRows = 16;
// Bytes of dequantized weight per block of the many-rows path (the transient memory it needs).
constexpr int64_t kDequantizeBytes = int64_t(16) << 20;

at::Tensor int8_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& scale,
                           const std::optional<at::Tensor>& bias) {
  const Int8LinearParams p = check_int8_linear_args(x, weight, scale, bias);
  const auto acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor xa = x.reshape({p.rows, p.in_features}).to(acc).contiguous();  // [M, K]
  const at::Tensor w = weight.contiguous();                                       // [N, K]
  const at::Tensor s = scale.to(acc).contiguous();                                 // [N]
  const std::optional<at::Tensor> b = bias ? std::optional(bias->to(acc).contiguous()) : std::nullopt;
  at::Tensor out;  // [M, N] in acc
  if (p.rows <= kMaxGemvRows) {
    out = at::empty({p.rows, p.out_features}, xa.options());
    int8_gemv_kernel.get()(p, xa, w, s, b ? &*b : nullptr, out);
  } else {  // out^T [N, M] = deq @ x^T, block by block of weight rows (few blocks: each is two parallel regions)
    const at::Tensor out_t = at::empty({p.out_features, p.rows}, xa.options());
    const int64_t block = std::max<int64_t>(16, kDequantizeBytes / (std::max<int64_t>(1, p.in_features) *
                                                                    static_cast<int64_t>(xa.element_size())));
    at::Tensor deq = at::empty({std::min(block, p.out_features), p.in_features}, xa.options());
    for (int64_t n0 = 0; n0 < p.out_features; n0 += block) {
      const int64_t nb = std::min(block, p.out_features - n0);
      at::Tensor d = deq.narrow(0, 0, nb), o = out_t.narrow(0, n0, nb);
      int8_dequantize_kernel.get()(w.narrow(0, n0, nb), s.narrow(0, n0, nb), d);
      at::mm_out(o, d, xa.t());
    }
    out = b ? at::add(out_t.t(), *b) : out_t.t();
  }
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = p.out_features;
  return out.contiguous().to(x.scalar_type()).view(shape);
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) { m.impl("int8_linear", &int8_linear_cpu); }

}  // namespace pytransformer::cpu
#endif
