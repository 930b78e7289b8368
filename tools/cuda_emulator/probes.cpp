// Ops that run one warp's instruction primitive (csrc/cuda/mma.cuh with the bodies of ptx.h) on given operands, for
// the layout oracle of tests/ops/test_ptx_layouts.py (probe_ldmatrix, probe_mma), and the racecheck's planted races
// (probe_race, tests/ops/test_emulator_sanitizers.py).
#include "prelude.h"

#include <ATen/ops/zeros.h>
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

namespace {

void probe_race(int64_t variant) {
  TORCH_CHECK_VALUE(variant >= 0 && variant <= 3, "variant: expected 0..3, got ", variant);
  static uint4 src[32];
  emu::launch(emu_race_kernel, dim3(1), dim3(64), 1024, cudaStream_t{}, variant, static_cast<const uint4*>(src));
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
}
