// Probe of the parameter structs as the device sees them (tools/gpu_probes/README.md): for AttentionParams,
// AttentionBackwardParams, DecodeAttentionParams and KvCacheAppendParams, a kernel that takes the struct by value
// writes its sizeof, the offsetof of every member as device code computes them, and the bytes it received; the host
// compares them with its own sizeof, offsetof and bytes. Prints one VERDICT line a struct (probe_util.h); exit status
// 0 when they all agree, 1 when one differs, 3 when a CUDA call failed.
#include <cstddef>
#include <cstring>
#include <string>

#include "attention.h"
#include "decode_attention.h"
#include "kv_cache_append.h"
#include "probe_util.h"

using namespace pytransformer;

namespace {

constexpr int kMaxFields = 32;
constexpr int kMaxBytes = 1024;

// What a kernel saw of a struct S: sizeof, member offsets (in the order of the member list), its bytes.
struct Seen {
  long long size, offsets[kMaxFields];
  unsigned char bytes[kMaxBytes];
};

// offsets_of(const S*, out): writes the offsets of S's members, as the calling side (host or device) compiles them, and
// returns their number.
#define PT_PROBE_OFFSETS(S, ...)                                                  \
  __host__ __device__ inline int offsets_of(const S*, long long* out) {          \
    const size_t offs[] = {__VA_ARGS__};                                          \
    const int n = static_cast<int>(sizeof offs / sizeof offs[0]);                 \
    for (int i = 0; i < n; ++i) out[i] = static_cast<long long>(offs[i]);         \
    return n;                                                                     \
  }
#define OFF(S, m) offsetof(S, m)

PT_PROBE_OFFSETS(AttentionParams, OFF(AttentionParams, batch), OFF(AttentionParams, heads_q),
                 OFF(AttentionParams, heads_kv), OFF(AttentionParams, len_q), OFF(AttentionParams, len_k),
                 OFF(AttentionParams, dim), OFF(AttentionParams, dim_v), OFF(AttentionParams, q), OFF(AttentionParams, k),
                 OFF(AttentionParams, v), OFF(AttentionParams, q_stride), OFF(AttentionParams, k_stride),
                 OFF(AttentionParams, v_stride), OFF(AttentionParams, out), OFF(AttentionParams, o_stride),
                 OFF(AttentionParams, lse), OFF(AttentionParams, mask_kind), OFF(AttentionParams, mask),
                 OFF(AttentionParams, mask_stride), OFF(AttentionParams, causal), OFF(AttentionParams, window),
                 OFF(AttentionParams, key_lengths), OFF(AttentionParams, scale), OFF(AttentionParams, non_finite))
PT_PROBE_OFFSETS(AttentionBackwardParams, OFF(AttentionBackwardParams, fwd), OFF(AttentionBackwardParams, grad_out),
                 OFF(AttentionBackwardParams, go_stride), OFF(AttentionBackwardParams, grad_q),
                 OFF(AttentionBackwardParams, grad_k), OFF(AttentionBackwardParams, grad_v),
                 OFF(AttentionBackwardParams, gq_stride), OFF(AttentionBackwardParams, gk_stride),
                 OFF(AttentionBackwardParams, gv_stride))
PT_PROBE_OFFSETS(DecodeAttentionParams, OFF(DecodeAttentionParams, batch), OFF(DecodeAttentionParams, q_heads),
                 OFF(DecodeAttentionParams, kv_heads), OFF(DecodeAttentionParams, q_len),
                 OFF(DecodeAttentionParams, head_dim), OFF(DecodeAttentionParams, v_head_dim),
                 OFF(DecodeAttentionParams, capacity), OFF(DecodeAttentionParams, window),
                 OFF(DecodeAttentionParams, scale), OFF(DecodeAttentionParams, q_stride),
                 OFF(DecodeAttentionParams, k_stride), OFF(DecodeAttentionParams, v_stride))
PT_PROBE_OFFSETS(KvCacheAppendParams, OFF(KvCacheAppendParams, batch), OFF(KvCacheAppendParams, kv_heads),
                 OFF(KvCacheAppendParams, new_len), OFF(KvCacheAppendParams, head_dim),
                 OFF(KvCacheAppendParams, v_head_dim), OFF(KvCacheAppendParams, capacity),
                 OFF(KvCacheAppendParams, k_cache_stride), OFF(KvCacheAppendParams, v_cache_stride),
                 OFF(KvCacheAppendParams, k_new_stride), OFF(KvCacheAppendParams, v_new_stride))

template <typename S>
__global__ void seen_kernel(const S s, Seen* out) {
  static_assert(sizeof(S) <= kMaxBytes);
  out->size = sizeof(S);
  offsets_of(&s, out->offsets);
  const unsigned char* bytes = reinterpret_cast<const unsigned char*>(&s);
  for (size_t i = 0; i < sizeof(S); ++i) out->bytes[i] = bytes[i];  // a loop: no host library call in device code
}

// Every byte of s set to a distinct pattern (the kernel receives it as the host wrote it, padding included).
template <typename S>
S patterned() {
  S s;
  unsigned char* bytes = reinterpret_cast<unsigned char*>(&s);
  for (size_t i = 0; i < sizeof(S); ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
  return s;
}

template <typename S>
bool probe(const char* name) {
  const S s = patterned<S>();
  Seen* dev = nullptr;
  PROBE_CHECK(cudaMalloc(&dev, sizeof(Seen)));
  PROBE_CHECK(cudaMemset(dev, 0, sizeof(Seen)));
  seen_kernel<S><<<1, 1>>>(s, dev);
  PROBE_CHECK(cudaGetLastError());
  Seen seen;
  PROBE_CHECK(cudaMemcpy(&seen, dev, sizeof seen, cudaMemcpyDeviceToHost));
  PROBE_CHECK(cudaFree(dev));
  long long host_offsets[kMaxFields];
  const int fields = offsets_of(&s, host_offsets);
  int bad_field = -1;
  for (int i = 0; i < fields && bad_field < 0; ++i)
    if (seen.offsets[i] != host_offsets[i]) bad_field = i;
  const bool same_bytes = std::memcmp(seen.bytes, &s, sizeof(S)) == 0;
  char detail[200];
  std::snprintf(detail, sizeof detail, "sizeof host %zu device %lld; offsets %s%s; bytes received %s", sizeof(S),
                seen.size, bad_field < 0 ? "equal" : "differ at member #",
                bad_field < 0 ? "" : std::to_string(bad_field).c_str(), same_bytes ? "equal" : "DIFFER");
  const bool ok = seen.size == (long long)sizeof(S) && bad_field < 0 && same_bytes;
  verdict((std::string("params_") + name).c_str(), ok, detail);
  return ok;
}

}  // namespace

int main() {
  bool ok = probe<AttentionParams>("AttentionParams");
  ok = probe<AttentionBackwardParams>("AttentionBackwardParams") && ok;
  ok = probe<DecodeAttentionParams>("DecodeAttentionParams") && ok;
  ok = probe<KvCacheAppendParams>("KvCacheAppendParams") && ok;
  return ok ? 0 : 1;
}
