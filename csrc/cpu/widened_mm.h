#pragma once
// widened_mm: the many-rows (prefill) product of a weight stored narrower than the accumulation, where no kernel of ours
// multiplies it faster: blocks of weight rows widened into a buffer of at most kWidenBytes (the transient memory the
// product needs) and ATen's GEMM on each. Shared by the glue of linear (bfloat16 weights without AVX-512 BF16) and of
// int8_linear (int8 weights without AVX-512 VNNI).
#include <ATen/ops/add.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>

#include <algorithm>
#include <cstdint>
#include <optional>

namespace pytransformer::cpu {

constexpr int64_t kWidenBytes = int64_t(16) << 20;

// out [M, N] = x [M, K] @ W^T + bias in x's dtype (a float type), W [N, K] given block by block: widen(n0, nb, dst)
// writes rows [n0, n0 + nb) of W into dst [nb, K] (contiguous, x's dtype). Computed as out^T [N, M] = W @ x^T one
// block of rows at a time (few blocks: each is two parallel regions), the bias added at the end.
template <class Widen>
at::Tensor widened_mm(const at::Tensor& x, int64_t N, const std::optional<at::Tensor>& bias, Widen&& widen) {
  const int64_t K = x.size(1);
  const at::Tensor out_t = at::empty({N, x.size(0)}, x.options());
  const int64_t block = std::max<int64_t>(16, kWidenBytes / (std::max<int64_t>(1, K) * x.element_size()));
  at::Tensor buf = at::empty({std::min(block, N), K}, x.options());
  for (int64_t n0 = 0; n0 < N; n0 += block) {
    const int64_t nb = std::min(block, N - n0);
    at::Tensor d = buf.narrow(0, 0, nb);
    widen(n0, nb, d);
    at::Tensor o = out_t.narrow(0, n0, nb);
    at::mm_out(o, d, x.t());
  }
  return (bias ? at::add(out_t.t(), *bias) : out_t.t()).contiguous();
}

}  // namespace pytransformer::cpu
