// Probes of the tensor-core attention kernels of csrc/cuda/attention_mma.cuh on a GPU, float16, no torch at run time
// (tools/gpu_probes/README.md). Built with PT_ATTENTION_BWD_DEBUG: block 0 of the dK/dV kernel also writes its first
// step's S^T, P^T, dP^T and dS^T tiles, each compared with float64 on the CPU.
//
//   attention_probe [--poison]    --poison: NaN in every multiprocessor's shared memory before each launch
//
// Prints one VERDICT line a check (probe_util.h); exit status 0 when every check passed, 1 when one failed, 3 when
// a CUDA call failed.
#include "cuda/attention_mma.cuh"

#include <cmath>
#include <cstring>
#include <string>

#include "probe_util.h"

using namespace pytransformer;
using namespace pytransformer::cuda;

namespace {

constexpr double kLog2eD = 1.4426950408889634;
constexpr uint16_t kSentinel = 0x7bff;  // float16 65504: what the output holds until the kernel writes it
bool g_poison = false;
bool g_all_ok = true;

void report(const std::string& name, bool ok, const std::string& detail) {
  verdict(name.c_str(), ok, detail.c_str());
  g_all_ok = g_all_ok && ok;
}

// One (b, h) problem of L queries and L keys, head dim D, float16 operands [L][D] and their float64 values.
struct Problem {
  int L, D;
  std::vector<__half> q, k, v, d_o;
  std::vector<double> qd, kd, vd, dod;
  Problem(int len, int dim) : L(len), D(dim) {
    auto fill = [&](std::vector<__half>& h, std::vector<double>& d, unsigned seed) {
      const auto x = normal_values(size_t(L) * D, seed);
      for (float f : x) h.push_back(__float2half(f)), d.push_back(__half2float(h.back()));
    };
    fill(q, qd, 1), fill(k, kd, 2), fill(v, vd, 3), fill(d_o, dod, 4);
  }
  double scale() const { return 1.0 / std::sqrt(double(D)); }
  double score(int i, int j) const {  // q_i . k_j * scale
    double s = 0;
    for (int c = 0; c < D; ++c) s += qd[i * D + c] * kd[j * D + c];
    return s * scale();
  }
  double lse(int i) const {  // natural-log sum of exp of row i's scores
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < L; ++j) m = std::max(m, score(i, j));
    for (int j = 0; j < L; ++j) sum += std::exp(score(i, j) - m);
    return m + std::log(sum);
  }
  double prob(int i, int j) const { return std::exp(score(i, j) - lse(i)); }
  std::vector<double> out() const {  // softmax(q k^T * scale) v, [L][D]
    std::vector<double> o(size_t(L) * D, 0.0);
    for (int i = 0; i < L; ++i)
      for (int j = 0; j < L; ++j) {
        const double pij = prob(i, j);
        for (int c = 0; c < D; ++c) o[i * D + c] += pij * vd[j * D + c];
      }
    return o;
  }
};

AttentionParams params_for(const Problem& pr, const void* q, const void* k, const void* v, void* out, void* lse) {
  AttentionParams p{};
  p.batch = 1, p.heads_q = 1, p.heads_kv = 1, p.len_q = pr.L, p.len_k = pr.L, p.dim = pr.D, p.dim_v = pr.D;
  p.q = q, p.k = k, p.v = v, p.out = out, p.lse = lse;
  for (auto* s : {p.q_stride, p.k_stride, p.v_stride, p.o_stride})
    s[0] = int64_t(pr.L) * pr.D, s[1] = int64_t(pr.L) * pr.D, s[2] = pr.D;
  p.mask_kind = MaskKind::kNone;
  p.scale = pr.scale();
  return p;
}

template <class Kernel, class... Args>
void launch(Kernel kernel, int blocks, int threads, size_t smem, Args... args) {
  if (g_poison) poison_shared_memory();
  PROBE_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
  kernel<<<blocks, threads, smem>>>(args...);
  PROBE_CHECK(cudaGetLastError());
  PROBE_CHECK(cudaDeviceSynchronize());
}

