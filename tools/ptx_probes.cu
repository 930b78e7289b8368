// Probe ops of the instruction primitives that the tensor-core kernels build on (csrc/cuda/mma.cuh: ldmatrix,
// mma.sync m16n8k16, cp.async), one warp on given operands, registered as torch.ops.pytransformer_probes. The layout
// oracle of tests/ops/test_ptx_layouts.py runs them against tables written from the PTX ISA: on a GPU (this file
// built at test time with torch.utils.cpp_extension, the extension's nvcc flags) the instructions themselves, and
// through the host emulator (tools/cuda_emulator/build.py rewrites this file as it does csrc/cuda) the host bodies
// that the emulated kernels run in their place. Operands and results are tensors on the probe's device.
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cstdint>

#include "cuda/mma.cuh"

namespace pytransformer::cuda {
namespace {

// Shared memory holds the n_rows rows of smem_rows (8 16-bit elements a row); lane l passes the address of row
// rows[l] and stores its kNum registers to regs[l].
template <bool kTrans, int kNum>
__global__ void probe_ldmatrix_kernel(const uint16_t* smem_rows, int64_t n_rows, const int64_t* rows, int64_t* regs) {
  extern __shared__ __align__(16) unsigned char probe_smem[];
  auto* s = reinterpret_cast<uint16_t*>(probe_smem);
  const unsigned lane = threadIdx.x;
  for (int64_t i = lane; i < n_rows * 8; i += 32) s[i] = smem_rows[i];
  __syncthreads();
  uint32_t r[kNum];
  ldmatrix<kTrans>(r, s + 8 * rows[lane]);
  for (int i = 0; i < kNum; ++i) regs[lane * kNum + i] = r[i];
}

// Lane l holds A registers a[l], B registers b[l] and accumulators c[l]; c[l] = the lane's part of A B + C.
template <typename T>
__global__ void probe_mma_kernel(const int64_t* a, const int64_t* b, float* c) {
  const unsigned lane = threadIdx.x;
  Frag fa;
  uint32_t fb[2];
  for (int i = 0; i < 4; ++i) fa[i] = static_cast<uint32_t>(a[lane * 4 + i]);
  for (int i = 0; i < 2; ++i) fb[i] = static_cast<uint32_t>(b[lane * 2 + i]);
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[lane * 4 + i];
  mma_16816<T>(acc, fa, fb);
  for (int i = 0; i < 4; ++i) c[lane * 4 + i] = acc[i];
}

// Shared memory filled with 0xff bytes; then 16-byte chunk i copied from src[i] by cp.async (zeros where !valid[i]),
// committed, waited for, and stored to out[i].
__global__ void probe_cp_async_kernel(const uint4* src, const bool* valid, int64_t n, uint4* out) {
  extern __shared__ __align__(16) unsigned char probe_smem[];
  auto* s = reinterpret_cast<uint4*>(probe_smem);
  for (int64_t i = threadIdx.x; i < n; i += 32) s[i] = make_uint4(~0u, ~0u, ~0u, ~0u);
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += 32) cp_async_16(s + i, valid[i] ? src + i : src, valid[i]);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += 32) out[i] = s[i];
}

// smem: [n, 8] int16 (bit patterns), rows: [32] int64 -> [32, num] int64 registers.
at::Tensor probe_ldmatrix(const at::Tensor& smem, const at::Tensor& rows, int64_t num, bool trans) {
  TORCH_CHECK_VALUE(smem.dim() == 2 && smem.size(1) == 8 && smem.scalar_type() == at::kShort,
                    "smem: expected int16 [n, 8]");
  TORCH_CHECK_VALUE(rows.sizes() == at::IntArrayRef{32} && rows.scalar_type() == at::kLong,
                    "rows: expected int64 [32]");
  TORCH_CHECK_VALUE(num == 1 || num == 2 || num == 4, "num: expected 1, 2 or 4, got ", num);
  c10::cuda::CUDAGuard guard(smem.device());
  const at::Tensor s = smem.contiguous(), r = rows.contiguous();
  at::Tensor regs = at::empty({32, num}, rows.options());
  const auto* sp = reinterpret_cast<const uint16_t*>(s.const_data_ptr());
  const size_t bytes = s.numel() * 2;
  const int64_t n = s.size(0);
  const int64_t* rp = r.const_data_ptr<int64_t>();
  int64_t* out = regs.mutable_data_ptr<int64_t>();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  const auto run = [&](auto kernel) { kernel<<<1, 32, bytes, stream>>>(sp, n, rp, out); };
  if (num == 1) trans ? run(probe_ldmatrix_kernel<true, 1>) : run(probe_ldmatrix_kernel<false, 1>);
  if (num == 2) trans ? run(probe_ldmatrix_kernel<true, 2>) : run(probe_ldmatrix_kernel<false, 2>);
  if (num == 4) trans ? run(probe_ldmatrix_kernel<true, 4>) : run(probe_ldmatrix_kernel<false, 4>);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return regs;
}

