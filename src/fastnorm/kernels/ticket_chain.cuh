// Ticket chains: kernels whose blocks take work in the order they start (an atomic ticket), meet per set
// (a GroupNorm group, a row) through an arrival counter, and wait for the set's flag that its last block
// raises once the set's statistics are written. A block only ever waits for tickets earlier than its own,
// which blocks already running hold. Used by the family's chained kernels (family_chain_kernel.cuh,
// family_backward.cuh) and the held rows kernel (held_rows_kernel.cuh).
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include "cuda_vec.cuh"

namespace fastnorm {

// The vectors of its chunk a chained block holds: kRegs a thread in registers (regs[m]: the chunk's vector
// m * kThreads + t), then kSmem in shared memory (held[m * kThreads + t]: vector (kRegs + m) * kThreads + t).
// Calls f(i, v) for each of thread t's that lies in the chunk's nv vectors, registers first.
template <int kThreads, int kRegs, int kSmem, typename V, typename F>
__device__ __forceinline__ void each_held(const V (&regs)[kRegs], const V* held, int t, int nv, F&& f) {
#pragma unroll
  for (int m = 0; m < kRegs; ++m) {
    if (m * kThreads + t < nv) f(m * kThreads + t, regs[m]);
  }
#pragma unroll 4
  for (int m = 0; m < kSmem; ++m) {
    if ((kRegs + m) * kThreads + t < nv) f((kRegs + m) * kThreads + t, held[m * kThreads + t]);
  }
}

// A chained launch's counters: the ticket counter, then per set its arrivals and its flag, zeroed before
// each launch.
static inline int64_t chain_counter_bytes(int64_t sets) { return (1 + 2 * sets) * 4; }

static inline void clear_chain_counters(unsigned* counters, int64_t sets, cudaStream_t stream) {
  cudaMemsetAsync(counters, 0, chain_counter_bytes(sets), stream);
}

// The block's ticket, taken by thread 0 in the order blocks start; every thread gets it.
__device__ __forceinline__ unsigned take_ticket(unsigned* counters) {
  __shared__ unsigned ticket;
  if (threadIdx.x == 0) ticket = atomicAdd(counters, 1u);
  __syncthreads();
  return ticket;
}

// After thread 0 wrote the block's partial: the block arrives at its set, and learns (every thread) whether
// it is the last of the set's `count`, which then sees every partial.
__device__ __forceinline__ bool arrive_last(unsigned* counters, int64_t set, int64_t count) {
  __shared__ bool last;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(counters + 1 + set, 1u) == unsigned(count - 1);
  }
  __syncthreads();
  if (last) __threadfence();
  return last;
}

// Thread 0 of the set's last block, once the set's results are written: outputs may go.
__device__ __forceinline__ void raise_flag(unsigned* counters, int64_t sets, int64_t set) {
  __threadfence();
  store_release(counters + 1 + sets + set, 1u);
}

// The block waits (thread 0 polls) until the set's flag is raised; its results are then visible to all.
__device__ __forceinline__ void wait_flag(const unsigned* counters, int64_t sets, int64_t set) {
  if (threadIdx.x == 0) {
    while (load_acquire(counters + 1 + sets + set) == 0) __nanosleep(100);
  }
  __syncthreads();
}

}  // namespace fastnorm
