// The emulator's sanitizers (see sanitizer.h): the __tsan_* entry points that -fsanitize=thread code calls on every
// load and store, the classification of the address, and racecheck, initcheck and memcheck. Everything here is
// EMU_RUNTIME (not instrumented itself), and what it calls out of line runs with the fiber quiet. The hot paths use
// raw pointers and plain arrays: a no_sanitize function cannot inline the (instrumented) std::vector accessors.
#include "prelude.h"

#include <c10/core/StorageImpl.h>
#include <link.h>
#include <pthread.h>
#include <sys/mman.h>

#include <algorithm>

namespace emu {
namespace {

// The shadow of one byte of shared memory. Epochs are block-barrier intervals, numbered across blocks and launches
// (a byte whose w_epoch is older than its block's first was not written in this block); wgen, the generation of the
// accessing thread's warp barrier (barriers of all 32 lanes) at the access.
struct Byte {
  uint32_t w_epoch = 0, r_epoch = 0, w_wgen = 0, r_wgen = 0;
  int16_t writer = -1, reader = -1, pending = -1;  // pending: the thread whose cp.async is in flight here
  uint8_t readers = 0;                             // in r_epoch: see Readers
};
enum Readers : uint8_t { kNoReader, kOneReader, kOneWarp, kManyWarps };

struct Region {
  uintptr_t lo, hi;
  Byte* shadow;
  const char *kind, *name;
};

uint32_t epoch = 0, block_first_epoch = 0, wgen[kMaxThreads / 32];
std::vector<Byte> dynamic_shadow;
Region dynamic_region{0, 0, nullptr, "", "dynamic shared memory"};
uintptr_t dynamic_cap = 0;  // the dynamic shared-memory buffer's bytes (accesses past dynamic_region.hi: memcheck)
// The __shared__ arrays, registered where they are declared: one per array of every kernel instantiation that ran in
// the process, so the table grows (shared_array runs inside a kernel's fiber, where an exception cannot unwind). It
// is sorted by address, so that an access finds its array in a binary search.
Region* static_regions = nullptr;
int static_count = 0, static_capacity = 0;
uintptr_t module_lo = 0, module_hi = 0, stack_lo = 0, stack_hi = 0;
std::vector<std::string> reports;

struct Span {
  uintptr_t lo, hi;
};
struct Extent {
  Span span;
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // the extent is dropped once its storage is freed
};
std::vector<Extent> extents;
std::vector<Span> launch_spans;  // the live extents at the launch, and a raw view of them
const Span* spans = nullptr;
size_t span_count = 0;

EMU_RUNTIME int tid() { return int(current); }  // the running fiber's index is its linear thread index
EMU_RUNTIME uint32_t warp_gen(int thread) { return wgen[thread / 32]; }

// Whether an access by `thread` in this epoch at warp generation `gen` is ordered before one by the running thread:
// the same thread, or a thread of the same warp with a warp barrier of all lanes between.
EMU_RUNTIME bool ordered(int thread, uint32_t gen, int me) {
  return thread == me || (thread / 32 == me / 32 && warp_gen(me) != gen);
}

EMU_RUNTIME std::string block_name() {
  char s[64];
  snprintf(s, sizeof s, "block (%u, %u, %u)", blockIdx.x, blockIdx.y, blockIdx.z);
  return s;
}

EMU_RUNTIME void race(const char* what, const Region& r, size_t byte, int a, int b) {
  char s[320];
  snprintf(s, sizeof s, "racecheck: %s at byte %zu of %s%s, threads %d and %d, ", what, byte, r.kind, r.name, a, b);
  report(s + block_name() + ", in " + launch_name);
}

// Checks an access of n bytes at offset `off` of shared-memory region r by the running thread; records it.
EMU_RUNTIME void shared(Region& r, size_t off, size_t n, bool write) {
  const int me = tid();
  const uint32_t gen = warp_gen(me);
  bool reported = false;
  auto fail = [&](const char* what, size_t byte, int other) {
    if (!reported) race(what, r, byte, other, me);
    reported = true;
  };
  for (size_t i = off; i < off + n; ++i) {
    Byte& b = r.shadow[i];
    if (b.pending >= 0 && b.pending == me && !write)
      fail("read of bytes whose cp.async has not been waited for (no cp.async.wait_group)", i, me);
    else if (b.pending >= 0 && b.pending != me)
      fail(write ? "write to bytes another thread's cp.async is still writing"
                 : "read of bytes another thread's cp.async is still writing", i, b.pending);
    else if (b.w_epoch == epoch && !ordered(b.writer, b.w_wgen, me))
      fail(write ? "write after another thread's write with no barrier between"
                 : "read of bytes another thread wrote with no barrier between", i, b.writer);
    if (write) {
      const bool unordered_read = b.r_epoch == epoch && (b.readers == kManyWarps ||
          (b.readers == kOneWarp && (b.reader / 32 != me / 32 || warp_gen(me) == b.r_wgen)) ||
          (b.readers == kOneReader && !ordered(b.reader, b.r_wgen, me)));
      if (unordered_read) fail("write over bytes another thread read with no barrier between", i, b.reader);
      b.writer = int16_t(me), b.w_epoch = epoch, b.w_wgen = gen;
      continue;
    }
    if (b.w_epoch < block_first_epoch && !reported) {
      char s[320];
      snprintf(s, sizeof s, "initcheck: read of byte %zu of %s%s, not written in this block, by thread %d, ", i,
               r.kind, r.name, me);
      report(s + block_name() + ", in " + launch_name);
      reported = true;
    }
    if (b.r_epoch != epoch || b.readers == kNoReader) {
      b.reader = int16_t(me), b.readers = kOneReader;
    } else if (b.reader != me && b.readers != kManyWarps) {
      b.readers = b.reader / 32 == me / 32 ? kOneWarp : kManyWarps;
    }
    b.r_epoch = epoch, b.r_wgen = gen;
  }
}

// The index of the first __shared__ array that starts above a (static_count: none).
EMU_RUNTIME int static_regions_above(uintptr_t a) {
  int lo = 0, hi = static_count;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (static_regions[mid].lo <= a) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

EMU_RUNTIME Region* shared_region(uintptr_t a) {
  if (a - dynamic_region.lo < dynamic_region.hi - dynamic_region.lo) return &dynamic_region;
  const int i = static_regions_above(a) - 1;  // the array that starts highest at or below a
  return i >= 0 && a < static_regions[i].hi ? &static_regions[i] : nullptr;
}

// Whether a (in no shared-memory region) lies within kGuardBytes past the end of a __shared__ array, and is none of
// the emulator's globals that kernel code reads (which the linker may have placed there).
constexpr uintptr_t kGuardBytes = 16;
EMU_RUNTIME bool past_shared_array(uintptr_t a) {
  auto in = [a](const void* p, size_t n) { return a - reinterpret_cast<uintptr_t>(p) < n; };
  if (in(&threadIdx, sizeof threadIdx) || in(&blockIdx, sizeof blockIdx) || in(&blockDim, sizeof blockDim) ||
      in(&gridDim, sizeof gridDim) || in(&dynamic_smem, sizeof dynamic_smem))
    return false;
  const int i = static_regions_above(a) - 1;  // the nearest array below a (arrays do not overlap)
  return i >= 0 && a - static_regions[i].hi < kGuardBytes;
}

EMU_RUNTIME void memcheck(uintptr_t a, size_t n, bool write, const char* what) {
  const Span* near = nullptr;
  auto distance = [&](const Span& e) { return a < e.lo ? e.lo - a : a + n > e.hi ? a + n - e.hi : 0; };
  for (size_t i = 0; i < span_count; ++i)
    if (!near || distance(spans[i]) < distance(*near)) near = &spans[i];
  char s[400];
  const int len = snprintf(s, sizeof s, "memcheck: out-of-bounds %s %s of %zu bytes at %#lx by thread %d, ", what,
                           write ? "write" : "read", n, static_cast<unsigned long>(a), tid());
  if (near && a >= near->lo)
    snprintf(s + len, sizeof s - len, "%zu bytes past the end of a %zu-byte tensor (byte %zu of it), ",
             size_t(a + n - near->hi), size_t(near->hi - near->lo), size_t(a - near->lo));
  else if (near)
    snprintf(s + len, sizeof s - len, "%zu bytes before the start of a %zu-byte tensor, ", size_t(near->lo - a),
             size_t(near->hi - near->lo));
  report(s + block_name() + ", in " + launch_name);
}

// A GPU faults on an access at an address that is not a multiple of its type's alignment (a float2's 8 bytes, an
// int4's or a 16-byte pack's 16); the compiler's checks (-fsanitize=alignment) and ldmatrix and cp.async call this.
EMU_RUNTIME void misaligned(uintptr_t a, size_t alignment, const char* what, const char* where) {
  const bool shared = a - dynamic_region.lo < dynamic_cap || shared_region(a) || past_shared_array(a);
  char s[480];
  snprintf(s, sizeof s, "memcheck: misaligned %s %s at %#lx (%zu bytes past a %zu-byte boundary) by thread %d%s%s, ",
           shared ? "shared-memory" : "global", what, static_cast<unsigned long>(a), size_t(a % alignment), alignment,
           tid(), where ? " at " : "", where ? where : "");
  report(s + block_name() + ", in " + launch_name);
}

EMU_RUNTIME void global(uintptr_t a, size_t n, bool write) {
  static size_t last = 0;  // the extent of the previous access: most accesses fall in it
  if (last < span_count && a >= spans[last].lo && a + n <= spans[last].hi) return;
  for (size_t i = 0; i < span_count; ++i)
    if (a >= spans[i].lo && a + n <= spans[i].hi) {
      last = i;
      return;
    }
  memcheck(a, n, write, "global");
}

// Any load or store of the running fiber: its stack and the emulator's globals pass, shared memory is raced and
// init-checked, everything else must lie in a tensor of the launch.
EMU_RUNTIME inline void on_access(const void* p, size_t n, bool write) {
  Fiber* f = running;
  if (!f || f->quiet) return;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a - reinterpret_cast<uintptr_t>(fiber_stacks) < kMaxThreads * kStackBytes) return;
  ++f->quiet;
  if (a - dynamic_region.lo < dynamic_cap) {
    if (a + n > dynamic_region.hi)
      memcheck(a, n, write, "shared-memory (past the dynamic shared memory)");
    else
      shared(dynamic_region, a - dynamic_region.lo, n, write);
  } else if (a - module_lo < module_hi - module_lo) {
    Region* r = shared_region(a);
    if (r && a + n <= r->hi)
      shared(*r, a - r->lo, n, write);
    else if (r || past_shared_array(a))
      memcheck(a, n, write, "shared-memory (past the end of a __shared__ array)");
  } else if (a - stack_lo >= stack_hi - stack_lo) {  // the launching thread's stack holds the kernel's arguments
    global(a, n, write);
  }
  --f->quiet;
}

EMU_RUNTIME int find_module(dl_phdr_info* info, size_t, void*) {
  const auto self = reinterpret_cast<uintptr_t>(&fibers);
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int i = 0; i < info->dlpi_phnum; ++i)
    if (info->dlpi_phdr[i].p_type == PT_LOAD) {
      lo = std::min<uintptr_t>(lo, info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
      hi = std::max<uintptr_t>(hi, info->dlpi_addr + info->dlpi_phdr[i].p_vaddr + info->dlpi_phdr[i].p_memsz);
    }
  if (self < lo || self >= hi) return 0;
  module_lo = lo, module_hi = hi;
  return 1;
}

}  // namespace

EMU_RUNTIME void begin_launch() {
  if (!fiber_stacks) {
    fiber_stacks = static_cast<char*>(mmap(nullptr, kMaxThreads * kStackBytes, PROT_READ | PROT_WRITE,
                                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (fiber_stacks == MAP_FAILED) throw std::runtime_error("emu: cannot map the fiber stacks");
    dl_iterate_phdr(find_module, nullptr);
  }
  static pthread_t stack_owner{};
  if (!stack_hi || !pthread_equal(stack_owner, pthread_self())) {
    pthread_attr_t attr;
    void* lo;
    size_t size;
    pthread_getattr_np(pthread_self(), &attr);
    pthread_attr_getstack(&attr, &lo, &size);
    pthread_attr_destroy(&attr);
    stack_owner = pthread_self(), stack_lo = reinterpret_cast<uintptr_t>(lo), stack_hi = stack_lo + size;
  }
  dynamic_region.lo = reinterpret_cast<uintptr_t>(dynamic_smem);
  dynamic_region.hi = dynamic_region.lo + dynamic_smem_bytes;
  dynamic_cap = dynamic_smem_buffer.data() + dynamic_smem_buffer.size() - dynamic_smem;
  dynamic_shadow.assign(dynamic_smem_bytes, Byte{});
  dynamic_region.shadow = dynamic_shadow.data();
  std::erase_if(extents, [](const Extent& e) { return e.storage.expired(); });
  launch_spans.clear();
  for (const Extent& e : extents) launch_spans.push_back(e.span);
  spans = launch_spans.data(), span_count = launch_spans.size();
  reports.clear();
}

EMU_RUNTIME void end_launch() {
  if (reports.empty()) return;
  std::string message;
  for (const std::string& r : reports) message += r + "\n";
  reports.clear();
  throw std::runtime_error(message);
}

EMU_RUNTIME void begin_block() { block_first_epoch = ++epoch; }
EMU_RUNTIME void block_synced() { ++epoch; }
EMU_RUNTIME void warp_synced(int warp) { ++wgen[warp]; }

EMU_RUNTIME void report(const std::string& what) {  // the first 4 of each detector ("racecheck: ...")
  const std::string detector = what.substr(0, what.find(':') + 1);
  if (std::count_if(reports.begin(), reports.end(), [&](const std::string& r) { return r.starts_with(detector); }) < 4)
    reports.push_back(what);
}

EMU_RUNTIME void shared_access(const void* p, size_t n, bool write) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (Region* r = shared_region(a)) shared(*r, a - r->lo, n, write);
}

EMU_RUNTIME void check_alignment(const void* p, size_t n, bool write) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if (a % n == 0) return;
  char what[64];
  snprintf(what, sizeof what, "%s of %zu bytes", write ? "write" : "read", n);
  misaligned(a, n, what, nullptr);
}

EMU_RUNTIME void global_access(const void* p, size_t n, bool write) {
  global(reinterpret_cast<uintptr_t>(p), n, write);
}

EMU_RUNTIME void async_issue(const void* dst, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(dst);
  shared(dynamic_region, a - dynamic_region.lo, n, true);  // a write whenever it lands: ordered as one now
  for (size_t i = 0; i < n; ++i) dynamic_region.shadow[a - dynamic_region.lo + i].pending = int16_t(tid());
}

EMU_RUNTIME void async_land(const void* dst, size_t n) {
  const size_t off = reinterpret_cast<uintptr_t>(dst) - dynamic_region.lo;
  for (size_t i = off; i < off + n; ++i) {
    Byte& b = dynamic_region.shadow[i];
    b.pending = -1, b.writer = int16_t(tid()), b.w_epoch = epoch, b.w_wgen = warp_gen(tid());
  }
}

EMU_RUNTIME void shared_array(const void* p, size_t n, const char* name) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const int at = static_regions_above(a);
  if (at > 0 && static_regions[at - 1].lo == a) return;
  Quiet quiet;
  if (static_count == static_capacity) {
    static_capacity = static_capacity ? 2 * static_capacity : 64;
    Region* grown = new Region[static_capacity];
    std::copy(static_regions, static_regions + static_count, grown);
    delete[] static_regions;
    static_regions = grown;
  }
  std::copy_backward(static_regions + at, static_regions + static_count, static_regions + static_count + 1);
  ++static_count;
  static_regions[at] = {a, a + n, new Byte[n], "shared array ", name};
}