// The forward kernel of head dim kHD on a problem of head dim D (<= kHD: the kernel zero-fills the rest).
template <int kHD>
void probe_forward(int D) {
  using Tiles = MmaTiles<kHD>;
  const Problem pr(200, D);
  const size_t n = pr.q.size();
  __half *q = to_device(pr.q), *k = to_device(pr.k), *v = to_device(pr.v);
  __half* out = to_device(std::vector<__half>(n, __ushort_as_half(kSentinel)));
  float* lse = to_device(std::vector<float>(pr.L, 0.f));
  launch(attention_mma_fwd_kernel<__half, kHD>, (pr.L + Tiles::kFwdBlockM - 1) / Tiles::kFwdBlockM,
         Tiles::kFwdWarps * 32, Tiles::kFwdSmem, params_for(pr, q, k, v, out, lse));
  const auto got = to_host(out, n);
  const auto ref = pr.out();
  size_t untouched = 0;
  double err = 0, amax = 0;
  for (size_t i = 0; i < n; ++i) {
    untouched += __half_as_ushort(got[i]) == kSentinel;
    const double g = __half2float(got[i]);
    err = std::max(err, std::fabs(g - ref[i])), amax = std::max(amax, std::fabs(g));
  }
  char detail[200];
  std::snprintf(detail, sizeof detail, "head dim %d (kernel %d): %zu of %zu outputs never written", D, kHD, untouched,
                n);
  report("kernel_ran_fwd_" + std::to_string(D), untouched == 0, detail);
  std::snprintf(detail, sizeof detail, "head dim %d (kernel %d): max|err| %.3g, max|out| %.3g (float64 reference)", D,
                kHD, err, amax);
  report("forward_" + std::to_string(D), err < 2e-2, detail);
  for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)out, (void*)lse}) PROBE_CHECK(cudaFree(ptr));
}

// Largest |got - ref| / (1 + |ref|) over a debug plane [kN keys][kM queries] of block 0 (keys j, queries i < L);
// `ref(j, i)` is -inf where the key is hidden.
template <class Ref>
double plane_error(const float* plane, int block_m, int rows, int cols, Ref&& ref) {
  double worst = 0;
  for (int j = 0; j < rows; ++j)
    for (int i = 0; i < cols; ++i) {
      const double r = ref(j, i), g = plane[j * block_m + i];
      const double e = std::isinf(r) ? (g == r ? 0.0 : INFINITY) : std::fabs(g - r) / (1 + std::fabs(r));
      worst = std::max(worst, std::isnan(g) ? INFINITY : e);
    }
  return worst;
}

