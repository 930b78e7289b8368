// CUDA glue of attention (forward and backward): the checks of attention.h shared with the CPU, operand preparation,
// and the choice between the kernel families of attention_launch.h, on the current stream of q's device.
// float16/bfloat16 with D, Dv <= 256 take the tensor-core path when its shared memory fits the device (operands padded
// to a multiple of 8 dims, rows 16-byte aligned); everything else takes the SIMT kernels.
#include <ATen/Context.h>
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <algorithm>
#include <iterator>
#include <type_traits>

#include "../attention.h"
#include "attention_launch.h"
#include "glue.h"

namespace pytransformer::cuda {
namespace {

constexpr int64_t kMmaDimMultiple = 8;

// The smallest of kMmaHeadDims that holds rows of `dim` elements (dim <= the largest, see use_mma).
int mma_head_dim(int64_t dim) { return *std::lower_bound(std::begin(kMmaHeadDims), std::end(kMmaHeadDims), dim); }

// Calls f(std::integral_constant<int, kHeadDim>) for head_dim, one of kMmaHeadDims.
template <class F>
void dispatch_mma_head_dim(int head_dim, F&& f) {
  static_assert(std::size(kMmaHeadDims) == 8, "one case per head dim below");
  switch (head_dim) {
    case kMmaHeadDims[0]: return f(std::integral_constant<int, kMmaHeadDims[0]>{});
    case kMmaHeadDims[1]: return f(std::integral_constant<int, kMmaHeadDims[1]>{});
    case kMmaHeadDims[2]: return f(std::integral_constant<int, kMmaHeadDims[2]>{});
    case kMmaHeadDims[3]: return f(std::integral_constant<int, kMmaHeadDims[3]>{});
    case kMmaHeadDims[4]: return f(std::integral_constant<int, kMmaHeadDims[4]>{});
    case kMmaHeadDims[5]: return f(std::integral_constant<int, kMmaHeadDims[5]>{});
    case kMmaHeadDims[6]: return f(std::integral_constant<int, kMmaHeadDims[6]>{});
    case kMmaHeadDims[7]: return f(std::integral_constant<int, kMmaHeadDims[7]>{});
    default: TORCH_CHECK(false, "internal error: no tensor-core kernel for head dim ", head_dim);
  }
}

// Whether the tensor-core kernels take a float16/bfloat16 call: a device of compute capability 8.0 or later (mma.sync
// with bf16 and cp.async; their kernels are empty in code built for older GPUs, see mma.cuh), D and Dv within the
// largest of kMmaHeadDims, lengths that 32-bit positions hold, and the shared memory of the forward (or backward) kernels within the device's
// per-block limit (sm_80/sm_90 fit every head dim; GPUs with ~100 KB a block, e.g. sm_86/sm_89, take the SIMT
// kernels for the larger head dims' backward).
bool use_mma(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool backward) {
  if (device_attribute(cudaDevAttrComputeCapabilityMajor) < 8) return false;
  const int64_t width = std::max(round_up(q.size(3), kMmaDimMultiple), round_up(v.size(3), kMmaDimMultiple));
  if (width > std::end(kMmaHeadDims)[-1] || std::max(q.size(2), k.size(2)) >= (int64_t(1) << 30)) return false;
  size_t smem = 0;
  dispatch_mma_head_dim(mma_head_dim(width), [&](auto head_dim) {
    using Tiles = MmaTiles<decltype(head_dim)::value>;
    smem = backward ? Tiles::kBwdSmem : Tiles::kFwdSmem;
  });
  return smem <= static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
}

// t with a unit last-dim stride (the SIMT kernels' only layout requirement; no copy when it has one).
at::Tensor simt_operand(const at::Tensor& t) { return t.size(-1) == 1 || t.stride(-1) == 1 ? t : t.contiguous(); }

// t for the tensor-core kernels: the last dim zero-padded to `width` (a multiple of 8) and every row 16-byte
// aligned (no copy when t already is so).
at::Tensor mma_operand(const at::Tensor& t, int64_t width) {
  at::Tensor r = t.size(3) == width ? t : at::constant_pad_nd(t, {0, width - t.size(3)});
  return rows_aligned16(r) ? r : r.clone(at::MemoryFormat::Contiguous);
}

// An output of `sizes` whose last dim is padded to `width` for the tensor-core kernels: `out` itself when no padding
// is needed (fresh contiguous tensors have aligned rows once the last dim is a multiple of 8).
at::Tensor padded_output(const at::Tensor& out, int64_t width) {
  if (out.size(3) == width) return out;
  return at::empty({out.size(0), out.size(1), out.size(2), width}, out.options());
}

// Copies the first out.size(3) dims of a padded output back into out (nothing when it is out).
void unpad_into(const at::Tensor& out, const at::Tensor& padded) {
  if (!padded.is_same(out)) out.copy_(padded.narrow(3, 0, out.size(3)));
}

// The float32 grad_q accumulator of the tensor-core backward: zeroed [B, Hq, Lq, Dp], or undefined (nullptr for the
// kernel) in deterministic mode, where a second kernel writes grad_q without atomics. attention_simt_dq converts it
// into grad_q.
at::Tensor mma_dq_accum(const at::Tensor& q, int64_t padded_dim) {
  if (at::globalContext().deterministicAlgorithms()) return at::Tensor();
  return at::zeros({q.size(0), q.size(1), q.size(2), padded_dim}, q.options().dtype(at::kFloat));
}

// A zeroed int32 flag on q's device, which the tensor-core kernels set when a row they write is not finite.
at::Tensor non_finite_flag(const at::Tensor& q) { return at::zeros({1}, q.options().dtype(at::kInt)); }

void check_simt_head_dims(const at::Tensor& q, const at::Tensor& v) {
  TORCH_CHECK_VALUE(q.size(3) <= kSimtMaxHeadDim && v.size(3) <= kSimtMaxHeadDim, "q, v: CUDA attention supports head ",
                    "dims D, Dv <= ", kSimtMaxHeadDim, ", got q ", q.sizes(), " and v ", v.sizes());
}

std::tuple<at::Tensor, at::Tensor> attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                  const std::optional<at::Tensor>& mask, bool causal,
                                                  std::optional<int64_t> window,
                                                  const std::optional<at::Tensor>& key_lengths, double scale) {
  check_attention_args(q, k, v, mask, window, key_lengths, scale);
  check_simt_head_dims(q, v);
  c10::cuda::CUDAGuard guard(q.device());
  const int64_t D = q.size(3), Dv = v.size(3);
  at::Tensor out = at::empty({q.size(0), q.size(1), q.size(2), Dv}, q.options());  // [B, Hq, Lq, Dv]
  at::Tensor lse = empty_lse(q);                                                  // [B, Hq, Lq] float32
  if (out.numel() == 0) return {out, lse};
  const at::Tensor mask_ = prepare_mask(mask, q, k.size(2)), lengths = prepare_key_lengths(key_lengths);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_float_types(q.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_same_v<T, float>) {
      if (use_mma(q, k, v, /*backward=*/false)) {
        const int64_t Dp = round_up(D, kMmaDimMultiple), Dvp = round_up(Dv, kMmaDimMultiple);
        const at::Tensor q_ = mma_operand(q, Dp), k_ = mma_operand(k, Dp), v_ = mma_operand(v, Dvp);
        const at::Tensor out_ = padded_output(out, Dvp), non_finite = non_finite_flag(q);
        AttentionParams p =
            make_attention_params(q_, k_, v_, out_, lse, mask_, causal, window, lengths, Dp, Dvp, scale);
        p.non_finite = non_finite.mutable_data_ptr<int>();
        dispatch_mma_head_dim(mma_head_dim(std::max(Dp, Dvp)), [&](auto head_dim) {
          attention_mma_fwd<T, decltype(head_dim)::value>(p, stream);
        });
        attention_simt_fwd<T>(p, stream);  // the fix-up pass (attention_mma.cuh, "Hidden keys and mma.sync")
        unpad_into(out, out_);
        return;
      }
    }
    const at::Tensor q_ = simt_operand(q), k_ = simt_operand(k), v_ = simt_operand(v);
    attention_simt_fwd<T>(make_attention_params(q_, k_, v_, out, lse, mask_, causal, window, lengths, D, Dv, scale),
                          stream);
  });
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_cuda(
    const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
    const at::Tensor& lse, const std::optional<at::Tensor>& mask, bool causal, std::optional<int64_t> window,
    const std::optional<at::Tensor>& key_lengths, double scale) {
  check_attention_args(q, k, v, mask, window, key_lengths, scale);
  check_attention_backward_args(grad_out, q, v, out, lse);
  check_simt_head_dims(q, v);
  c10::cuda::CUDAGuard guard(q.device());
  const int64_t D = q.size(3), Dv = v.size(3);
  // Gradients per K/V head: the kernels sum each GQA group themselves.
  at::Tensor gq = at::empty(q.sizes(), q.options()), gk = at::empty(k.sizes(), k.options());
  at::Tensor gv = at::empty(v.sizes(), v.options());
  if (q.numel() == 0 && k.numel() == 0 && v.numel() == 0) return {gq, gk, gv};
  const at::Tensor mask_ = prepare_mask(mask, q, k.size(2)), lengths = prepare_key_lengths(key_lengths);
  const at::Tensor lse_ = lse.contiguous();
  at::Tensor delta = at::empty(lse.sizes(), lse.options());  // [B, Hq, Lq] float32
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  dispatch_float_types(q.scalar_type(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    // Builds the parameters over prepared operands, computes delta and runs `kernel`(bp).
    auto run = [&](const at::Tensor& q_, const at::Tensor& k_, const at::Tensor& v_, const at::Tensor& go_,
                   const at::Tensor& out_, const at::Tensor& gq_, const at::Tensor& gk_, const at::Tensor& gv_,
                   int64_t dim, int64_t dim_v, auto&& kernel) {
      AttentionBackwardParams bp{};
      bp.fwd = make_attention_params(q_, k_, v_, out_, lse_, mask_, causal, window, lengths, dim, dim_v, scale);
      set_operand(go_, bp.grad_out, bp.go_stride);
      set_operand(gq_, bp.grad_q, bp.gq_stride);
      set_operand(gk_, bp.grad_k, bp.gk_stride);
      set_operand(gv_, bp.grad_v, bp.gv_stride);
      attention_delta<T>(bp, delta.mutable_data_ptr<float>(), stream);
      kernel(bp);
    };
    if constexpr (!std::is_same_v<T, float>) {
      if (use_mma(q, k, v, /*backward=*/true)) {
        const int64_t Dp = round_up(D, kMmaDimMultiple), Dvp = round_up(Dv, kMmaDimMultiple);
        const at::Tensor q_ = mma_operand(q, Dp), k_ = mma_operand(k, Dp), v_ = mma_operand(v, Dvp);
        const at::Tensor go_ = mma_operand(grad_out, Dvp), out_ = mma_operand(out, Dvp);
        const at::Tensor gq_ = padded_output(gq, Dp), gk_ = padded_output(gk, Dp), gv_ = padded_output(gv, Dvp);
        const at::Tensor dq_accum = mma_dq_accum(q, Dp);  // [B, Hq, Lq, Dp] float32, undefined when deterministic
        const at::Tensor non_finite = non_finite_flag(q);
        run(q_, k_, v_, go_, out_, gq_, gk_, gv_, Dp, Dvp, [&](AttentionBackwardParams bp) {
          bp.fwd.non_finite = non_finite.mutable_data_ptr<int>();
          float* accum = dq_accum.defined() ? dq_accum.mutable_data_ptr<float>() : nullptr;
          dispatch_mma_head_dim(mma_head_dim(std::max(Dp, Dvp)), [&](auto head_dim) {
            attention_mma_bwd<T, decltype(head_dim)::value>(bp, delta.const_data_ptr<float>(), accum, stream);
          });
          // grad_q from the atomic sums, or the fix-up pass of the dQ kernel; then that of the dK/dV kernel
          // (attention_mma.cuh, "Hidden keys and mma.sync")
          attention_simt_dq<T>(bp, delta.const_data_ptr<float>(), accum, stream);
          attention_simt_dkv<T>(bp, delta.const_data_ptr<float>(), stream);
        });
        unpad_into(gq, gq_), unpad_into(gk, gk_), unpad_into(gv, gv_);
        return;
      }
    }
    run(simt_operand(q), simt_operand(k), simt_operand(v), simt_operand(grad_out), simt_operand(out), gq, gk, gv, D,
        Dv, [&](const AttentionBackwardParams& bp) {
          attention_simt_bwd<T>(bp, delta.const_data_ptr<float>(), stream);
        });
  });
  return {gq, gk, gv};
}

}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CUDA, m) {
  m.impl("attention", &attention_cuda);
  m.impl("attention_backward", &attention_backward_cuda);
}

}  // namespace pytransformer::cuda