EMU_RUNTIME void note_extent(const at::TensorBase& t, const void* data) {
  if (!t.defined() || !t.has_storage() || t.numel() == 0 || !data) return;
  int64_t lo = 0, hi = 0;  // element offsets of the view's first and last elements from `data`
  for (int64_t d = 0; d < t.dim(); ++d) (t.stride(d) < 0 ? lo : hi) += (t.size(d) - 1) * t.stride(d);
  const auto base = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = base + lo * t.element_size(), last = base + (hi + 1) * t.element_size();
  for (const Extent& e : extents)
    if (e.span.lo == first && e.span.hi == last && !e.storage.expired()) return;
  extents.push_back({{first, last}, t.storage().getWeakStorageImpl()});
}

}  // namespace emu

// The entry points of -fsanitize=thread code (no TSan runtime is linked).
// Hidden: the instrumented code of this library calls them directly, not through the PLT.
#define EMU_ENTRY extern "C" EMU_RUNTIME __attribute__((visibility("hidden")))
#define EMU_HOOK EMU_ENTRY void
EMU_HOOK __tsan_init() {}
EMU_HOOK __tsan_func_entry(void*) {}
EMU_HOOK __tsan_func_exit() {}
EMU_HOOK __tsan_read_range(void* p, unsigned long n) { emu::on_access(p, n, false); }
EMU_HOOK __tsan_write_range(void* p, unsigned long n) { emu::on_access(p, n, true); }
EMU_HOOK __tsan_vptr_read(void**) {}
EMU_HOOK __tsan_vptr_update(void**, void*) {}
#define EMU_HOOKS(n)                                                                      \
  EMU_HOOK __tsan_read##n(void* p) { emu::on_access(p, n, false); }                       \
  EMU_HOOK __tsan_write##n(void* p) { emu::on_access(p, n, true); }                       \
  EMU_HOOK __tsan_unaligned_read##n(void* p) { emu::on_access(p, n, false); }             \
  EMU_HOOK __tsan_unaligned_write##n(void* p) { emu::on_access(p, n, true); }
