// The timing cover of harness/timing.py (device timing), built on its own by harness/timing_cover.py:
// one kernel that first overwrites the L2 flush buffer, then spins for `cycles` SM clocks, launched
// with blocks of 1024 threads enough to hold every thread slot of every SM. The call being timed is
// issued while it runs; no kernel of any stream can start before it ends, so work a candidate puts on
// a stream that does not wait for the caller's starts after the start event and shows as a tail.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

__global__ void __launch_bounds__(1024) timing_cover_kernel(int4* flush, long long flush_vectors, long long cycles) {
  const long long stride = (long long)gridDim.x * blockDim.x;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < flush_vectors; i += stride) {
    int4 v = flush[i];
    v.x += 1;
    flush[i] = v;
  }
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

void timing_cover(torch::Tensor flush, int64_t blocks, int64_t cycles) {
  TORCH_CHECK(flush.is_cuda() && flush.is_contiguous() && flush.nbytes() % 16 == 0, "timing_cover: bad flush buffer");
  const c10::cuda::CUDAGuard guard(flush.device());
  timing_cover_kernel<<<unsigned(blocks), 1024, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<int4*>(flush.data_ptr()), (long long)(flush.nbytes() / 16), (long long)cycles);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}
