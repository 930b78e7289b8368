"""What bounds the few-rows linear layers on this CPU: a probe of the machine, not of an op (x86-64 with AVX-512).

Decoding with 8 rows of x does 8 FMAs per weight it reads, so weight streaming at memory speed needs the dot products
to overlap the memory reads. This probe times, on every thread (torch.get_num_threads()), each thread a contiguous
part of the rows:

- fma peak: independent 512-bit FMAs with every operand in registers (the compute ceiling; ATen's float32 GEMM reaches
  a fraction of it, printed beside it), and the same for the dot products of the other weight dtypes (vdpbf16ps,
  vpdpwssd, vpdpbusd, where the CPU has them) with the weight bytes per second that each allows at 8 rows of x;
- read: a sum over a float32 weight of 3072 x 768 (GPT-2's MLP up, 9 MiB), cycled through copies spanning 1 GiB
  (--pool-mib) so that it comes from memory;
- the same read with 8 FMAs per weight vector, the work of an 8-row linear layer, with the 8 vectors of x that they
  take (a) held in registers, (b) loaded from 8 rows of K = 768 (24 KiB, as an 8-row float32 GEMV must), (c) loaded
  from 8 rows of 256 (8 KiB: the same loads, a smaller footprint).

The stream cases run in turns (A/B in one process) and report medians, as a fraction of the plain read's time.
Compiled on first use with torch.utils.cpp_extension (a C++ compiler is needed).

    python benchmarks/cpu_stream_probe.py [--record FILE.md]
"""
import argparse
import sys
import time

import torch
from torch.utils.cpp_extension import load_inline

from pytransformer.bench import command_line, device_name, matmul_ceiling