// a: [32, 4], b: [32, 2] int64 registers (two 16-bit elements each), c: [32, 4] float32 -> d = a * b + c, [32, 4].
at::Tensor probe_mma(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c, bool bf16) {
  TORCH_CHECK_VALUE(a.sizes() == at::IntArrayRef({32, 4}) && a.scalar_type() == at::kLong, "a: expected int64 [32, 4]");
  TORCH_CHECK_VALUE(b.sizes() == at::IntArrayRef({32, 2}) && b.scalar_type() == at::kLong, "b: expected int64 [32, 2]");
  TORCH_CHECK_VALUE(c.sizes() == at::IntArrayRef({32, 4}) && c.scalar_type() == at::kFloat,
                    "c: expected float [32, 4]");
  c10::cuda::CUDAGuard guard(a.device());
  const at::Tensor a_ = a.contiguous(), b_ = b.contiguous();
  at::Tensor d = c.contiguous().clone();
  const int64_t* ap = a_.const_data_ptr<int64_t>();
  const int64_t* bp = b_.const_data_ptr<int64_t>();
  float* dp = d.mutable_data_ptr<float>();
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (bf16) {
    probe_mma_kernel<__nv_bfloat16><<<1, 32, 0, stream>>>(ap, bp, dp);
  } else {
    probe_mma_kernel<__half><<<1, 32, 0, stream>>>(ap, bp, dp);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return d;
}

// src: [n, 16] uint8 chunks, valid: [n] bool -> [n, 16] uint8: src's chunk where valid, else zeros (cp.async).
at::Tensor probe_cp_async(const at::Tensor& src, const at::Tensor& valid) {
  TORCH_CHECK_VALUE(src.dim() == 2 && src.size(1) == 16 && src.scalar_type() == at::kByte,
                    "src: expected uint8 [n, 16]");
  TORCH_CHECK_VALUE(valid.sizes() == src.sizes().slice(0, 1) && valid.scalar_type() == at::kBool,
                    "valid: expected bool [n]");
  c10::cuda::CUDAGuard guard(src.device());
  const at::Tensor s = src.contiguous(), v = valid.contiguous();  // fresh allocations: 16-byte aligned
  at::Tensor out = at::empty_like(s);
  const int64_t n = s.size(0);
  const auto* sp = reinterpret_cast<const uint4*>(s.const_data_ptr());
  const bool* vp = v.const_data_ptr<bool>();
  auto* op = reinterpret_cast<uint4*>(out.mutable_data_ptr());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (n > 0) probe_cp_async_kernel<<<1, 32, n * 16, stream>>>(sp, vp, n, op);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

}  // namespace

TORCH_LIBRARY(pytransformer_probes, m) {
  m.def("probe_ldmatrix(Tensor smem, Tensor rows, int num, bool trans) -> Tensor");
  m.def("probe_mma(Tensor a, Tensor b, Tensor c, bool bf16) -> Tensor");
  m.def("probe_cp_async(Tensor src, Tensor valid) -> Tensor");
}

TORCH_LIBRARY_IMPL(pytransformer_probes, CUDA, m) {
  m.impl("probe_ldmatrix", &probe_ldmatrix);
  m.impl("probe_mma", &probe_mma);
  m.impl("probe_cp_async", &probe_cp_async);
}

}  // namespace pytransformer::cuda
