#pragma once
// Run-time ISA dispatch for the CPU kernels.
//
// setup.py (and CMakeLists.txt) compile every csrc/cpu/<op>.cpp once per ISA level through a generated wrapper that
// sets `#pragma GCC target(...)`, CPU_CAPABILITY (the inline namespace of at::vec) and PT_ISA_LEVEL, then includes
// the file. Each copy puts its kernels in `namespace CPU_CAPABILITY` and registers them in a KernelTable with
// PT_REGISTER_CPU_KERNEL; the copy with PT_ISA_LEVEL == 0 also holds the op glue and the table definitions.
// At run time the best level the processor supports is used; ATEN_CPU_CAPABILITY=default|avx2|avx512 caps it,
// as it does for ATen.
#include <cstdlib>
#include <cstring>

#ifndef PT_ISA_LEVEL  // an IDE or a plain compile of the file: the baseline level
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT
#define PT_ISA_LEVEL 0
#endif

namespace pytransformer::cpu {

enum IsaLevel : int { kDefault = 0, kAvx2 = 1, kAvx512 = 2, kNumIsaLevels = 3 };

inline IsaLevel detect_isa() {
  int level = kDefault;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) level = kAvx2;
  if (level == kAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    level = kAvx512;
#endif
  if (const char* cap = std::getenv("ATEN_CPU_CAPABILITY")) {
    int cap_level = !std::strcmp(cap, "default") ? kDefault : !std::strcmp(cap, "avx2") ? kAvx2 : kAvx512;
    level = cap_level < level ? cap_level : level;
  }
  return static_cast<IsaLevel>(level);
}

inline IsaLevel best_isa() {
  static const IsaLevel level = detect_isa();
  return level;
}

// One kernel's implementations, indexed by ISA level. A namespace-scope KernelTable is zero-initialised before any
// dynamic initialiser runs, so registrations from other translation units are safe in any order.
template <class Fn>
struct KernelTable {
  Fn fns[kNumIsaLevels];
  Fn get() const {
    for (int level = best_isa(); level >= 0; --level)
      if (fns[level]) return fns[level];
    return nullptr;
  }
};

struct KernelRegistrar {
  template <class Fn>
  KernelRegistrar(KernelTable<Fn>& table, Fn fn) { table.fns[PT_ISA_LEVEL] = fn; }
};

}  // namespace pytransformer::cpu

#define PT_CONCAT_INNER(a, b) a##b
#define PT_CONCAT(a, b) PT_CONCAT_INNER(a, b)
#define PT_REGISTER_CPU_KERNEL(table, fn) \
  static ::pytransformer::cpu::KernelRegistrar PT_CONCAT(pt_registrar_, __LINE__)(table, fn)
