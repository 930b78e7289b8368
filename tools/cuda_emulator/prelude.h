#pragma once
// Host emulation of the CUDA subset that the kernels of csrc/cuda use (see build.py): the threads of a block are
// fibers on one OS thread, switched where they wait (__syncthreads, __syncwarp, shuffles); blocks run one after
// another.
// A wait that can never end (a barrier some thread never reaches) is reported by synccheck instead of hanging. The
// schedule is random (fixed seed): each round resumes the runnable threads in a fresh order and lets about half of
// them lag a round behind, so that a shared-memory access that a missing barrier leaves unordered with another
// thread's also goes wrong here as it may on the GPU; the sanitizers (sanitizer.h) report it in any schedule.
// Included before the rewritten CUDA sources.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <xmmintrin.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <array>
#include <map>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#undef __global__
#define __global__
#undef __device__
#define __device__
#undef __host__
#define __host__
#undef __forceinline__
#define __forceinline__ inline
#undef __shared__  // build.py rewrites each __shared__ array as a static one it registers (emu::shared_array)
#define __launch_bounds__(...)

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {

// Runtime functions that kernel code calls are excluded from the sanitizers' instrumentation (see sanitizer.h):
// their own memory accesses are the emulator's, not the kernel's; and from the line coverage (coverage.py), whose
// counters would slow them down and which maps the kernels' lines only.
#define EMU_RUNTIME __attribute__((no_sanitize("thread", "alignment"), no_profile_instrument_function))

struct Barrier {
  int expected, arrived = 0;
  unsigned generation = 0;
  int warp = -1;                  // a barrier of all 32 lanes of this warp (orders their shared-memory accesses)
  const char* site = nullptr;     // __syncthreads: where the first thread of this generation waits (synccheck)
  int site_line = 0, site_thread = -1;
};

// Switches stacks: saves the callee-saved registers on the current stack and its pointer in *save, then resumes the
// stack at `load` (saved by an earlier switch, or laid out by start_fiber). Defined in stubs.cpp. No signal mask or
// floating-point state is switched (ucontext's swapcontext makes a system call each time): the fibers share both
// with the launching thread.
extern "C" void emu_switch(void** save, void* load);

struct Fiber {
  void* sp;  // the stack pointer that emu_switch saved
  char* stack;
  bool done;
  const Barrier* waiting_on;  // the barrier the fiber waits at (nullptr: runnable), and its generation then
  unsigned waiting_generation;
  int quiet;                  // > 0: inside the emulator's runtime, whose accesses the sanitizers skip
};

constexpr size_t kStackBytes = 128 * 1024, kMaxThreads = 1024;
inline void* scheduler;  // the launching thread's stack pointer while a fiber runs
inline std::vector<Fiber> fibers;
inline char* fiber_stacks;           // kMaxThreads stacks of kStackBytes, one mapping (see sanitizer.cpp)
inline Fiber* running;               // the fiber that runs now (nullptr: the host side of a launch)
inline unsigned current;
inline bool progressed;              // some thread arrived at a barrier or finished in this round
inline void (*body)(const void*);    // the kernel call of the current launch, body(body_call): both on the host's
inline const void* body_call;        // stack (the sanitizers pass the kernel's reads of its arguments there)
inline Barrier block_barrier;
inline std::map<std::pair<unsigned, unsigned>, Barrier> shuffle_barriers;  // (warp, mask)
inline float shuffle_slots[32][32];                                       // [warp, lane]
// What multiprocessor_count() and the occupancy query report: small, so that persistent grids loop over rows.
inline int sm_count = 2, blocks_per_sm = 2;
// The compute capability it reports (major * 10 + minor), and the kernels launched (see launched_kernels, stubs.cpp).
inline int compute_capability = 90;
inline std::vector<std::string> launched, reached;  // launched_kernels() and reached_kernels() take their own
inline std::string launch_name;      // the demangled name of the kernel of the current launch

inline std::map<const void*, size_t> max_dynamic_smem;  // set by cudaFuncSetAttribute (stubs.cpp)
inline std::vector<unsigned char> dynamic_smem_buffer;
inline unsigned char* dynamic_smem;
inline size_t dynamic_smem_bytes;

inline unsigned linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

// While one lives, the running fiber's memory accesses are the emulator's own (not checked).
struct Quiet {
  EMU_RUNTIME Quiet() { if (running) ++running->quiet; }
  EMU_RUNTIME ~Quiet() { if (running) --running->quiet; }
};

}  // namespace emu