SOURCE = r"""
#include <immintrin.h>
#include <torch/extension.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <thread>
#include <vector>

namespace {
constexpr long kK = 768, kN = 3072, kWeights = kN * kK;  // one weight copy, float32
constexpr int kCases = 4;                                   // read, x in registers, x 24 KiB, x 8 KiB
constexpr long kDotIters = 25000000;                        // 12 instructions each, per thread and kind
constexpr int kDots = 4;  // vfmadd231ps, vdpbf16ps, vpdpwssd, vpdpbusd: dot_rate
alignas(64) float x_rows[8 * kK];
volatile float sink;  // keeps the sums alive

// Instructions per second on one thread of one kind of 512-bit multiply-add, KIND an index into kDots: 12 independent
// chains, every operand in a register (zeros).
#define PT_TWELVE(I)                                                                                                   \
  I " %%zmm14, %%zmm15, %%zmm0\n " I " %%zmm14, %%zmm15, %%zmm1\n " I " %%zmm14, %%zmm15, %%zmm2\n "                  \
  I " %%zmm14, %%zmm15, %%zmm3\n " I " %%zmm14, %%zmm15, %%zmm4\n " I " %%zmm14, %%zmm15, %%zmm5\n "                  \
  I " %%zmm14, %%zmm15, %%zmm6\n " I " %%zmm14, %%zmm15, %%zmm7\n " I " %%zmm14, %%zmm15, %%zmm8\n "                  \
  I " %%zmm14, %%zmm15, %%zmm9\n " I " %%zmm14, %%zmm15, %%zmm10\n " I " %%zmm14, %%zmm15, %%zmm11\n"
#define PT_CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11"
template <int KIND>
double dot_rate(long iters) {
  asm volatile("vpxord %%zmm14, %%zmm14, %%zmm14\n vpxord %%zmm15, %%zmm15, %%zmm15" ::: "xmm14", "xmm15");
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < iters; ++i) {
    if constexpr (KIND == 0) asm volatile(PT_TWELVE("vfmadd231ps") ::: PT_CLOBBERS);
    if constexpr (KIND == 1) asm volatile(PT_TWELVE("vdpbf16ps") ::: PT_CLOBBERS);
    if constexpr (KIND == 2) asm volatile(PT_TWELVE("vpdpwssd") ::: PT_CLOBBERS);
    if constexpr (KIND == 3) asm volatile(PT_TWELVE("vpdpbusd") ::: PT_CLOBBERS);
  }
  return 12.0 * iters / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Whether this CPU has dot kind KIND (AVX-512 F is checked by the caller).
bool has_dot(int kind) {
  return kind == 0 || (kind == 1 && __builtin_cpu_supports("avx512bf16")) ||
         (kind >= 2 && __builtin_cpu_supports("avx512vnni"));
}

// Rows [r0, r1) of one weight copy: CASE 0 sums them; 1-3 do 8 FMAs per 16-float vector w (two sets of 8 sums on
// alternate vectors), with x from registers (1), from 8 rows of kK floats (2) or of their first 256 (3).
template <int CASE>
float stream(const float* w, long r0, long r1) {
  __m512 acc[2][8];
  for (auto& set : acc)
    for (auto& a : set) a = _mm512_setzero_ps();
  __m512 xr[8];
  for (int m = 0; m < 8; ++m) xr[m] = _mm512_set1_ps(1.0f + m);
  for (long r = r0; r < r1; ++r) {
    const float* row = w + r * kK;
    for (long k = 0; k < kK; k += 32) {
      const __m512 w0 = _mm512_loadu_ps(row + k), w1 = _mm512_loadu_ps(row + k + 16);
      if constexpr (CASE == 0) {
        acc[0][0] = _mm512_add_ps(acc[0][0], w0);
        acc[1][0] = _mm512_add_ps(acc[1][0], w1);
      } else {
        const long kx = CASE == 3 ? k % 256 : k;
#pragma GCC unroll 8
        for (int m = 0; m < 8; ++m) {
          const __m512 x0 = CASE == 1 ? xr[m] : _mm512_load_ps(x_rows + m * kK + kx);
          const __m512 x1 = CASE == 1 ? xr[m] : _mm512_load_ps(x_rows + m * kK + kx + 16);
          acc[0][m] = _mm512_fmadd_ps(w0, x0, acc[0][m]);
          acc[1][m] = _mm512_fmadd_ps(w1, x1, acc[1][m]);
        }
      }
    }
  }
  __m512 total = _mm512_setzero_ps();
  for (auto& set : acc)
    for (auto& a : set) total = _mm512_add_ps(total, a);
  return _mm512_reduce_add_ps(total);
}
}  // namespace

// [instructions/s of each of the kDots kinds over all threads (0 where the CPU lacks it), then the median seconds of
// stream<0..3> over `iters` turns each, the weight copies spanning pool_bytes]
std::vector<double> probe(int64_t threads, int64_t iters, int64_t pool_bytes) {
  const long copies = std::max<long>(2, pool_bytes / (kWeights * 4));
  std::vector<float> pool(copies * kWeights, 0.5f);
  std::fill(x_rows, x_rows + 8 * kK, 0.25f);
  std::vector<std::vector<double>> rates(threads, std::vector<double>(kDots));
  std::vector<std::vector<double>> times(kCases);
  std::barrier sync(threads);
  const auto body = [&](int t) {
    sync.arrive_and_wait();  // each kind on all threads at once
    if (has_dot(0)) rates[t][0] = dot_rate<0>(kDotIters);
    sync.arrive_and_wait();
    if (has_dot(1)) rates[t][1] = dot_rate<1>(kDotIters);
    sync.arrive_and_wait();
    if (has_dot(2)) rates[t][2] = dot_rate<2>(kDotIters);
    sync.arrive_and_wait();
    if (has_dot(3)) rates[t][3] = dot_rate<3>(kDotIters);
    const long r0 = kN * t / threads, r1 = kN * (t + 1) / threads;
    float sum = 0;
    for (long it = 0; it < iters * kCases; ++it) {  // the cases in turns, each on the next copy
      const int c = it % kCases;
      const float* w = pool.data() + (it % copies) * kWeights;
      sync.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      sum += c == 0 ? stream<0>(w, r0, r1) : c == 1 ? stream<1>(w, r0, r1) : c == 2 ? stream<2>(w, r0, r1)
                                                                            : stream<3>(w, r0, r1);
      sync.arrive_and_wait();
      if (t == 0) times[c].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    sink = sum;
  };
  std::vector<std::thread> others;
  for (int t = 1; t < threads; ++t) others.emplace_back(body, t);
  body(0);
  for (auto& th : others) th.join();
  std::vector<double> out(kDots);
  for (const auto& r : rates)
    for (int k = 0; k < kDots; ++k) out[k] += r[k];
  for (auto& v : times) {
    std::sort(v.begin(), v.end());
    out.push_back(v[v.size() / 2]);
  }
  return out;
}
"""