EMU_HOOKS(1)
EMU_HOOKS(2)
EMU_HOOKS(4)
EMU_HOOKS(8)
EMU_HOOKS(16)
// The entry points of -fsanitize=alignment code (no UBSan runtime is linked): every access through a pointer or
// reference whose address is not a multiple of its type's alignment. Reported from kernel code (a running fiber
// outside the emulator's runtime); the host's own accesses are not the GPU's.
struct UbsanLocation {
  const char* file;
  uint32_t line, column;
};
struct UbsanType {
  uint16_t kind, info;
  char name[1];
};
struct UbsanMismatch {
  UbsanLocation where;
  const UbsanType* type;
  unsigned char log_alignment, check_kind;
};
EMU_HOOK __ubsan_handle_type_mismatch_v1(const UbsanMismatch* d, uintptr_t p) {
  if (!p || !emu::running || emu::running->quiet) return;
  static const char* const kinds[] = {"load of", "store to", "reference to", "member access of", "member call on"};
  char what[200], where[300];
  snprintf(what, sizeof what, "%s %s", d->check_kind < 5 ? kinds[d->check_kind] : "use of", d->type->name);
  snprintf(where, sizeof where, "%s:%u", d->where.file, d->where.line);
  emu::Quiet quiet;
  emu::misaligned(p, size_t(1) << d->log_alignment, what, where);
}
EMU_HOOK __ubsan_handle_type_mismatch_v1_abort(const UbsanMismatch* d, uintptr_t p) {
  __ubsan_handle_type_mismatch_v1(d, p);
}
// Atomics (torch's reference counts in the glue): performed, not checked, always sequentially consistent.
#define EMU_ATOMICS(n, T)                                                                                   \
  EMU_ENTRY T __tsan_atomic##n##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); }      \
  EMU_HOOK __tsan_atomic##n##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); }            \
  EMU_ENTRY T __tsan_atomic##n##_exchange(volatile T* a, T v, int) {                                                  \
    return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST);                                                               \
  }                                                                                                                   \
  EMU_ENTRY T __tsan_atomic##n##_fetch_add(volatile T* a, T v, int) {                                                 \
    return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST);                                                                \
  }                                                                                                                   \
  EMU_ENTRY T __tsan_atomic##n##_fetch_sub(volatile T* a, T v, int) {                                                 \
    return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST);                                                                \
  }                                                                                                                   \
  EMU_ENTRY int __tsan_atomic##n##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {                      \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                           \
  }                                                                                                                   \
  EMU_ENTRY int __tsan_atomic##n##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                        \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                            \
  }
EMU_ATOMICS(8, uint8_t)
EMU_ATOMICS(16, uint16_t)
EMU_ATOMICS(32, uint32_t)
EMU_ATOMICS(64, uint64_t)
EMU_HOOK __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
