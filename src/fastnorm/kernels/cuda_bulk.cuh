// Hopper's bulk copy engine (TMA) for the resident kernel: copies global -> shared completed on an
// mbarrier, and prefetches into L2.
#pragma once
#include <stdint.h>

namespace fastnorm {

// Bulk (TMA) copies global -> shared, completed on an mbarrier: one thread moves a block's share of
// a row in a few instructions. Per-thread cp.async copies of the same bytes stall their warps while
// DRAM is busy (H100: 5.6 us a row of 16 MB). Hopper (sm_90) on; older builds use cp.async.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define FASTNORM_BULK 1
#endif
#ifdef FASTNORM_BULK
__device__ __forceinline__ unsigned shared_address(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void mbarrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n\tfence.mbarrier_init.release.cluster;" ::"r"(shared_address(bar))
               : "memory");
}
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(done) : "r"(shared_address(bar)), "r"(parity) : "memory");
  } while (!done);
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared, evict-first in L2.
// The proxy fence orders the block's earlier plain reads of dst before the copy's writes.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar) {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  asm volatile(
      "fence.proxy.async.shared::cta;\n\t"
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar)), "l"(policy)
      : "memory");
}
// `bytes` (a multiple of 16, 16-byte aligned) from global memory into L2, no destination on chip.
__device__ __forceinline__ void bulk_prefetch_l2(const void* src, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
#endif

}  // namespace fastnorm