# The kinds of dot_rate: (instruction, the weights and x of linear's 8-row kernel that use it, instructions per 64-byte
# line of weights with 8 rows of x: the line's weights times 8 over the products one instruction does)
DOTS = [("vfmadd231ps", "float32", 16 * 8 // 16), ("vdpbf16ps", "bfloat16 (AVX-512 BF16)", 32 * 8 // 32),
        ("vpdpwssd", "int8, x of 16 bits (VNNI)", 64 * 8 // 32), ("vpdpbusd", "int8, x of 8 bits (VNNI)", 64 * 8 // 64)]
CASES = ["read (a sum)", "read + 8 FMAs per vector, x in registers", "read + 8 FMAs per vector, x from L1 (24 KiB)",
         "read + 8 FMAs per vector, x from L1 (8 KiB)"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=40, help="turns per stream case (default 40)")
    p.add_argument("--pool-mib", type=int, default=1024,
                   help="MiB of weight copies cycled through, far more than the last-level cache (default 1024)")
    p.add_argument("--record", help="write the results as markdown to this file")
    args = p.parse_args(argv)
    if not torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
        sys.exit("cpu_stream_probe: this probe needs a CPU with AVX-512")
    # -march=native: tuned for this CPU (on an AMD EPYC, generic tuning gave the same instructions in loops not aligned
    # to 64 bytes, and the FMA cases ran at 36-71% of the read instead of 60-92%)
    ext = load_inline("pytransformer_cpu_stream_probe", cpp_sources=SOURCE, functions=["probe"],
                      extra_cflags=["-O3", "-std=c++20", "-march=native"])
    threads = torch.get_num_threads()
    out = ext.probe(threads, args.iters, args.pool_mib << 20)
    rates, times = out[:len(DOTS)], out[len(DOTS):]
    fma_s = rates[0]
    gemm = matmul_ceiling("cpu")
    peak = fma_s * 32  # FLOP/s: 16 float32 lanes, multiply and add
    weight_bytes = 3072 * 768 * 4
    flops = 2 * 8 * 3072 * 768
    lines = [f"- device: {device_name()}", f"- torch: {torch.__version__}", f"- date: {time.strftime('%Y-%m-%d')}",
             f"- command: `{command_line()}`",
             f"- FMA peak (512-bit, all threads): {fma_s / 1e9:.1f} G instructions/s = {peak / 1e9:.0f} GFLOP/s "
             f"float32; ATen's 2048^3 float32 matmul: {gemm / 1e9:.0f} GFLOP/s ({gemm / peak:.0%} of the peak)",
             "", "| case | time (us) | weights GB/s | of read | FMA use |", "|---|---|---|---|---|"]
    for i, (case, t) in enumerate(zip(CASES, times)):
        use = f"{flops / t / peak:.0%}" if i else "-"
        lines.append(f"| {case} | {t * 1e6:.1f} | {weight_bytes / t / 1e9:.1f} | {times[0] / t:.0%} | {use} |")
    lines += ["", "The dot products' own ceiling on weight streaming with 8 rows of x (all threads, operands in registers):",
              "", "| instruction | weights | G instructions/s | per 64-byte line of weights, 8 rows | weights GB/s at most |",
              "|---|---|---|---|---|"]
    for (name, weights, per_line), rate in zip(DOTS, rates):
        if rate:
            lines.append(f"| {name} | {weights} | {rate / 1e9:.1f} | {per_line} | {rate / per_line * 64 / 1e9:.1f} |")
        else:
            lines.append(f"| {name} | {weights} | not on this CPU | {per_line} | - |")
    text = "# CPU stream probe: 8 FMAs per weight while streaming\n\n" + "\n".join(lines) + "\n"
    print(text)
    if args.record:
        with open(args.record, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