#include "fast_math.h"
#include "sanitizer.h"

namespace emu {

EMU_RUNTIME inline void arrive_and_wait(Barrier& b) {
  const unsigned generation = b.generation;
  progressed = true;
  if (++b.arrived == b.expected) {
    b.arrived = 0, ++b.generation;
    if (&b == &block_barrier) block_synced();
    else if (b.warp >= 0) warp_synced(b.warp);
    return;
  }
  fibers[current].waiting_on = &b, fibers[current].waiting_generation = generation;
  while (b.generation == generation) emu_switch(&fibers[current].sp, scheduler);
  fibers[current].waiting_on = nullptr;
}

// The barrier of the lanes of `mask` in the calling thread's warp.
EMU_RUNTIME inline Barrier& warp_barrier(unsigned mask) {
  const unsigned warp = linear_tid() / 32;
  return shuffle_barriers.try_emplace({warp, mask}, Barrier{__builtin_popcount(mask), 0, 0,
                                                            mask == 0xffffffffu ? int(warp) : -1}).first->second;
}

EMU_RUNTIME inline bool runnable(const Fiber& f) {
  return !f.done && (!f.waiting_on || f.waiting_on->generation != f.waiting_generation);
}

// The first code a fiber runs (start_fiber); a finished fiber switches back for good.
[[noreturn]] EMU_RUNTIME inline void fiber_entry() {
  body(body_call);
  fibers[current].done = true;
  progressed = true;
  emu_switch(&fibers[current].sp, scheduler);
  __builtin_unreachable();
}

// Lays out a fresh stack for emu_switch to resume: fiber_entry as the return address (at a 16-byte boundary, so
// that fiber_entry starts with the stack aligned as after a call), below it zeros for the six saved registers.
EMU_RUNTIME inline void start_fiber(Fiber& f) {
  void** top = reinterpret_cast<void**>(f.stack + kStackBytes);
  top[-1] = nullptr;  // fiber_entry's own return address: it never returns
  top[-2] = reinterpret_cast<void*>(fiber_entry);
  for (int r = 3; r <= 8; ++r) top[-r] = nullptr;
  f.sp = top - 8;
}

// ---- warp collectives, dynamic shared memory, cp.async (for the tensor-core kernels, see mma.cuh here) ----

// Every lane of the calling warp passes `mine`; each gets all 32 values, indexed by lane. All 32 lanes must call.
template <class V>
EMU_RUNTIME std::array<V, 32> warp_exchange(const V& mine) {
  Quiet quiet;
  static std::map<unsigned, std::array<V, 32>> slots;  // per warp
  const unsigned tid = linear_tid(), warp = tid / 32;
  Barrier& b = warp_barrier(0xffffffffu);
  slots[warp][tid % 32] = mine;
  arrive_and_wait(b);
  const std::array<V, 32> all = slots[warp];
  arrive_and_wait(b);
  return all;
}

// Aborts unless [p, p + n) lies in this launch's dynamic shared memory (where ldmatrix rows and cp.async
// destinations are: the tensor-core kernels use dynamic shared memory only); memcheck checks their alignment.
inline void check_smem_access(const void* p, size_t n, const char* what) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < dynamic_smem || c + n > dynamic_smem + dynamic_smem_bytes) {
    fprintf(stderr, "emu: %s at byte %td of %zu bytes of dynamic shared memory\n", what, c - dynamic_smem,
            dynamic_smem_bytes);
    abort();
  }
}

// cp.async: copies queued per thread in commit groups, landing when the thread waits for their group.
struct AsyncCopy {
  void* dst;
  unsigned char bytes[16];
  size_t n;
};
inline std::vector<std::vector<std::vector<AsyncCopy>>> async_groups;  // [thread][group] (last: not committed yet)
inline std::vector<std::vector<AsyncCopy>>& thread_groups() {
  const unsigned tid = linear_tid();
  if (async_groups.size() <= tid) async_groups.resize(tid + 1);
  if (async_groups[tid].empty()) async_groups[tid].emplace_back();
  return async_groups[tid];
}
EMU_RUNTIME inline void async_copy(void* dst, const void* src, size_t n) {  // src == nullptr: zeros
  Quiet quiet;
  AsyncCopy c{dst, {}, n};
  if (src) {
    global_access(src, n, false);
    std::memcpy(c.bytes, src, n);
  }
  async_issue(dst, n);
  thread_groups().back().push_back(c);
}
EMU_RUNTIME inline void async_commit() {
  Quiet quiet;
  thread_groups().emplace_back();
}
EMU_RUNTIME inline void async_wait(int pending) {
  Quiet quiet;
  auto& groups = thread_groups();
  const int committed = int(groups.size()) - 1;
  for (int i = 0; i < committed - pending; ++i)
    for (const AsyncCopy& c : groups[i]) {
      std::memcpy(c.dst, c.bytes, c.n);
      async_land(c.dst, c.n);
    }
  if (committed > pending) groups.erase(groups.begin(), groups.begin() + (committed - pending));
}

