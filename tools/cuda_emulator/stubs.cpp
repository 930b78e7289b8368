// The CUDA runtime calls of the launch code, answered by the emulator, and a knob for the device it pretends to be.
#include "prelude.h"

#include <c10/core/CPUAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <torch/library.h>

#include <cstring>
#include <stdexcept>
#include <string>

// emu_switch (prelude.h) for x86-64 System V, where rbx, rbp and r12-r15 are the callee-saved registers.
asm(R"(
  .text
  .globl emu_switch
  .hidden emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");

extern "C" {
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;  // an H100's opt-in limit
    case cudaDevAttrComputeCapabilityMajor: *value = emu::compute_capability / 10; break;
    case cudaDevAttrComputeCapabilityMinor: *value = emu::compute_capability % 10; break;
    case cudaDevAttrMultiProcessorCount: *value = emu::sm_count; break;
    default: return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void*, int, size_t,
                                                                   unsigned int) {
  *blocks = emu::blocks_per_sm;
  return cudaSuccess;
}
}

namespace c10::cuda {
void c10_cuda_check_implementation(const int32_t err, const char* file, const char*, const uint32_t line, const bool) {
  if (err) throw std::runtime_error(std::string("emulated CUDA error at ") + file + ":" + std::to_string(line));
}
}  // namespace c10::cuda

TORCH_LIBRARY_FRAGMENT(pytransformer_emu, m) {
  m.def("set_device(int sm_count, int blocks_per_sm, int compute_capability=90) -> ()",
        [](int64_t sms, int64_t blocks, int64_t cc) {
          emu::sm_count = static_cast<int>(sms);
          emu::blocks_per_sm = static_cast<int>(blocks);
          emu::compute_capability = static_cast<int>(cc);
        });
  // The kernels launched since the last call (mangled names), oldest first.
  m.def("launched_kernels() -> str[]", [] { return std::exchange(emu::launched, {}); });
  // The same, for the coverage map of tests/conftest.py (tools/cuda_emulator/coverage.py), which takes them per test.
  m.def("reached_kernels() -> str[]", [] { return std::exchange(emu::reached, {}); });
}

extern "C" cudaError_t cudaFuncSetAttribute(const void* func, enum cudaFuncAttribute attr, int value) {
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) emu::max_dynamic_smem[func] = static_cast<size_t>(value);
  return cudaSuccess;
}
// ---- KV cache (kv_cache_append, decode_attention): graph capture, pretended with set_capturing ----
namespace emu {
bool capturing = false;
}
extern "C" cudaError_t cudaStreamIsCapturing(cudaStream_t, cudaStreamCaptureStatus* status) {
  *status = emu::capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

TORCH_LIBRARY_FRAGMENT(pytransformer_emu, m) {
  m.def("set_capturing(bool capturing) -> ()", [](bool on) { emu::capturing = on; });
}

// ---- device-to-host copies: a count of the stream synchronisations they cost (the KV-cache glue's host checks) ----
namespace emu {
int64_t synchronizations = 0;
}
extern "C" cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, enum cudaMemcpyKind, cudaStream_t) {
  std::memcpy(dst, src, bytes);
  return cudaSuccess;
}
extern "C" cudaError_t cudaStreamSynchronize(cudaStream_t) {
  ++emu::synchronizations;
  return cudaSuccess;
}

TORCH_LIBRARY_FRAGMENT(pytransformer_emu, m) {
  // The stream synchronisations since the last call.
  m.def("synchronizations() -> int", [] { return std::exchange(emu::synchronizations, int64_t(0)); });
}

// ---- fresh memory: recycled on a GPU, poisoned here ----
// On a GPU, the caching allocator hands a new tensor memory that held an earlier tensor: old values. Fresh pages on the
// CPU are zeros, so a kernel that left part of its output unwritten, or read an output before writing it, could still
// pass here. While the emulator is loaded, every CPU allocation is therefore filled with 0xFF bytes (NaN in float32,
// float16 and bfloat16, -1 in integer types) before it is handed out.
namespace emu {
class PoisoningAllocator final : public c10::Allocator {
 public:
  explicit PoisoningAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t bytes) override {
    c10::DataPtr data = base_->allocate(bytes);
    if (bytes > 0) std::memset(data.get(), 0xFF, bytes);
    return data;
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }
  bool is_simple_data_ptr(const c10::DataPtr& data) const override { return base_->is_simple_data_ptr(data); }
  void copy_data(void* dst, const void* src, std::size_t bytes) const override { base_->copy_data(dst, src, bytes); }

 private:
  c10::Allocator* base_;
};
const bool poisoning_installed = [] {
  static PoisoningAllocator poisoning(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&poisoning, /*priority=*/1);  // above the default allocator's 0
  return true;
}();
}  // namespace emu
