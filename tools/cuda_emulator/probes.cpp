// Ops of the emulator alone: the sanitizers' planted bugs (probe_race, probe_bug; tests/ops/test_emulator_sanitizers.py)
// and the fast-math numerics as kernel code gets them (probe_fast_math; tests/ops/test_emulator_fast_math.py). The
// primitives' layout probes, which also run on a GPU, are tools/ptx_probes.cu. build.py rewrites this file as it does
// the CUDA sources (__shared__ arrays, data pointers).
#include "prelude.h"

#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include "cuda/mma.cuh"

using namespace pytransformer::cuda;

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

// One bug per detector, and two that only give wrong values (made loud: see stubs.cpp and build.py), in 64 threads
// (two warps) over x: [64] -> out: [64] (fresh memory); `planted` false: the correct kernel.
enum Bug : int64_t {
  kBarrier, kDynamicBarrier, kWarpBarrier, kPadding, kReadPastRow, kWritePastRow, kDivergent, kExit,
  kPastSharedArray, kUnwritten, kUninitialized, kMisalignedGlobal, kMisalignedShared
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
    case kUnwritten:  // planted, thread 63 writes nothing: its element keeps what fresh memory holds
      if (!planted || t != 63) out[t] = x[t];
      break;
    case kUninitialized: {  // planted, a local array is read before anything is written to it
      float acc[2];
      if (!planted) acc[0] = acc[1] = 0.f;
      out[t] = acc[t % 2] + x[t];
      break;
    }
    case kMisalignedGlobal: {  // memcheck: planted, float2 loads from x one float past their 8-byte boundaries
      const float2 v = reinterpret_cast<const float2*>(x + planted)[t % 16];
      out[t] = v.x + v.y;
      break;
    }
    case kMisalignedShared: {  // memcheck: planted, the same from dynamic shared memory
      dyn[t] = x[t];
      __syncthreads();
      const float2 v = reinterpret_cast<const float2*>(dyn + planted)[t % 16];
      out[t] = v.x + v.y;
      break;
    }
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
  TORCH_CHECK_VALUE(bug >= kBarrier && bug <= kMisalignedShared, "bug: expected 0..", int64_t(kMisalignedShared),
                    ", got ", bug);
  TORCH_CHECK_VALUE(x.sizes() == at::IntArrayRef{64} && x.scalar_type() == at::kFloat && x.is_contiguous(),
                    "x: expected contiguous float32 [64]");
  at::Tensor out = at::empty_like(x);
  emu::launch(emu_bug_kernel, dim3(1), dim3(64), 64 * sizeof(float), cudaStream_t{}, bug, planted,
              x.const_data_ptr<float>(), out.mutable_data_ptr<float>());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(pytransformer_emu, m) {
  m.def("probe_race(int variant) -> ()", &probe_race);
  m.def("probe_bug(int bug, bool planted, Tensor x) -> Tensor", &probe_bug);
  m.def("probe_fast_math(int fn, Tensor x) -> Tensor", &probe_fast_math);
}
