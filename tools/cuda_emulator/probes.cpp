// Ops that run one warp's instruction primitive (csrc/cuda/mma.cuh with the bodies of ptx.h) on given operands, for
// the layout oracle of tests/ops/test_ptx_layouts.py (probe_ldmatrix, probe_mma), and the sanitizers' planted bugs
// (probe_race, probe_bug; tests/ops/test_emulator_sanitizers.py). build.py rewrites this file as it does the CUDA
// sources (__shared__ arrays, data pointers).
#include "prelude.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/library.h>

#include "cuda/mma.cuh"

using namespace pytransformer::cuda;

namespace {

// Lane l passes the address of shared-memory row rows[l] (8 16-bit elements a row) and stores its registers.
template <bool kTrans, int kNum>
void ldmatrix_kernel(const uint16_t* smem_rows, int64_t n_rows, const int64_t* rows, int64_t* regs) {
  auto* s = reinterpret_cast<uint16_t*>(emu::dynamic_smem);
  const unsigned lane = emu::linear_tid();
  for (int64_t i = lane; i < n_rows * 8; i += 32) s[i] = smem_rows[i];
  __syncthreads();
  uint32_t r[kNum];
  ldmatrix<kTrans>(r, s + 8 * rows[lane]);
  for (int i = 0; i < kNum; ++i) regs[lane * kNum + i] = r[i];
}

template <typename T>
void mma_kernel(const int64_t* a, const int64_t* b, float* c) {
  const unsigned lane = emu::linear_tid();
  uint32_t fa[4], fb[2];
  for (int i = 0; i < 4; ++i) fa[i] = static_cast<uint32_t>(a[lane * 4 + i]);
  for (int i = 0; i < 2; ++i) fb[i] = static_cast<uint32_t>(b[lane * 2 + i]);
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[lane * 4 + i];
  mma_16816<T>(acc, fa, fb);
  for (int i = 0; i < 4; ++i) c[lane * 4 + i] = acc[i];
}

}  // namespace

// The racecheck's cases (prelude.h; outside the anonymous namespace, so that a report can name the kernel), 64
// threads over 1 KiB of shared memory: warp 0 fills granule `lane` by cp.async, warp 1 reads granule `lane` by
// ldmatrix. 0: correct (wait, barrier, read); 1: the barrier missing;
// 2: warp 0 reads its own granules before its wait; 3: warp 1 reads, then warp 0's cp.async overwrites with no
// barrier between.
void emu_race_kernel(int64_t variant, const uint4* src) {
  auto* s = reinterpret_cast<uint4*>(emu::dynamic_smem);
  const unsigned tid = emu::linear_tid(), lane = tid % 32, warp = tid / 32;
  uint32_t r[4];
  if (variant == 3 && warp == 1) ldmatrix<false>(r, s + lane);
  if (warp == 0) {
    cp_async_16(s + lane, src + lane, true);
    cp_async_commit();
    if (variant == 2) ldmatrix<false>(r, s + lane);
    cp_async_wait<0>();
  }
  if (variant != 1) __syncthreads();
  if (variant != 3 && warp == 1) ldmatrix<false>(r, s + lane);
}

// One bug per detector, in 64 threads (two warps) over x: [64] -> out: [64]; `planted` false: the correct kernel.
enum Bug : int64_t {
  kBarrier, kDynamicBarrier, kWarpBarrier, kPadding, kReadPastRow, kWritePastRow, kDivergent, kExit,
  kPastSharedArray
};
void emu_bug_kernel(int64_t bug, bool planted, const float* x, float* out) {
  __shared__ float s[65];
  extern __shared__ float dyn[];
  const int t = int(threadIdx.x), lane = t % 32;
  switch (bug) {
    case kBarrier:  // racecheck: the barrier between the stores and another warp's loads removed
      s[t] = x[t];
      if (!planted) __syncthreads();
      out[t] = s[63 - t];
      break;
    case kDynamicBarrier:  // the same in dynamic shared memory
      dyn[t] = x[t];
      if (!planted) __syncthreads();
      out[t] = dyn[63 - t];
      break;
    case kWarpBarrier:  // __syncwarp orders the lanes of one warp only: planted, a lane reads the other warp's store
      s[t] = x[t];
      __syncwarp();
      out[t] = s[planted ? t ^ 32 : t ^ 1];
      break;
    case kPadding:  // initcheck: planted, thread 63 reads s[64], which no thread wrote
      s[t] = x[t];
      __syncthreads();
      out[t] = s[t + planted];
      break;
    case kReadPastRow:  // memcheck: planted, thread 63 reads one element past the end of x
      out[t] = x[t + planted];
      break;
    case kWritePastRow:  // memcheck: planted, thread 63 writes one element past the end of out
      out[t + planted] = x[t];
      break;
    case kDivergent:  // synccheck: planted, the warps wait at different __syncthreads
      if (planted && t >= 32) {
        __syncthreads();
      } else {
        __syncthreads();
      }
      out[t] = x[t];
      break;
    case kExit:  // synccheck: planted, warp 1 exits before the barrier that warp 0 waits at
      if (planted && t >= 32) return;
      __syncthreads();
      out[t] = x[t] + float(lane);
      break;
    case kPastSharedArray:  // memcheck: planted, thread 63 reads s[65], one element past the end of s
      s[t] = x[t];
      if (t == 0) s[64] = 0.f;
      __syncthreads();
      out[t] = s[planted && t == 63 ? 65 : t];
      break;
  }
}

