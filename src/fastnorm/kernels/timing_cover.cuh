// The timing cover of harness/timing.py (device timing), built on its own by harness/timing_cover.py:
// one kernel that first overwrites the L2 flush buffer, then spins for `cycles` SM clocks, launched
// with blocks of 1024 threads enough to hold every thread slot of every SM. The call being timed is
// issued while it runs; no kernel of any stream can start before it ends, so work a candidate puts on
// a stream that does not wait for the caller's starts after the start event and shows as a tail.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

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

void timing_cover(torch::Tensor flush, torch::Tensor arrivals, int64_t blocks, int64_t cycles) {
  TORCH_CHECK(flush.is_cuda() && flush.is_contiguous() && flush.nbytes() % 16 == 0, "timing_cover: bad flush buffer");
  TORCH_CHECK(arrivals.is_cuda() && arrivals.scalar_type() == at::kLong && arrivals.numel() == 1,
              "timing_cover: bad arrival counter");
  const c10::cuda::CUDAGuard guard(flush.device());
  timing_cover_kernel<<<unsigned(blocks), 1024, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<int4*>(flush.data_ptr()), (long long)(flush.nbytes() / 16), (long long)cycles,
      reinterpret_cast<unsigned long long*>(arrivals.data_ptr()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
