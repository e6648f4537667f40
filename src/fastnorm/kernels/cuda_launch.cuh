// Host-side helpers of the launchers: device properties, alignment and sizes, shared-memory opt-in
// and occupancy queries (cached per configuration), launch results.
// Host functions in these headers are static, one copy per translation unit: a kernel template
// instantiated in several units is a separate kernel in each (no relocatable device code), so state
// kept per kernel, such as "shared-memory limit raised", must stay with the unit that launches it
// (shared inline copies left the forward.cu copy configured and the launching one not).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include <cstdlib>
#include <mutex>

#include "norm_params.h"

namespace fastnorm {

// nullptr on success, else the error's text, cleared: a failed launch (an unsupported configuration)
// must not stay behind as the last error for the caller's next, unrelated CUDA call.
static inline const char* launch_result(cudaError_t err) {
  if (err == cudaSuccess) return nullptr;
  cudaGetLastError();
  return cudaGetErrorString(err);
}

struct Device {
  int sms = 0;
  int coop = 0;
  int major = 0;  // compute capability; clusters need 9 (Hopper) or later
  int smem_optin = 0;  // shared memory a block may ask for
  int smem_per_sm = 0;  // shared memory of an SM, all blocks together
};

static inline Device device_info() {
  static Device cache[64];
  int dev = 0;
  cudaGetDevice(&dev);
  Device& d = cache[dev & 63];
  if (d.sms == 0) {
    cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&d.coop, cudaDevAttrCooperativeLaunch, dev);
    cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev);
  }
  return d;
}

// An integer override from the environment, read at each call (tuning switches for A/B runs):
// `fallback` where the variable is unset or empty.
static inline int64_t env_int(const char* name, int64_t fallback) {
  const char* env = std::getenv(name);
  return env && *env ? std::atoll(env) : fallback;
}

static inline int pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v && p < (1 << 30)) p <<= 1;
  return p;
}

static inline bool aligned16(const void* p) { return p == nullptr || (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// Bytes rounded up to 16 (workspace sections that start 16-byte aligned).
static inline int64_t align16(int64_t bytes) { return (bytes + 15) / 16 * 16; }

static inline int elem_size(int dtype) { return dtype == FN_F64 ? 8 : dtype == FN_F32 ? 4 : 2; }

constexpr int64_t kMaxSmem = 200 << 10;       // dynamic shared memory opt-in limit we ask for

// Shared memory above 48 KB must be asked for once per kernel.
template <typename Kernel>
static inline void allow_smem(Kernel kernel) {
  cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                       int(kMaxSmem));
}

// Resident blocks of `kernel` per SM at `threads` threads and `smem` bytes, asked of the driver once
// per configuration and device.
static inline int blocks_per_sm(const void* kernel, int threads, size_t smem) {
  struct Entry { const void* kernel; int dev, threads; size_t smem; int blocks; };
  static Entry cache[64];
  static int used = 0;
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  int dev = 0;
  cudaGetDevice(&dev);
  for (int i = 0; i < used; ++i) {
    const Entry& e = cache[i];
    if (e.kernel == kernel && e.dev == dev && e.threads == threads && e.smem == smem) return e.blocks;
  }
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem) != cudaSuccess) {
    cudaGetLastError();
    blocks = 0;
  }
  cache[used % 64] = Entry{kernel, dev, threads, smem, blocks};
  used = used < 64 ? used + 1 : used;
  return blocks;
}

}  // namespace fastnorm
