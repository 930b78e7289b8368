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
// Below AVX-512, float32 x in rows of more than kLongK features goes to ATen's GEMM above kLongKRows rows (see
// use_kernel).
constexpr int64_t kLongK = 6144, kLongKRows = 128;

// Whether `rows` rows of x of `in_features` take our kernel (linear_kernel.cpp), by dtype; more rows (prefill) go to
// ATen's GEMM, from the row count where the GEMM measured as fast (an AVX-512 EPYC with AVX-512 BF16;
// benchmarks/bench_linear.py has the crossover rows, benchmarks/results/cpu_kernel_notes_2026-11-28.md, use_gemv, the
// measurements):
// - float32: every row count (the weight-streaming kernel is faster than ATen's GEMM even with the weight cached
//   across calls, and with AVX-512 from 48 rows the kernel's own GEMM is faster still, 3x ATen's at K 11008), except
//   below AVX-512 for rows of more than kLongK features: there 32 rows of x no longer stay in L2 beside the weights,
//   and above kLongKRows rows ATen's GEMM is as fast or faster;
// - float16: every row count (ATen's float16 GEMM is several times slower still);
// - bfloat16 with AVX-512 BF16 dot products (has_avx512_bf16): up to 8 rows always (one pass over 2 weight rows at a
//   time), then up to 28 while x is at most 64 KiB in rows of at most 4 KiB (K <= 2048); widening bfloat16 instead,
//   up to 2 rows.
bool use_kernel(at::ScalarType dtype, int64_t rows, int64_t in_features) {
  if (dtype == at::kFloat) return best_isa() == kAvx512 || in_features <= kLongK || rows <= kLongKRows;
  if (dtype != at::kBFloat16) return true;
  if (!has_avx512_bf16()) return rows <= 2;
  return rows <= 8 || (rows <= 28 && in_features <= 2048 && rows * in_features * 2 <= (int64_t(64) << 10));
}

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  const LinearParams p = check_linear_args(x, weight, bias);
  // float64 (gradcheck) and many rows: ATen, which also takes non-contiguous x and weight as they are.
  if (x.scalar_type() == at::kDouble || !use_kernel(x.scalar_type(), p.rows, p.in_features))
    return at::linear(x, weight, bias);
  // The kernel takes contiguous arrays in x's dtype (a non-contiguous weight is copied).
  const at::Tensor x2 = x.reshape({p.rows, p.in_features}).contiguous();  // [M, K]
  const at::Tensor w = weight.contiguous();                              // [N, K]
  const at::Tensor b = bias ? bias->contiguous() : at::Tensor();         // [N] or undefined
  at::Tensor out = at::empty({p.rows, p.out_features}, x2.options());    // [M, N]
  if (out.numel() > 0)
    linear_kernel.get()(p, x.scalar_type(), x2.const_data_ptr(), w.const_data_ptr(),
                        b.defined() ? b.const_data_ptr() : nullptr, out.mutable_data_ptr());
  std::vector<int64_t> shape(x.sizes().begin(), x.sizes().end());
  shape.back() = p.out_features;
  return out.view(shape);
}
}  // namespace

TORCH_LIBRARY_IMPL(pytransformer, CPU, m) { m.impl("linear", &linear_cpu); }

}  // namespace pytransformer::cpu