// A wait that can never end: the threads of the block that still run all wait. Reported for the launch to raise.
inline void report_deadlock(unsigned n, uint3 block_idx) {
  unsigned at_block = 0, at_warp = 0;
  for (unsigned t = 0; t < n; ++t)
    if (!fibers[t].done) (fibers[t].waiting_on == &block_barrier ? at_block : at_warp) += 1;
  char what[320];
  if (!at_warp)
    snprintf(what, sizeof what, "__syncthreads at %s:%d reached by %u of the %u threads of block (%u, %u, %u); the "
             "others exited", block_barrier.site, block_barrier.site_line, at_block, n, block_idx.x, block_idx.y,
             block_idx.z);
  else
    snprintf(what, sizeof what, "deadlock in block (%u, %u, %u): %u threads wait at __syncthreads, %u at a warp "
             "barrier (__syncwarp or a shuffle) that some lane of its mask never reaches", block_idx.x, block_idx.y,
             block_idx.z, at_block, at_warp);
  report(std::string("synccheck: ") + what + " in " + launch_name);
}

// Runs the threads of one block to their end; false if they deadlock (reported; the block is abandoned). Not
// instrumented, and on raw pointers (a no_sanitize function cannot inline the instrumented std::vector accessors).
EMU_RUNTIME inline bool run_block(dim3 block, uint3 block_idx) {
  const unsigned n = block.x * block.y * block.z;
  while (fibers.size() < n)
    fibers.push_back({nullptr, fiber_stacks + fibers.size() * kStackBytes, true, nullptr, 0, 0});
  block_barrier = Barrier{int(n)};
  async_groups.clear();
  shuffle_barriers.clear();
  blockIdx = block_idx;
  begin_block();
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = fibers[t];
    f.done = false, f.waiting_on = nullptr, f.quiet = 0;
    start_fiber(f);
  }
  static std::mt19937 rng(0);
  std::vector<unsigned> order_(n);
  unsigned* order = order_.data();
  Fiber* fs = fibers.data();
  std::iota(order, order + n, 0u);
  bool let_lag = true;  // false for a round after one without progress: a deadlock shows in a round that runs all
  for (unsigned live = n; live;) {
    progressed = false;
    live = 0;
    std::shuffle(order, order + n, rng);
    for (unsigned i = 0; i < n; ++i) {
      const unsigned t = order[i];
      if (fs[t].done) continue;
      ++live;
      if (!runnable(fs[t]) || (let_lag && rng() % 2)) continue;
      current = t;
      threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
      running = &fs[t];
      emu_switch(&scheduler, fs[t].sp);
      running = nullptr;
      live -= fs[t].done;
    }
    if (!live)
      for (auto& groups : async_groups)
        for (auto& group : groups)
          if (!group.empty()) {
            fprintf(stderr, "emu: block (%u, %u, %u) ended with cp.async copies never waited for\n", block_idx.x,
                    block_idx.y, block_idx.z);
            abort();
          }
    if (live && !progressed && !let_lag) {
      report_deadlock(n, block_idx);
      return false;
    }
    let_lag = progressed;
  }
  return true;
}

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t, Args&&... args) {
  const unsigned n = block.x * block.y * block.z;
  const auto limit = max_dynamic_smem.find(reinterpret_cast<const void*>(kernel));
  const size_t allowed = limit == max_dynamic_smem.end() ? 48 * 1024 : limit->second;
  if (smem > allowed || n == 0 || n > kMaxThreads || n % 32 || !grid.x || !grid.y || !grid.z) {
    fprintf(stderr, "emu: unsupported launch: grid (%u, %u, %u), block of %u threads, %zu bytes of dynamic smem\n",
            grid.x, grid.y, grid.z, n, smem);
    abort();
  }
  Dl_info info{};
  launched.emplace_back(dladdr(reinterpret_cast<const void*>(kernel), &info) && info.dli_sname ? info.dli_sname : "?");
  reached.push_back(launched.back());
  int status = 0;
  char* demangled = abi::__cxa_demangle(launched.back().c_str(), nullptr, nullptr, &status);
  launch_name = status == 0 && demangled ? demangled : launched.back();
  free(demangled);
  gridDim = grid, blockDim = block;
  dynamic_smem_buffer.assign(smem + 16, 0xff);  // NaN-filled for every 16-bit and 32-bit float type
  dynamic_smem = dynamic_smem_buffer.data() + (16 - reinterpret_cast<uintptr_t>(dynamic_smem_buffer.data()) % 16) % 16;
  dynamic_smem_bytes = smem;
  begin_launch();
  const unsigned mxcsr = _mm_getcsr();
  _mm_setcsr(mxcsr | 0x8040);  // FTZ | DAZ: denormals flushed, as --use_fast_math's .ftz float32 instructions do
  const auto call = [&] { kernel(args...); };
  body = [](const void* c) { (*static_cast<const decltype(call)*>(c))(); }, body_call = &call;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x)
        if (!run_block(block, {x, y, z})) z = grid.z, y = grid.y, x = grid.x;  // a deadlock ends the launch
  _mm_setcsr(mxcsr);
  end_launch();  // raises what the sanitizers found, on the host side of the launch (never inside a fiber)
}

