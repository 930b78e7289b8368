#pragma once
// Run-time ISA dispatch for the CPU kernels.
//
// Each op has a kernel file csrc/cpu/<op>_kernel.cpp, compiled once per ISA level through a generated unit
// (tools/build_config.py) that sets `#pragma GCC target(...)`, CPU_CAPABILITY (the inline namespace of at::vec and of
// our kernels) and PT_ISA_LEVEL, then includes the file. Each copy puts its kernels in `namespace CPU_CAPABILITY` and
// registers them in a KernelTable with PT_REGISTER_CPU_KERNEL; the op's glue, csrc/cpu/<op>.cpp, compiled once,
// defines the tables and calls `table.get()(params)`. At run time the best level the processor supports is used;
// ATEN_CPU_CAPABILITY=default|avx2|avx512 caps it, as it does for ATen.
//
// Everything a kernel file defines outside namespace CPU_CAPABILITY exists once per level under the same name, and
// the linker keeps one copy for all callers: code that differs by level (anything using PT_ISA_LEVEL included) must
// sit in that namespace or be expanded at the call site, as PT_REGISTER_CPU_KERNEL is. That namespace is in turn one
// per level across all kernel files, so a function belongs in one of them or in a shared header (tests/test_build.py
// fails a name defined in two).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#ifndef PT_ISA_LEVEL  // an IDE or a plain compile of the file: the baseline level
#define CPU_CAPABILITY DEFAULT
#define CPU_CAPABILITY_DEFAULT
#define PT_ISA_LEVEL 0
#endif

namespace pytransformer::cpu {

enum IsaLevel : int { kDefault = 0, kAvx2 = 1, kAvx512 = 2, kNumIsaLevels = 3 };

// The level ATEN_CPU_CAPABILITY caps the kernels at (default, avx2 or avx512); -1 where it is unset or holds another
// value, which ATen warns of and ignores, and so do the kernels.
inline int isa_cap() {
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  if (!cap) return -1;
  if (!std::strcmp(cap, "default")) return kDefault;
  if (!std::strcmp(cap, "avx2")) return kAvx2;
  return !std::strcmp(cap, "avx512") ? kAvx512 : -1;
}

inline IsaLevel detect_isa() {
  int level = kDefault;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) level = kAvx2;
  if (level == kAvx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    level = kAvx512;
#endif
  const int cap = isa_cap();
  return static_cast<IsaLevel>(cap >= 0 && cap < level ? cap : level);
}

inline IsaLevel best_isa() {
  static const IsaLevel level = detect_isa();
  return level;
}

// Whether the processor has an instruction set extension (a string literal, as __builtin_cpu_supports takes).
#if defined(__x86_64__) || defined(__i386__)
#define PT_CPU_SUPPORTS(feature) (__builtin_cpu_init(), __builtin_cpu_supports(feature))
#else
#define PT_CPU_SUPPORTS(feature) false
#endif

// Whether the AVX-512 kernels may use an extension the processor has (cpu_has): the level is AVX-512 and
// ATEN_CPU_CAPABILITY does not cap it (any cap excludes the extensions, so that ATEN_CPU_CAPABILITY=avx512 runs the
// plain AVX-512 code on such a processor).
inline bool avx512_extension_usable(bool cpu_has) {
  return cpu_has && best_isa() == kAvx512 && isa_cap() < 0;
}

// AVX-512 BF16 dot products (vdpbf16ps): bfloat16 linear layers.
inline bool has_avx512_bf16() {
  static const bool yes = avx512_extension_usable(PT_CPU_SUPPORTS("avx512bf16"));
  return yes;
}

// AVX-512 VNNI dot products (vpdpwssd): int8 linear layers, on x quantized to 16 bits (gemv.h).
inline bool has_avx512_vnni() {
  static const bool yes = avx512_extension_usable(PT_CPU_SUPPORTS("avx512vnni"));
  return yes;
}

// Integer dot products for int8 linear layers on float32 x quantized per row (gemv.h): AVX-512 VNNI, or AVX2's
// vpmaddwd where AVX2 is the best level; both multiply the same integers exactly, so they give the same results.
inline bool has_int_dot_products() { return has_avx512_vnni() || best_isa() == kAvx2; }

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

// Calls f(m0, mb) for the blocks of rows [m0, m0 + mb) that cover `rows` rows, `block` at a time (the last one the
// rest): the glue's calls of a row-by-row kernel on more rows than one call takes.
template <class F>
void for_row_blocks(int64_t rows, int64_t block, F&& f) {
  for (int64_t m0 = 0; m0 < rows; m0 += block) f(m0, std::min(block, rows - m0));
}

// The registered (table, level) pairs, for tests of the build (pytransformer._C.cpu_kernels()).
struct KernelRegistration {
  const char* table;
  int level;
};
inline std::vector<KernelRegistration>& kernel_registrations() {
  static std::vector<KernelRegistration> registrations;
  return registrations;
}

// `level` comes from the expansion site of PT_REGISTER_CPU_KERNEL: this constructor is one function for every level.
struct KernelRegistrar {
  template <class Fn>
  KernelRegistrar(KernelTable<Fn>& table, Fn fn, int level, const char* name) {
    table.fns[level] = fn;
    kernel_registrations().push_back({name, level});
  }
};

}  // namespace pytransformer::cpu

#define PT_CONCAT_INNER(a, b) a##b
#define PT_CONCAT(a, b) PT_CONCAT_INNER(a, b)
#define PT_REGISTER_CPU_KERNEL(table, fn)                                                            \
  static ::pytransformer::cpu::KernelRegistrar PT_CONCAT(pt_registrar_, __LINE__)(table, fn, PT_ISA_LEVEL, \
                                                                                 #table)
