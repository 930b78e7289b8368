#pragma once
// Whether gemv_rows' two-stream read of 1 or 2 rows of x prefetches in software (GemvPlan::stream_ahead), chosen at
// run time for the host. With so few rows the loop waits on memory either way; software prefetch helps where the
// hardware prefetcher alone leaves memory idle, and costs where its instructions hold the line-fill buffers that the
// hardware prefetcher would use, and which of the two holds differs from host to host
// (benchmarks/results/cpu_kernel_notes_2026-11-28.md, stream_prefetch). In mode "auto" (the default) the first
// kPrefetchTrials calls of each weight width that read at least kPrefetchTrialBytes take the two ways in turns (in
// Thue-Morse order, so that no period of a model's layer shapes lines up with one way), each timed, and then the way
// that read more bytes per second stays for the process; "on" and "off" force a way (A/B measurements). The choice
// changes no result: only the prefetch instructions differ. Defined in linear.cpp, outside the ISA levels.
#include <cstdint>
#include <string>
#include <vector>

namespace pytransformer::cpu {

constexpr int kPrefetchTrials = 96;                          // trial calls of a weight width, both ways together
constexpr int64_t kPrefetchTrialBytes = int64_t(512) << 10;  // the fewest weight bytes of a trial call

struct StreamPrefetchTrial {
  bool prefetch;  // this call prefetches
  bool timed;     // this call is a trial: report its time (stream_prefetch_report)
};

// The way of a call that reads weight_bytes of weights weight_width bytes wide.
StreamPrefetchTrial stream_prefetch_trial(int64_t weight_width, int64_t weight_bytes);
// The time of a trial call (timed) that took the way `prefetch`.
void stream_prefetch_report(int64_t weight_width, bool prefetch, int64_t weight_bytes, double seconds);

struct StreamPrefetchState {
  int64_t weight_width;  // 1 (int8), 2 (bfloat16, float16), 4 (float32)
  int64_t trials;        // trial calls reported
  int choice;            // -1 while trying (or never tried), else 1 prefetch, 0 none
  double bytes_per_s[2];  // the trials' weight bytes per second without (0) and with (1) prefetch, 0 if none
};

// Sets the mode ("auto" starts the trials over, "on", "off"; anything else: std::invalid_argument).
void set_stream_prefetch(const std::string& mode);
std::string stream_prefetch_mode();
std::vector<StreamPrefetchState> stream_prefetch_states();

}  // namespace pytransformer::cpu