// The dK/dV kernel (deterministic mode: no dQ atomics) on one problem of head dim 64, lse and delta from float64;
// its debug planes and its dK, dV against float64.
void probe_backward() {
  constexpr int kHD = 64;
  using Tiles = MmaTiles<kHD>;
  constexpr int kN = Tiles::kBwdBlockN, kM = Tiles::kBwdBlockM;
  const Problem pr(100, kHD);  // fewer keys than a block: block 0 also masks its padding keys
  const size_t n = pr.q.size();
  const auto ref_out = pr.out();
  std::vector<__half> out_h(n);
  for (size_t i = 0; i < n; ++i) out_h[i] = __float2half(float(ref_out[i]));
  std::vector<float> lse_h(pr.L), delta_h(pr.L);
  for (int i = 0; i < pr.L; ++i) {
    lse_h[i] = float(pr.lse(i));
    double dl = 0;
    for (int c = 0; c < pr.D; ++c) dl += pr.dod[i * pr.D + c] * double(__half2float(out_h[i * pr.D + c]));
    delta_h[i] = float(dl);
  }
  __half *q = to_device(pr.q), *k = to_device(pr.k), *v = to_device(pr.v), *d_o = to_device(pr.d_o);
  __half* out = to_device(out_h);
  float *lse = to_device(lse_h), *delta = to_device(delta_h);
  __half* gk = to_device(std::vector<__half>(n, __ushort_as_half(kSentinel)));
  __half* gv = to_device(std::vector<__half>(n, __ushort_as_half(kSentinel)));
  const size_t debug_floats = kBwdDebugHeader + kBwdDebugPlanes * kN * kM;
  float* debug = to_device(std::vector<float>(debug_floats, NAN));
  PROBE_CHECK(cudaMemcpyToSymbol(attention_bwd_debug, &debug, sizeof debug));

  AttentionBackwardParams bp{};
  bp.fwd = params_for(pr, q, k, v, out, lse);
  bp.grad_out = d_o, bp.grad_k = gk, bp.grad_v = gv;
  for (auto* s : {bp.go_stride, bp.gq_stride, bp.gk_stride, bp.gv_stride})
    s[0] = int64_t(pr.L) * pr.D, s[1] = int64_t(pr.L) * pr.D, s[2] = pr.D;
  launch(attention_mma_bwd_kernel<__half, kHD, false>, (pr.L + kN - 1) / kN, Tiles::kBwdWarps * 32,
         Tiles::kBwdDkDvSmem, bp, static_cast<const float*>(delta), static_cast<float*>(nullptr));

  const auto dbg = to_host(debug, debug_floats);
  char detail[240];
  std::snprintf(detail, sizeof detail, "block 0 header: keys from %g, queries from %g, head %g, Lq %g, Lk %g, D %g, "
                "scale*log2e %.6g (host %.6g)", dbg[kDbgN0], dbg[kDbgM0], dbg[kDbgHead], dbg[kDbgLenQ], dbg[kDbgLenK],
                dbg[kDbgDim], dbg[kDbgScaleLog2], pr.scale() * kLog2eD);
  const bool header_ok = dbg[kDbgN0] == 0 && dbg[kDbgM0] == 0 && dbg[kDbgLenQ] == pr.L && dbg[kDbgLenK] == pr.L &&
                         dbg[kDbgDim] == pr.D && std::fabs(dbg[kDbgScaleLog2] - pr.scale() * kLog2eD) < 1e-6;
  report("bwd_params_seen_by_device", header_ok, detail);
  const int keys = kN, queries = std::min(kM, pr.L);
  auto plane = [&](int which) { return dbg.data() + kBwdDebugHeader + which * kN * kM; };
  auto visible = [&](int j) { return j < pr.L; };
  auto dp = [&](int j, int i) {
    double s = 0;
    for (int c = 0; c < pr.D; ++c) s += visible(j) ? pr.vd[j * pr.D + c] * pr.dod[i * pr.D + c] : 0.0;
    return s;
  };
  auto p = [&](int j, int i) { return visible(j) ? pr.prob(i, j) : 0.0; };
  const double errs[kBwdDebugPlanes] = {
      plane_error(plane(kDbgS), kM, keys, queries,
                  [&](int j, int i) { return visible(j) ? pr.score(i, j) * kLog2eD : -INFINITY; }),
      plane_error(plane(kDbgP), kM, keys, queries, p),
      plane_error(plane(kDbgDP), kM, keys, queries, dp),
      plane_error(plane(kDbgDS), kM, keys, queries, [&](int j, int i) { return p(j, i) * (dp(j, i) - delta_h[i]); })};
  const char* names[kBwdDebugPlanes] = {"bwd_tile_S", "bwd_tile_P", "bwd_tile_dP", "bwd_tile_dS"};
  for (int w = 0; w < kBwdDebugPlanes; ++w) {
    std::snprintf(detail, sizeof detail, "block 0, step 0: max |err| / (1 + |ref|) %.3g over %d keys x %d queries",
                  errs[w], keys, queries);
    report(names[w], errs[w] < 2e-2, detail);
  }
  // dV = P^T dO, dK = scale * dS^T Q over every query, float64.
  const auto gk_h = to_host(gk, n), gv_h = to_host(gv, n);
  double err_k = 0, err_v = 0, max_k = 0, max_v = 0;
  for (int j = 0; j < pr.L; ++j)
    for (int c = 0; c < pr.D; ++c) {
      double rk = 0, rv = 0;
      for (int i = 0; i < pr.L; ++i) {
        rv += p(j, i) * pr.dod[i * pr.D + c];
        rk += p(j, i) * (dp(j, i) - delta_h[i]) * pr.qd[i * pr.D + c] * pr.scale();
      }
      err_k = std::max(err_k, std::fabs(__half2float(gk_h[j * pr.D + c]) - rk)), max_k = std::max(max_k, std::fabs(rk));
      err_v = std::max(err_v, std::fabs(__half2float(gv_h[j * pr.D + c]) - rv)), max_v = std::max(max_v, std::fabs(rv));
    }
  std::snprintf(detail, sizeof detail, "dK max|err| %.3g (max|dK| %.3g), dV max|err| %.3g (max|dV| %.3g)", err_k,
                max_k, err_v, max_v);
  report("backward_dk_dv", err_k < 2e-2 * (1 + max_k) && err_v < 2e-2 * (1 + max_v), detail);
  for (void* ptr : {(void*)q, (void*)k, (void*)v, (void*)d_o, (void*)out, (void*)lse, (void*)delta, (void*)gk,
                    (void*)gv, (void*)debug})
    PROBE_CHECK(cudaFree(ptr));
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--poison") != 0) {
      std::printf("usage: %s [--poison]\n", argv[0]);
      return 2;
    }
    g_poison = true;
  }
  cudaDeviceProp prop;
  PROBE_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s, sm_%d%d%s\n", prop.name, prop.major, prop.minor, g_poison ? ", shared memory poisoned" : "");
  probe_forward<64>(64);
  probe_forward<96>(80);
  probe_forward<32>(32);
  probe_backward();
  return g_all_ok ? 0 : 1;
}