// `kernel<<<grid, block, smem, stream>>>(args)` is rewritten as `emu::launcher(kernel, grid, block, smem, stream)(args)`.
template <class Kernel>
auto launcher(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
  return [=](auto&&... args) { launch(kernel, grid, block, smem, stream, args...); };
}

}  // namespace emu

// A block barrier; where it is called from tells divergent barriers apart (synccheck).
EMU_RUNTIME inline void __syncthreads(const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
  emu::Quiet quiet;
  emu::Barrier& b = emu::block_barrier;
  const int tid = int(emu::linear_tid());
  if (b.arrived == 0) {
    b.site = file, b.site_line = line, b.site_thread = tid;
  } else if (b.site_line != line || std::strcmp(b.site, file) != 0) {
    char what[320];
    snprintf(what, sizeof what, "synccheck: divergent __syncthreads: thread %d waits at %s:%d, thread %d at %s:%d, "
             "block (%u, %u, %u), in ", b.site_thread, b.site, b.site_line, tid, file, line, blockIdx.x, blockIdx.y,
             blockIdx.z);
    emu::report(what + emu::launch_name);
  }
  emu::arrive_and_wait(b);
}

EMU_RUNTIME inline float __shfl_xor_sync(unsigned mask, float v, int offset) {
  emu::Quiet quiet;
  const unsigned tid = emu::linear_tid(), warp = tid / 32, lane = tid % 32;
  if (!(mask & (1u << lane)) || !(mask & (1u << (lane ^ offset)))) {
    fprintf(stderr, "emu: shuffle of lane %u with offset %d outside mask %08x\n", lane, offset, mask);
    abort();
  }
  emu::Barrier& b = emu::warp_barrier(mask);
  emu::shuffle_slots[warp][lane] = v;
  emu::arrive_and_wait(b);
  const float r = emu::shuffle_slots[warp][lane ^ offset];
  emu::arrive_and_wait(b);
  return r;
}

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }

// ---- attention (csrc/cuda/attention*.cu*): a barrier of the lanes of `mask` in this warp ----
EMU_RUNTIME inline void __syncwarp(unsigned mask = 0xffffffffu) {
  emu::Quiet quiet;
  emu::arrive_and_wait(emu::warp_barrier(mask));
}

inline float atomicAdd(float* address, float v) {  // fibers never run at once: a plain update is atomic
  const float old = *address;
  *address = old + v;
  return old;
}

// nvcc's runtime header has this overload for kernels; a host compile sees only the const void* one.
template <class... Params>
cudaError_t cudaFuncSetAttribute(void (*kernel)(Params...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// ---- int8_linear: byte permute and float bit casts of the int8 dequantization ----

inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long bytes = (static_cast<unsigned long long>(y) << 32) | x;  // bytes 0-3: x, 4-7: y
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((bytes >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
inline float __int_as_float(int v) { return std::bit_cast<float>(v); }
inline unsigned __float_as_uint(float v) { return std::bit_cast<unsigned>(v); }
