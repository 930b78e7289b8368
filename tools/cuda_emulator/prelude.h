#pragma once
// Host emulation of the CUDA subset that the row kernels of csrc/cuda use (see run.py): the threads of a block are
// fibers on one OS thread, switched where they wait (__syncthreads, __shfl_xor_sync); blocks run one after another,
// so `static` stands in for __shared__. A wait that can never end (a barrier some thread never reaches, a shuffle
// partner outside the mask) aborts with a message instead of hanging. The schedule is random (fixed seed): each round
// resumes the runnable threads in a fresh order and lets about half of them lag a round behind, so that a shared-memory
// access that a missing barrier leaves unordered with another thread's (a tile read before the cp.async of another
// warp has landed, a stage overwritten while a slower warp still reads it) goes wrong here as it may on the GPU.
// Included before the rewritten CUDA sources.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <ucontext.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <array>
#include <functional>
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
#undef __shared__
#define __shared__ static
#define __launch_bounds__(...)

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {

struct Barrier {
  int expected, arrived = 0;
  unsigned generation = 0;
};

struct Fiber {
  ucontext_t ctx;
  char* stack;
  bool done;
  const Barrier* waiting_on;  // the barrier the fiber waits at (nullptr: runnable), and its generation then
  unsigned waiting_generation;
};

constexpr size_t kStackBytes = 128 * 1024;
inline ucontext_t scheduler;
inline std::vector<Fiber> fibers;
inline unsigned current;
inline bool progressed;              // some thread arrived at a barrier or finished in this round
inline std::function<void()> body;   // the kernel call of the current launch
inline Barrier block_barrier;
inline std::map<std::pair<unsigned, unsigned>, Barrier> shuffle_barriers;  // (warp, mask)
inline float shuffle_slots[32][32];                                       // [warp, lane]
// What multiprocessor_count() and the occupancy query report: small, so that persistent grids loop over rows.
inline int sm_count = 2, blocks_per_sm = 2;
// The compute capability it reports (major * 10 + minor), and the kernels launched (see launched_kernels, stubs.cpp).
inline int compute_capability = 90;
inline std::vector<std::string> launched;

inline unsigned linear_tid() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

inline void arrive_and_wait(Barrier& b) {
  const unsigned generation = b.generation;
  progressed = true;
  if (++b.arrived == b.expected) {
    b.arrived = 0, ++b.generation;
    return;
  }
  fibers[current].waiting_on = &b, fibers[current].waiting_generation = generation;
  while (b.generation == generation) swapcontext(&fibers[current].ctx, &scheduler);
  fibers[current].waiting_on = nullptr;
}

inline bool runnable(const Fiber& f) {
  return !f.done && (!f.waiting_on || f.waiting_on->generation != f.waiting_generation);
}

inline void fiber_entry() {
  body();
  fibers[current].done = true;
  progressed = true;
}

// ---- warp collectives, dynamic shared memory, cp.async (for the tensor-core kernels, see mma.cuh here) ----

// Every lane of the calling warp passes `mine`; each gets all 32 values, indexed by lane. All 32 lanes must call.
template <class V>
std::array<V, 32> warp_exchange(const V& mine) {
  static std::map<unsigned, std::array<V, 32>> slots;  // per warp
  const unsigned tid = linear_tid(), warp = tid / 32;
  Barrier& b = shuffle_barriers.try_emplace({warp, 0xffffffffu}, Barrier{32}).first->second;
  slots[warp][tid % 32] = mine;
  arrive_and_wait(b);
  const std::array<V, 32> all = slots[warp];
  arrive_and_wait(b);
  return all;
}

inline std::map<const void*, size_t> max_dynamic_smem;  // set by cudaFuncSetAttribute (stubs.cpp)
inline std::vector<unsigned char> dynamic_smem_buffer;
inline unsigned char* dynamic_smem;
inline size_t dynamic_smem_bytes;

// Aborts unless [p, p + n) lies in this launch's dynamic shared memory and p is 16-byte aligned (what ldmatrix row
// addresses and cp.async destinations must be on the GPU; the tensor-core kernels use dynamic shared memory only).
inline void check_smem_access(const void* p, size_t n, const char* what) {
  const auto* c = static_cast<const unsigned char*>(p);
  if (c < dynamic_smem || c + n > dynamic_smem + dynamic_smem_bytes || reinterpret_cast<uintptr_t>(c) % 16) {
    fprintf(stderr, "emu: %s at byte %td of %zu bytes of dynamic shared memory (or misaligned)\n", what,
            c - dynamic_smem, dynamic_smem_bytes);
    abort();
  }
}

// Racecheck of the tensor-core pipeline, per 16 bytes of dynamic shared memory (the granule of cp.async and of an
// ldmatrix row): the thread whose cp.async is in flight there, the last writer (the thread whose wait landed a
// cp.async) and reader (ldmatrix) with the barrier interval (block barrier generation) of the access. Reported, for
// the launch to raise: a read of bytes whose cp.async is still in flight (the issuing thread's own: a read before its
// wait), a read of bytes another thread's cp.async landed in the same barrier interval, and a cp.async over bytes
// another thread read in the same interval. Plain shared-memory stores and loads are not tracked.
struct Granule {
  int pending = -1, writer = -1, reader = -1;
  bool many_readers = false;
  unsigned write_epoch = 0, read_epoch = 0;
};
inline std::vector<Granule> granules;
inline std::vector<std::string> race_reports;
inline std::string launch_name;

inline void race(const std::string& what, const void* p, int a, int b) {
  if (race_reports.size() >= 4) return;
  char where[160];
  snprintf(where, sizeof where, " at byte %td of dynamic shared memory, threads %d and %d, block (%u, %u, %u)",
           static_cast<const unsigned char*>(p) - dynamic_smem, a, b, blockIdx.x, blockIdx.y, blockIdx.z);
  race_reports.push_back("racecheck: " + what + where + " in " + launch_name);
}
inline Granule& granule(const void* p) {
  return granules[size_t(static_cast<const unsigned char*>(p) - dynamic_smem) / 16];
}
inline void smem_async_issue(const void* dst) {
  const int tid = int(linear_tid()), epoch = int(block_barrier.generation);
  Granule& g = granule(dst);
  if (g.pending >= 0 && g.pending != tid) race("two threads' cp.async in flight to the same bytes", dst, g.pending, tid);
  if (g.read_epoch == unsigned(epoch) && (g.many_readers || (g.reader >= 0 && g.reader != tid)))
    race("cp.async over bytes another thread read with no barrier between", dst, g.reader, tid);
  g.pending = tid;
}
inline void smem_async_land(const void* dst) {
  Granule& g = granule(dst);
  g.pending = -1, g.writer = int(linear_tid()), g.write_epoch = block_barrier.generation;
}
inline void smem_read(const void* p) {
  const int tid = int(linear_tid());
  const unsigned epoch = block_barrier.generation;
  Granule& g = granule(p);
  if (g.pending == tid)
    race("read of bytes whose cp.async has not been waited for (no cp.async.wait_group)", p, tid, tid);
  else if (g.pending >= 0)
    race("read of bytes another thread's cp.async is still writing", p, g.pending, tid);
  else if (g.writer >= 0 && g.writer != tid && g.write_epoch == epoch)
    race("read of bytes another thread's cp.async wrote with no barrier between", p, g.writer, tid);
  if (g.read_epoch != epoch || g.reader < 0) {
    g.reader = tid, g.many_readers = false, g.read_epoch = epoch;
  } else if (g.reader != tid) {
    g.many_readers = true;
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
inline void async_copy(void* dst, const void* src, size_t n) {  // src == nullptr: zeros
  AsyncCopy c{dst, {}, n};
  if (src) std::memcpy(c.bytes, src, n);
  smem_async_issue(dst);
  thread_groups().back().push_back(c);
}
inline void async_commit() { thread_groups().emplace_back(); }
inline void async_wait(int pending) {
  auto& groups = thread_groups();
  const int committed = int(groups.size()) - 1;
  for (int i = 0; i < committed - pending; ++i)
    for (const AsyncCopy& c : groups[i]) {
      std::memcpy(c.dst, c.bytes, c.n);
      smem_async_land(c.dst);
    }
  if (committed > pending) groups.erase(groups.begin(), groups.begin() + (committed - pending));
}

inline void run_block(dim3 block, uint3 block_idx) {
  const unsigned n = block.x * block.y * block.z;
  while (fibers.size() < n) fibers.push_back({{}, static_cast<char*>(malloc(kStackBytes)), true, nullptr, 0});
  block_barrier = Barrier{int(n)};
  granules.assign(dynamic_smem_bytes / 16 + 1, Granule{});
  async_groups.clear();
  shuffle_barriers.clear();
  blockIdx = block_idx;
  for (unsigned t = 0; t < n; ++t) {
    Fiber& f = fibers[t];
    f.done = false, f.waiting_on = nullptr;
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = &scheduler;
    makecontext(&f.ctx, fiber_entry, 0);
  }
  static std::mt19937 rng(0);
  std::vector<unsigned> order(n);
  std::iota(order.begin(), order.end(), 0u);
  bool let_lag = true;  // false for a round after one without progress: a deadlock shows in a round that runs all
  for (unsigned live = n; live;) {
    progressed = false;
    live = 0;
    std::shuffle(order.begin(), order.end(), rng);
    for (unsigned t : order) {
      if (fibers[t].done) continue;
      ++live;
      if (!runnable(fibers[t]) || (let_lag && rng() % 2)) continue;
      current = t;
      threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
      swapcontext(&scheduler, &fibers[t].ctx);
      live -= fibers[t].done;
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
      fprintf(stderr, "emu: deadlock in block (%u, %u, %u): %u threads wait forever\n", block_idx.x, block_idx.y,
              block_idx.z, live);
      abort();
    }
    let_lag = progressed;
  }
}

template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t, Args&&... args) {
  const unsigned n = block.x * block.y * block.z;
  const auto limit = max_dynamic_smem.find(reinterpret_cast<const void*>(kernel));
  const size_t allowed = limit == max_dynamic_smem.end() ? 48 * 1024 : limit->second;
  if (smem > allowed || n == 0 || n > 1024 || n % 32 || !grid.x || !grid.y || !grid.z) {
    fprintf(stderr, "emu: unsupported launch: grid (%u, %u, %u), block of %u threads, %zu bytes of dynamic smem\n",
            grid.x, grid.y, grid.z, n, smem);
    abort();
  }
  Dl_info info{};
  launched.emplace_back(dladdr(reinterpret_cast<const void*>(kernel), &info) && info.dli_sname ? info.dli_sname : "?");
  int status = 0;
  char* demangled = abi::__cxa_demangle(launched.back().c_str(), nullptr, nullptr, &status);
  launch_name = status == 0 && demangled ? demangled : launched.back();
  free(demangled);
  gridDim = grid, blockDim = block;
  dynamic_smem_buffer.assign(smem + 16, 0xff);  // NaN-filled for every 16-bit and 32-bit float type
  dynamic_smem = dynamic_smem_buffer.data() + (16 - reinterpret_cast<uintptr_t>(dynamic_smem_buffer.data()) % 16) % 16;
  dynamic_smem_bytes = smem;
  body = [&] { kernel(args...); };
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) run_block(block, {x, y, z});
  if (!race_reports.empty()) {  // raised here, on the host side of the launch (never inside a fiber)
    std::string message;
    for (const std::string& r : race_reports) message += r + "\n";
    race_reports.clear();
    throw std::runtime_error(message);
  }
}

// `kernel<<<grid, block, smem, stream>>>(args)` is rewritten as `emu::launcher(kernel, grid, block, smem, stream)(args)`.
template <class Kernel>
auto launcher(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream) {
  return [=](auto&&... args) { launch(kernel, grid, block, smem, stream, args...); };
}

}  // namespace emu

inline void __syncthreads() { emu::arrive_and_wait(emu::block_barrier); }

inline float __shfl_xor_sync(unsigned mask, float v, int offset) {
  const unsigned tid = emu::linear_tid(), warp = tid / 32, lane = tid % 32;
  if (!(mask & (1u << lane)) || !(mask & (1u << (lane ^ offset)))) {
    fprintf(stderr, "emu: shuffle of lane %u with offset %d outside mask %08x\n", lane, offset, mask);
    abort();
  }
  emu::Barrier& b = emu::shuffle_barriers.try_emplace({warp, mask}, emu::Barrier{__builtin_popcount(mask)}).first->second;
  emu::shuffle_slots[warp][lane] = v;
  emu::arrive_and_wait(b);
  const float r = emu::shuffle_slots[warp][lane ^ offset];
  emu::arrive_and_wait(b);
  return r;
}

inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }

// ---- attention (csrc/cuda/attention*.cu*): a barrier of the lanes of `mask` in this warp ----
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  const unsigned warp = emu::linear_tid() / 32;
  emu::arrive_and_wait(
      emu::shuffle_barriers.try_emplace({warp, mask}, emu::Barrier{__builtin_popcount(mask)}).first->second);
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
