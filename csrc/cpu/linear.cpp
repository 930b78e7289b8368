// CPU glue of linear: argument checks, then per call by the number of rows of x either our kernel of the best ISA
// level (linear_kernel.cpp) or ATen's GEMM, and registration.
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "../linear.h"
#include "isa.h"
#include "stream_prefetch.h"
#include "widened_mm.h"

namespace pytransformer::cpu {
KernelTable<LinearCpuFn> linear_kernel;

namespace {
struct PrefetchTrials {
  int handed = 0, reported = 0;             // trial calls handed out and reported
  double bytes[2] = {0, 0}, seconds[2] = {0, 0};  // per way: 0 none, 1 prefetch
  int choice = -1;                          // the way chosen, -1 while trying
};
std::mutex prefetch_mutex;
std::string prefetch_mode = "auto";
PrefetchTrials prefetch_trials[3];  // by weight width: 1, 2, 4 bytes
// By weight width, the way every call takes once it is settled (a forced mode or a choice made), -1 before: read
// without the mutex, so that settled calls never wait on it; written under it.
std::atomic<int> settled_ways[3] = {-1, -1, -1};

int width_index(int64_t weight_width) { return weight_width == 1 ? 0 : weight_width == 2 ? 1 : 2; }
PrefetchTrials& trials_of(int64_t weight_width) { return prefetch_trials[width_index(weight_width)]; }
}  // namespace

StreamPrefetchTrial stream_prefetch_trial(int64_t weight_width, int64_t weight_bytes) {
  const int settled = settled_ways[width_index(weight_width)].load(std::memory_order_relaxed);
  if (settled >= 0) return {settled == 1, false};
  std::lock_guard<std::mutex> lock(prefetch_mutex);
  if (prefetch_mode != "auto") return {prefetch_mode == "on", false};
  PrefetchTrials& t = trials_of(weight_width);
  if (t.choice >= 0) return {t.choice == 1, false};
  if (weight_bytes < kPrefetchTrialBytes || t.handed >= kPrefetchTrials) return {false, false};
  return {__builtin_popcount(static_cast<unsigned>(t.handed++)) % 2 == 1, true};
}

void stream_prefetch_report(int64_t weight_width, bool prefetch, int64_t weight_bytes, double seconds) {
  std::lock_guard<std::mutex> lock(prefetch_mutex);
  PrefetchTrials& t = trials_of(weight_width);
  if (prefetch_mode != "auto" || t.choice >= 0) return;  // the mode changed during the call
  t.bytes[prefetch] += static_cast<double>(weight_bytes);
  t.seconds[prefetch] += seconds;
  if (++t.reported == kPrefetchTrials) {
    t.choice = t.bytes[1] * t.seconds[0] > t.bytes[0] * t.seconds[1];
    settled_ways[width_index(weight_width)].store(t.choice, std::memory_order_relaxed);
  }
}

void set_stream_prefetch(const std::string& mode) {
  if (mode != "auto" && mode != "on" && mode != "off")
    throw std::invalid_argument("mode: expected \"auto\", \"on\" or \"off\", got \"" + mode + "\"");
  std::lock_guard<std::mutex> lock(prefetch_mutex);
  prefetch_mode = mode;
  for (auto& t : prefetch_trials) t = PrefetchTrials{};
  for (auto& way : settled_ways) way.store(mode == "auto" ? -1 : mode == "on", std::memory_order_relaxed);
}

std::string stream_prefetch_mode() {
  std::lock_guard<std::mutex> lock(prefetch_mutex);
  return prefetch_mode;
}

std::vector<StreamPrefetchState> stream_prefetch_states() {
  std::lock_guard<std::mutex> lock(prefetch_mutex);
  std::vector<StreamPrefetchState> states;
  for (int64_t width : {1, 2, 4}) {
    const PrefetchTrials& t = trials_of(width);
    StreamPrefetchState s{width, t.reported, t.choice, {0, 0}};
    for (int way = 0; way < 2; ++way) s.bytes_per_s[way] = t.seconds[way] > 0 ? t.bytes[way] / t.seconds[way] : 0;
    states.push_back(s);
  }
  return states;
}

namespace {
// Without a GEMM of our own (the baseline ISA level; bfloat16 with AVX-512 but not its BF16 dot products) rows of x up
// to this many take our kernel; more take ATen's GEMM: for float32 ATen's, for bfloat16 ATen's float32 GEMM on widened
// weight blocks (widened_mm).
constexpr int64_t kFewRows = 64;

// How a call of `rows` rows of x is computed: our kernel (linear_kernel.cpp: weight streaming for few rows, and with
// AVX2 or AVX-512 a GEMM of its own for many), ATen's linear, or ATen's float32 GEMM on bfloat16 weights widened block
// by block (widened_mm.h), by dtype and the processor (benchmarks/bench_linear.py has the crossover rows; the
// measurements: benchmarks/results/cpu_kernel_notes_2026-11-28.md, use_gemv, cpu_kernel_notes_2026-12-02_zen3.md and
// cpu_kernel_notes_2026-12-02_zen3_gemm.md):
// - float32 and float16: every row count with AVX2 or AVX-512 (on an AVX2 EPYC the GEMM took 0.59-1.01x the time of
//   ATen's MKL at 128 to 1024 rows of a 124M Llama's layers; with AVX-512 3x faster at K 11008); at the baseline level
//   float32 up to kFewRows rows, then ATen's (float16 every count: ATen's float16 GEMM is several times slower still);
// - bfloat16 with AVX-512 BF16 dot products (has_avx512_bf16): up to 8 rows always (one pass over 2 weight rows at a
//   time), then up to 28 while x is at most 64 KiB in rows of at most 4 KiB (K <= 2048), then ATen's; with AVX2 every
//   row count (AVX2's GEMM widens the weights as it packs them); otherwise up to kFewRows rows, then widened_mm (on an
//   AVX2 EPYC ATen's bfloat16 GEMM took 3.7x widened_mm's time at 256 rows, and 4x our kernel's at 8).
enum class Path { kKernel, kAten, kWidened };

Path path_of(at::ScalarType dtype, int64_t rows, int64_t in_features) {
  if (dtype == at::kDouble) return Path::kAten;  // (gradcheck)
  const bool few = rows <= kFewRows, gemm = best_isa() != kDefault;
  if (dtype == at::kFloat) return gemm || few ? Path::kKernel : Path::kAten;
  if (dtype != at::kBFloat16) return Path::kKernel;
  if (!has_avx512_bf16()) return best_isa() == kAvx2 || few ? Path::kKernel : Path::kWidened;
  return rows <= 8 || (rows <= 28 && in_features <= 2048 && rows * in_features * 2 <= (int64_t(64) << 10))
             ? Path::kKernel
             : Path::kAten;
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const LinearParams p = check_linear_args(x, weight, bias);
  const Path path = path_of(x.scalar_type(), p.rows, p.in_features);
  // ATen also takes non-contiguous x and weight as they are.
  if (path == Path::kAten) return at::linear(x, weight, bias);
  // The kernel takes contiguous arrays in x's dtype (a non-contiguous weight is copied).
  const at::Tensor x2 = x.reshape({p.rows, p.in_features}).contiguous();  // [M, K]
  const at::Tensor w = weight.contiguous();                              // [N, K]
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = p.out_features;
  if (path == Path::kWidened) {  // in float32, rounded once
    const std::optional<at::Tensor> b = bias ? std::optional(bias->to(at::kFloat)) : std::nullopt;
    const at::Tensor out = widened_mm(x2.to(at::kFloat), p.out_features, b,
                                      [&](int64_t n0, int64_t nb, at::Tensor& d) { d.copy_(w.narrow(0, n0, nb)); });
    return out.to(x.scalar_type()).view(shape);
  }
  const at::Tensor b = bias ? bias->contiguous() : at::Tensor();         // [N] or undefined
  at::Tensor out = at::empty({p.rows, p.out_features}, x2.options());    // [M, N]
  if (out.numel() > 0)
    linear_kernel.get()(p, x.scalar_type(), x2.const_data_ptr(), w.const_data_ptr(),
                        b.defined() ? b.const_data_ptr() : nullptr, out.mutable_data_ptr());
  return out.view(shape);
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) { m.impl("linear", &linear_cpu); }

}  // namespace pytransformer::cpu
