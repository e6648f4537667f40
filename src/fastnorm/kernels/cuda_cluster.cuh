// Thread-block cluster primitives (Hopper): rank and size, the cluster barrier, and loads from another
// block's shared memory (distributed shared memory). Used by the forward cluster kernel and the row
// backward's split rows.
#pragma once

namespace fastnorm {

// Cluster instructions exist from sm_90 on; older builds compile the kernels that use them
// empty or without their cluster path (the planners never take it below compute capability 9).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
#define FASTNORM_CLUSTERS 1
#endif
#ifdef FASTNORM_CLUSTERS
__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_size() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_id() {
  unsigned r;
  asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_count() {
  unsigned r;
  asm volatile("mov.u32 %0, %%nclusterid.x;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Cluster-shared address of `local` in the shared memory of the cluster's block `rank`.
__device__ __forceinline__ unsigned cluster_address(const void* local, unsigned rank) {
  unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local)), remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
  return remote;
}
__device__ __forceinline__ float load_cluster(const float* local, unsigned rank) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(cluster_address(local, rank)) : "memory");
  return v;
}
__device__ __forceinline__ double load_cluster(const double* local, unsigned rank) {
  double v;
  asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(cluster_address(local, rank)) : "memory");
  return v;
}
#endif

}  // namespace fastnorm