// The --use_fast_math numerics (fast_math.h) as kernel code gets them (the calls rewritten, denormals flushed):
// out = f(x) for fn 0: exp2f, 1: __expf, 2: log2f, 3: logf, 4: rsqrtf, 5: x * 2^-100 (a plain float32 multiply),
// 6: 1.f / x.
void emu_fast_math_kernel(int64_t fn, const float* x, float* out, int64_t n) {
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = x[i];
    out[i] = fn == 0 ? exp2f(v) : fn == 1 ? __expf(v) : fn == 2 ? log2f(v) : fn == 3 ? logf(v) : fn == 4 ? rsqrtf(v)
             : fn == 5 ? v * 0x1p-100f : 1.f / v;
  }
}

namespace {

at::Tensor probe_fast_math(int64_t fn, const at::Tensor& x) {
  TORCH_CHECK_VALUE(fn >= 0 && fn <= 6, "fn: expected 0..6, got ", fn);
  TORCH_CHECK_VALUE(x.dim() == 1 && x.scalar_type() == at::kFloat && x.is_contiguous(), "x: expected float32 [n]");
  at::Tensor out = at::empty_like(x);
  emu::launch(emu_fast_math_kernel, dim3(1), dim3(32), 0, cudaStream_t{}, fn, x.const_data_ptr<float>(),
              out.mutable_data_ptr<float>(), x.numel());
  return out;
}

void probe_race(int64_t variant) {
  TORCH_CHECK_VALUE(variant >= 0 && variant <= 3, "variant: expected 0..3, got ", variant);
  const at::Tensor src = at::zeros({32 * 16}, at::kByte);
  emu::launch(emu_race_kernel, dim3(1), dim3(64), 1024, cudaStream_t{}, variant,
              reinterpret_cast<const uint4*>(src.const_data_ptr()));
}

at::Tensor probe_bug(int64_t bug, bool planted, const at::Tensor& x) {
  TORCH_CHECK_VALUE(bug >= kBarrier && bug <= kPastSharedArray, "bug: expected 0..", int64_t(kPastSharedArray),
                    ", got ", bug);
  TORCH_CHECK_VALUE(x.sizes() == at::IntArrayRef{64} && x.scalar_type() == at::kFloat && x.is_contiguous(),
                    "x: expected contiguous float32 [64]");
  at::Tensor out = at::zeros_like(x);
  emu::launch(emu_bug_kernel, dim3(1), dim3(64), 64 * sizeof(float), cudaStream_t{}, bug, planted,
              x.const_data_ptr<float>(), out.mutable_data_ptr<float>());
  return out;
}

// smem: [n_rows, 8] int16 (bit patterns), rows: [32] int64 -> [32, num] int64 registers.
at::Tensor probe_ldmatrix(const at::Tensor& smem, const at::Tensor& rows, int64_t num, bool trans) {
  TORCH_CHECK_VALUE(smem.dim() == 2 && smem.size(1) == 8 && smem.scalar_type() == at::kShort, "smem: expected int16 [n, 8]");
  TORCH_CHECK_VALUE(rows.sizes() == at::IntArrayRef{32} && rows.scalar_type() == at::kLong, "rows: expected int64 [32]");
  TORCH_CHECK_VALUE(num == 1 || num == 2 || num == 4, "num: expected 1, 2 or 4, got ", num);
  const at::Tensor s = smem.contiguous(), r = rows.contiguous();
  at::Tensor regs = at::zeros({32, num}, rows.options());
  const auto* sp = reinterpret_cast<const uint16_t*>(s.const_data_ptr());
  auto run = [&](auto kernel) {
    emu::launch(kernel, dim3(1), dim3(32), s.numel() * 2, cudaStream_t{}, sp, s.size(0), r.const_data_ptr<int64_t>(),
                regs.mutable_data_ptr<int64_t>());
  };
  if (num == 1) trans ? run(ldmatrix_kernel<true, 1>) : run(ldmatrix_kernel<false, 1>);
  if (num == 2) trans ? run(ldmatrix_kernel<true, 2>) : run(ldmatrix_kernel<false, 2>);
  if (num == 4) trans ? run(ldmatrix_kernel<true, 4>) : run(ldmatrix_kernel<false, 4>);
  return regs;
}

// a: [32, 4], b: [32, 2] int64 registers (two 16-bit elements each), c: [32, 4] float32 -> d = a * b + c, [32, 4].
at::Tensor probe_mma(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, bool bf16) {
  TORCH_CHECK_VALUE(a.sizes() == at::IntArrayRef({32, 4}) && a.scalar_type() == at::kLong, "a: expected int64 [32, 4]");
  TORCH_CHECK_VALUE(b.sizes() == at::IntArrayRef({32, 2}) && b.scalar_type() == at::kLong, "b: expected int64 [32, 2]");
  TORCH_CHECK_VALUE(c.sizes() == at::IntArrayRef({32, 4}) && c.scalar_type() == at::kFloat, "c: expected float [32, 4]");
  const at::Tensor a_ = a.contiguous(), b_ = b.contiguous();
  at::Tensor d = c.contiguous().clone();
  auto run = [&](auto kernel) {
    emu::launch(kernel, dim3(1), dim3(32), 0, cudaStream_t{}, a_.const_data_ptr<int64_t>(),
                b_.const_data_ptr<int64_t>(), d.mutable_data_ptr<float>());
  };
  bf16 ? run(mma_kernel<__nv_bfloat16>) : run(mma_kernel<__half>);
  return d;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pytransformer_emu, m) {
  m.def("probe_ldmatrix(Tensor smem, Tensor rows, int num, bool trans) -> Tensor", &probe_ldmatrix);
  m.def("probe_mma(Tensor a, Tensor b, Tensor c, bool bf16) -> Tensor", &probe_mma);
  m.def("probe_race(int variant) -> ()", &probe_race);
  m.def("probe_bug(int bug, bool planted, Tensor x) -> Tensor", &probe_bug);
  m.def("probe_fast_math(int fn, Tensor x) -> Tensor", &probe_fast_math);
}
