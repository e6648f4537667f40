// The timing cover of harness/timing.py (device timing), built on its own by harness/timing_cover.py:
// one kernel that first overwrites the L2 flush buffer, then spins for `cycles` SM clocks, launched
// with blocks of 1024 threads enough to hold every thread slot of every SM. The call being timed is
// issued while it runs; no kernel of any stream can start before it ends, so work a candidate puts on
// a stream that does not wait for the caller's starts after the start event and shows as a tail.
// No torch headers: nvcc builds it into a plain shared library in a few seconds (as a torch extension
// it took 40-65 s on the H100, paid by the first device-timed call on every fresh machine), and
// timing_cover.py calls it through ctypes with the tensors' addresses and torch's stream.
#include <cuda_runtime.h>
// The blocks leave together: each spins its cycles, then waits at a grid barrier (an arrival count that
// only grows: launch g waits for g * gridDim arrivals) so that no SM frees its slots early, which let a
// small kernel of another stream run in the cover's last microseconds. The wait gives up after another
// `cycles` (a block that never became resident must not hang the caller).
__global__ void __launch_bounds__(1024) timing_cover_kernel(int4* flush, long long flush_vectors, long long cycles,
                                                            unsigned long long* arrivals) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < flush_vectors; i += stride) {
    int4 v = flush[i];
    v.x += 1;
    flush[i] = v;
  }
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long blocks = gridDim.x;
    const unsigned long long arrived = atomicAdd(arrivals, 1ull);
    const unsigned long long target = (arrived / blocks + 1) * blocks;
    const long long waited = clock64();
    while (*((volatile unsigned long long*)arrivals) < target && clock64() - waited < cycles) {
    }
  }
  __syncthreads();
}

// Queues the cover on `stream` of device `device` (the thread's current device is restored after); the
// CUDA error code (0: none). fastnorm_timing_cover_error names one.
extern "C" int fastnorm_timing_cover(int device, void* flush, long long flush_vectors, void* arrivals, long long blocks,
                                     long long cycles, void* stream) {
  int current = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err == cudaSuccess && current != device) err = cudaSetDevice(device);
  if (err != cudaSuccess) return int(err);
  timing_cover_kernel<<<unsigned(blocks), 1024, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<int4*>(flush), flush_vectors, cycles, static_cast<unsigned long long*>(arrivals));
  err = cudaGetLastError();
  if (current != device) cudaSetDevice(current);
  return int(err);
}

extern "C" const char* fastnorm_timing_cover_error(int code) { return cudaGetErrorString(cudaError_t(code)); }
