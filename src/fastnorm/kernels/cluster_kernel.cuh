// The cluster kernel: rows of 96-512 KB split over a thread-block cluster (Hopper), statistics
// exchanged through distributed shared memory; its plan and launcher.
#pragma once
#include <mutex>

#include "cuda_cluster.cuh"
#include "cuda_launch.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int kClusterThreads = 512;  // block size of the cluster kernel
constexpr int kMaxCluster = 8;        // blocks per cluster, at most (the portable limit)

// Cluster rows: a row split over the `g` blocks of a thread-block cluster (2..8), each keeping its
// slice in shared memory (plain loads and stores: H100, fp32 1024x65536 LN 85 -> 89% of copy, RMS
// 88 -> 92.8, bf16 81 -> 83, 86.5 -> 88.5, against evict-first x and y). The blocks exchange partial
// statistics through distributed shared memory behind the hardware cluster barrier, so clusters
// never wait for each other: one cluster's loads overlap another's stores on the same SM.

// Each block takes the statistics of its slice as the row kernel does a row (plain sums: rough
// mean, then the corrected two-pass sums), as (count, mean relative to the row's first element, M2);
// the g partials are merged with Chan's formula.
// Scalar slices (VEC 1: odd n, misaligned rows) copy the 16-byte granules that hold them, as the row
// kernel's scalar rows do (cache_row_granules; they loaded an element at a time, 2-byte ones
// synchronously: fp16 7956x83578 RMS ran at 37% of copy), and 2-byte ones with 2-byte parameters store in
// y's 16-byte grid (store_granule_row; with float32 parameters it spilled). Their cache takes up to 30 bytes
// more (cluster_smem).
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kClusterThreads, ClusterBlocksOf<T>::value) cluster_row_norm_kernel(
    RowArgs<T, W> a, int64_t slice_vec) {
#ifdef FASTNORM_CLUSTERS
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ A sums[2][64];
  __shared__ Stats<A> partial[2];  // this block's share of the current row, double-buffered by row parity
  int buf = 0;
  const unsigned g = cluster_size(), part = cluster_rank();
  const int64_t first_row = cluster_id(), row_step = cluster_count();
  const int64_t nvec = a.n / VEC;
  const int64_t v0 = min(nvec, int64_t(part) * slice_vec), v1 = min(nvec, v0 + slice_vec);
  BlockSlice<A, T, W, VEC> slice(a, v0, v1, dyn_smem);
  if (row_step >= a.rows) slice.prefetch_params();  // a row a cluster
  const int t = threadIdx.x, lane = t & 31;
  const bool rms = a.rms;
  int parity = 0;
  constexpr bool kGridStore = VEC == 1 && sizeof(T) == 2 && sizeof(W) == 2;
  for (int64_t row = first_row; row < a.rows; row += row_step, parity ^= 1) {
    const A shift = rms ? A(0) : A(to_acc(a.x[row * a.x_stride]));  // the same in every block of the row
    if constexpr (VEC == 1) {
      slice.cache = cache_row_granules(reinterpret_cast<V*>(dyn_smem), a.x + row * a.x_stride + v0, slice.m, t,
                                       kClusterThreads);
    } else {
      cache_own_vectors<false>(slice.cache, reinterpret_cast<const V*>(a.x + row * a.x_stride) + v0, t, slice.sh,
                               slice.count);
    }
    const Stats<A> s = slice.stats(a, shift, sums, buf);
    if (t == 0) partial[parity] = s;
    // Publishes `partial` to the cluster. The next write to this buffer comes two rows later, after
    // the next barrier, which every block passes only once it has read this row's partials.
    cluster_sync();
    // Each group of kMaxCluster lanes gathers the g partials and merges them: every lane of every
    // warp ends with the row's totals, and no block barrier is needed.
    const int src = lane & (kMaxCluster - 1);
    Stats<A> row_stats{A(0), A(0), A(0)};
    if (src < int(g)) {
      const Stats<A>& p = partial[parity];
      row_stats = {load_cluster(&p.n, src), load_cluster(&p.mean, src), load_cluster(&p.m2, src)};
    }
#pragma unroll
    for (int off = kMaxCluster / 2; off > 0; off >>= 1) row_stats = merge(row_stats, shfl_xor(row_stats, off), rms);
    const Affine<A> st = finalize(row_stats, a.n, a.eps, rms, shift);
    if constexpr (kGridStore) {
      store_granule_row(slice.cache, a.y + row * a.n + v0, slice.m, slice.w, slice.b, st, rms, t, kClusterThreads);
    } else {
      slice.store(a, row, st);
    }
  }
  cluster_sync();  // no block may exit while another can still read its partials
#else
  __trap();
#endif
}

