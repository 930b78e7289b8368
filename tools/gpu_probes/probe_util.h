#pragma once
// Helpers of the standalone GPU probes (tools/gpu_probes/README.md): error checks, random operands, verdict lines.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

// Exits with status 3 (the probe could not run: no verdict) when a CUDA runtime call fails.
#define PROBE_CHECK(call)                                                                               \
  do {                                                                                                  \
    const cudaError_t err_ = (call);                                                                    \
    if (err_ != cudaSuccess) {                                                                          \
      std::printf("CUDA error %s at %s:%d (%s)\n", cudaGetErrorString(err_), __FILE__, __LINE__, #call); \
      std::exit(3);                                                                                     \
    }                                                                                                   \
  } while (0)

// One line a hypothesis, which benchmarks/gpu_check.sh collects: "VERDICT <name> <OK|FAIL>: <detail>".
inline void verdict(const char* name, bool ok, const char* detail) {
  std::printf("VERDICT %s %s: %s\n", name, ok ? "OK" : "FAIL", detail);
}

// n values of a standard normal distribution (seeded: every run gets the same operands).
inline std::vector<float> normal_values(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> out(n);
  for (auto& x : out) x = nd(rng);
  return out;
}

// A device copy of `host`, freed by the caller.
template <typename T>
T* to_device(const std::vector<T>& host) {
  T* dev = nullptr;
  PROBE_CHECK(cudaMalloc(&dev, host.size() * sizeof(T)));
  PROBE_CHECK(cudaMemcpy(dev, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return dev;
}

template <typename T>
std::vector<T> to_host(const T* dev, size_t n) {
  std::vector<T> host(n);
  PROBE_CHECK(cudaMemcpy(host.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost));
  return host;
}

// Fills every multiprocessor's shared memory with 0xff bytes (NaN in float16, bfloat16 and float32) by running blocks
// that take all of it, so that a kernel launched next that reads shared memory it did not write sees NaN instead of
// what an earlier kernel left there.
__global__ void poison_shared_memory_kernel(int bytes) {
  extern __shared__ unsigned char smem[];
  for (int i = threadIdx.x; i < bytes; i += blockDim.x) smem[i] = 0xff;
}

inline void poison_shared_memory() {
  int device = 0, bytes = 0, sms = 0;
  PROBE_CHECK(cudaGetDevice(&device));
  PROBE_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  PROBE_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  PROBE_CHECK(cudaFuncSetAttribute(poison_shared_memory_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  poison_shared_memory_kernel<<<sms * 4, 1024, bytes>>>(bytes);
  PROBE_CHECK(cudaGetLastError());
  PROBE_CHECK(cudaDeviceSynchronize());
}