// Cluster kernel (H100 measurements: benchmarks/NOTES.md): slices of at most 64 KB, 512 threads,
// three blocks an SM, and twice as many clusters as are resident. Rows longer than 8 such slices go
// to the split kernel: 16-block clusters and 128 KB slices both measured slower.
constexpr int64_t kClusterSliceBytes = 64 << 10;
constexpr int kClusterWaves = 2;

// Blocks per cluster for a last-dim call, 0 when the cluster kernel does not suit it: rows short
// enough for the row kernel, too long for 8 slices of shared memory, or too few to fill the chip
// (the split kernel spreads those wider). Tuning overrides address the row and split kernels.
static inline int cluster_blocks(const NormParams& p, const Device& dev) {
  if (dev.major < 9 || p.blocks_per_row > 0 || p.threads > 0) return 0;
  const int64_t row_bytes = p.n * elem_size(p.dtype);
  if (row_bytes <= kRowCacheBytes) return 0;
  int g = 2;
  while (g < kMaxCluster && row_bytes > g * kClusterSliceBytes) g *= 2;
  if ((row_bytes + g - 1) / g > kClusterSliceBytes || p.outer * g < dev.sms) return 0;
  return g;
}

template <typename T, typename W, int VEC>
static inline void configure_cluster_kernel() {
  static bool done = false;
  if (done) return;
  allow_smem(cluster_row_norm_kernel<T, W, VEC>);
  done = true;
}

static inline cudaLaunchConfig_t cluster_config(int clusters, int g, size_t smem, cudaStream_t stream,
                                         cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(clusters) * unsigned(g));
  cfg.blockDim = dim3(kClusterThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = unsigned(g);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Clusters of g blocks with `smem` bytes of shared memory each that the device holds at once (0:
// none fits, e.g. a partition whose GPCs have too few SMs). Asked of the driver once per
// configuration (float64 kernels take more registers than the others, hence `f64`).
static inline int cluster_capacity(const NormParams& p, int g, size_t smem) {
  struct Entry { int dev, f64, g; size_t smem; int clusters; };
  static Entry cache[32];
  static int used = 0;
  static std::mutex mutex;  // the workspace size and the launch must see the same answer
  const std::lock_guard<std::mutex> lock(mutex);
  int dev = 0;
  cudaGetDevice(&dev);
  const int f64 = p.dtype == FN_F64;
  for (int i = 0; i < used; ++i) {
    const Entry& e = cache[i];
    if (e.dev == dev && e.f64 == f64 && e.g == g && e.smem == smem) return e.clusters;
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_config(1, g, smem, nullptr, &attr);
  int clusters = 0;
  cudaError_t err;
  if (f64) {
    configure_cluster_kernel<double, double, 2>();
    err = cudaOccupancyMaxActiveClusters(&clusters, cluster_row_norm_kernel<double, double, 2>, &cfg);
  } else {
    configure_cluster_kernel<float, float, 4>();
    err = cudaOccupancyMaxActiveClusters(&clusters, cluster_row_norm_kernel<float, float, 4>, &cfg);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear it: no cluster support is not an error of the call
    clusters = 0;
  }
  cache[used % 32] = Entry{dev, f64, g, smem, clusters};
  used = used < 32 ? used + 1 : used;
  return clusters;
}

static inline int64_t cluster_slice_vec(const NormParams& p, int g, int vec) { return (p.n / vec + g - 1) / g; }

static inline size_t cluster_smem(const NormParams& p, int g, int vec) {
  const int64_t bytes = cluster_slice_vec(p, g, vec) * vec * elem_size(p.dtype);
  return size_t(vec == 1 ? (bytes + 30 + 15) / 16 * 16 : bytes);  // scalar slices: the granules around them
}

// Blocks per cluster if this call runs on the cluster kernel, else 0.
static inline int cluster_plan(const NormParams& p, const Device& dev, int vec) {
  const int g = cluster_blocks(p, dev);
  return g > 0 && cluster_capacity(p, g, cluster_smem(p, g, vec)) > 0 ? g : 0;
}

template <typename T, typename W, int VEC>
static inline const char* launch_cluster(const NormParams& p, int g, cudaStream_t stream) {
  configure_cluster_kernel<T, W, VEC>();
  const size_t smem = cluster_smem(p, g, VEC);
  const int64_t slice_vec = cluster_slice_vec(p, g, VEC);
  // Persistent clusters, each striding over the rows.
  int64_t clusters = cluster_capacity(p, g, smem);
  clusters *= kClusterWaves;
  if (clusters > p.outer) clusters = p.outer;
  RowArgs<T, W> a = row_args<T, W>(p, kClusterThreads);
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_config(int(clusters), g, smem, stream, &attr);
  const cudaError_t err = cudaLaunchKernelEx(&cfg, cluster_row_norm_kernel<T, W, VEC>, a, slice_vec);
  return launch_result(err);
}

}  // namespace fastnorm
