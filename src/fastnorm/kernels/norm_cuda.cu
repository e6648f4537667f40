// CUDA LayerNorm / RMSNorm forward over (outer, n, inner) views (see norm_params.h).
//
// Kernels, chosen by the planner at the bottom of this file:
//  * row_norm_kernel       inner == 1, a row handled by a group of threads (1..512) keeping it in
//                          shared memory (cp.async): one read of x, one write of y, few registers, so
//                          several rows are in flight on each SM.
//  * few_rows_kernel       inner == 1, fewer rows than SMs of at most 1024 vectors (latency-bound
//                          calls): one block a row, one vector a thread, everything in registers.
//  * cluster_row_norm_kernel inner == 1, rows of 96-512 KB with enough of them to fill the chip: a
//                          thread-block cluster per row, slices in shared memory, statistics merged
//                          through distributed shared memory (no grid-wide barrier).
//  * split_slice_kernel    inner == 1, long rows: several blocks per row, each keeping its slice in
//                          shared memory; partial statistics meet through global memory behind a
//                          per-row barrier (cooperative launch, so every block is resident).
//                          split_row_norm_kernel: the same without a cache, when the slices are too
//                          many to be resident.
//  * stream_*_kernel       inner == 1, a few rows of megabytes: partial statistics, per-row totals,
//                          then column-owned blocks that read weight and bias once for all rows.
//  * resident_row_norm_kernel inner == 1, rows of 4-17 MB: one block per SM, the whole row on chip
//                          (x in registers, parameters in shared memory), rows one after another
//                          behind a grid barrier, the next rows staged (TMA, into shared memory or L2)
//                          meanwhile: x read once. Rows of 4-8 MB go to two groups of half the SMs,
//                          which take alternate rows.
//  * strided_tile_kernel   inner > 1 (e.g. NCHW channels): lanes along the contiguous inner axis with
//  / strided_norm_kernel   16-byte accesses, threads along the reduced axis; the tile in shared memory,
//                          or in registers (read twice) when it is too large.
// Rows (slices) that do not fit the cache are read twice, the second time mostly from L2.
// Statistics: the row kernel (rows in shared memory) makes passes over the cached row, each ending
// in a plain sum over the row's threads: a rough mean, then the corrected two-pass sums about it.
// So do the blocks of the cluster and split-slice kernels over their slices, whose (count, mean, M2)
// are then merged with Chan's parallel formula. The other kernels compute exact (count, mean, M2)
// of the values each thread holds and combine them the same way, all relative to one shift (the
// row's first element), so merged means stay small; the resident kernel sums moments about that
// shift in double. Either way large offsets (x + 1000) cost no precision, and the output is
// (x - center) * rstd + offset with the mean split into center + exact rounding error (Affine).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "norm_params.h"

namespace fastnorm {

// Channel vectors the register channel kernel holds per thread: 8 x 16 B for 4-byte types, 4 x 16 B
// for 2- and 8-byte types, which need more registers per element once converted.
template <typename T> constexpr int kCacheOf = sizeof(T) == 4 ? 8 : 4;
constexpr int kMaxRowThreads = 512;  // block size of the row and split kernels, at most
constexpr int kClusterThreads = 512;  // block size of the cluster kernel
constexpr int kMaxCluster = 8;        // blocks per cluster, at most (the portable limit)

template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

__device__ __forceinline__ float to_acc(float v) { return v; }
__device__ __forceinline__ double to_acc(double v) { return v; }
__device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T> __device__ __forceinline__ T from_acc(float v);
template <> __device__ __forceinline__ float from_acc<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_acc<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_acc<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <typename T> __device__ __forceinline__ T from_acc(double v) { return static_cast<T>(v); }

__device__ __forceinline__ float rsqrt_acc(float v) { return rsqrtf(v); }
__device__ __forceinline__ double rsqrt_acc(double v) { return 1.0 / sqrt(v); }

// VEC values of T in the accumulator type. bf16 pairs take one integer instruction each (the
// generic conversion spends a permute and a shift on every odd element): half the instructions of
// the bf16 row kernel were conversions and addressing (ncu, H100).
template <typename A, typename T, int VEC>
__device__ __forceinline__ void widen(const T (&v)[VEC], A (&out)[VEC]) {
  if constexpr (std::is_same<T, __nv_bfloat16>::value && VEC % 2 == 0) {
    const uint32_t* pairs = reinterpret_cast<const uint32_t*>(v);
#pragma unroll
    for (int e = 0; e < VEC / 2; ++e) {
      out[2 * e] = __uint_as_float(pairs[e] << 16);
      out[2 * e + 1] = __uint_as_float(pairs[e] & 0xffff0000u);
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = A(to_acc(v[e]));
  }
}

// VEC elements of T moved as one aligned access.
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec {
  T v[VEC];
};

// Loads of x: streaming (read once, evict first) when the data is cached in registers; plain when
// it will be read again soon and should stay in L2.
template <bool kStream, typename V>
__device__ __forceinline__ V load_vec(const V* p) {
  V out;
  if constexpr (sizeof(V) == 16) {
    uint4 r = kStream ? __ldcs(reinterpret_cast<const uint4*>(p)) : *reinterpret_cast<const uint4*>(p);
    out = *reinterpret_cast<V*>(&r);
  } else if constexpr (sizeof(V) == 8) {
    uint2 r = kStream ? __ldcs(reinterpret_cast<const uint2*>(p)) : *reinterpret_cast<const uint2*>(p);
    out = *reinterpret_cast<V*>(&r);
  } else {
    out = *p;
  }
  return out;
}

// L2 hints on x and y (H100, benchmarks/NOTES.md "hints", "plain"): the row, channel-tile, cluster
// and split-slice kernels run 1.5-10 points of copy bandwidth faster without them; the resident
// kernel, which re-reads parameters and finds its next row in L2 while x and y stream, runs up to 8
// points faster with x read and y stored evict-first. Hence the switch.
template <bool kEvictFirst = true, typename V>
__device__ __forceinline__ void store_vec(V* p, const V& v) {
  if constexpr (sizeof(V) == 16) {
    const uint4 r = *reinterpret_cast<const uint4*>(&v);
    if (kEvictFirst) __stcs(reinterpret_cast<uint4*>(p), r); else *reinterpret_cast<uint4*>(p) = r;
  } else if constexpr (sizeof(V) == 8) {
    const uint2 r = *reinterpret_cast<const uint2*>(&v);
    if (kEvictFirst) __stcs(reinterpret_cast<uint2*>(p), r); else *reinterpret_cast<uint2*>(p) = r;
  } else {
    *p = v;
  }
}

// Asynchronous global -> shared copies: a thread issues all of its copies before waiting, so its
// whole share of a row is in flight without holding registers. 16-byte copies bypass L1.
template <int kBytes, bool kEvictFirst = true>
__device__ __forceinline__ void cp_async(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if constexpr (kBytes == 16 && kEvictFirst) {
    uint64_t policy;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "l"(policy)
                 : "memory");
  } else if constexpr (kBytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(s), "l"(src), "n"(kBytes) : "memory");
  }
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// Parameters re-read by every wave of the split kernel: loaded with an L2 evict-last policy so
// that the streamed x and y do not push them out. `release_params` sets them back to normal
// priority at the end, so nothing stays pinned in L2 after the call.
__device__ __forceinline__ uint4 load16_keep(const uint4* p) {
  uint64_t policy;
  uint4 r;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p), "l"(policy));
  return r;
}

__device__ __forceinline__ void release_params(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = int64_t(threadIdx.x) * 128; off < bytes; off += int64_t(blockDim.x) * 128) {
    asm volatile("applypriority.global.L2::evict_normal [%0], 128;" ::"l"(c + off) : "memory");
  }
}

// The parameters (weight or bias) of one vector as loaded, converted when used: kept in shared
// memory by the resident kernel, and in flight in batches by the split kernel (a batch takes a
// quarter of the registers of converted bf16 values).
template <typename W, int VEC>
struct alignas(int(sizeof(W)) * VEC % 16 == 0 ? 16 : alignof(W)) ParamVec {
  W v[VEC];
};

// The parameters of VEC consecutive columns, in 16-byte pieces when aligned. Plain loads (normal
// L2 priority); kKeep: evict-last, for parameters re-read by every wave of the split kernel.
// Not __ldg: the compiler may hoist that intrinsic above the caller's null check of an absent bias.
template <bool kKeep, typename W, int VEC>
__device__ __forceinline__ ParamVec<W, VEC> load_param_vec(const W* p) {
  ParamVec<W, VEC> r;
  constexpr int kBytes = int(sizeof(W)) * VEC;
  if constexpr (VEC > 1 && kBytes % 16 == 0) {
#pragma unroll
    for (int piece = 0; piece < kBytes / 16; ++piece) {
      const uint4* q = reinterpret_cast<const uint4*>(p) + piece;
      reinterpret_cast<uint4*>(r.v)[piece] = kKeep ? load16_keep(q) : *q;
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) r.v[e] = p[e];
  }
  return r;
}

// The same, converted to the accumulator type.
template <bool kKeep, int VEC, typename W, typename A>
__device__ __forceinline__ void load_params(const W* p, A (&out)[VEC]) {
  widen(load_param_vec<kKeep, W, VEC>(p).v, out);
}

// Running statistics of a set of values. LayerNorm: count, mean, M2 (sum of squared deviations).
// RMSNorm: count and M2 = sum of squares (mean unused).
template <typename A>
struct Stats {
  A n, mean, m2;
};

template <typename A>
__device__ __forceinline__ Stats<A> merge(const Stats<A>& a, const Stats<A>& b, bool rms) {
  Stats<A> r;
  r.n = a.n + b.n;
  if (rms) {
    r.mean = A(0);
    r.m2 = a.m2 + b.m2;
    return r;
  }
  if (r.n == A(0)) return a;
  const A d = b.mean - a.mean;
  const A wb = b.n / r.n;
  r.mean = a.mean + d * wb;
  r.m2 = a.m2 + b.m2 + d * d * a.n * wb;
  return r;
}

template <typename A>
__device__ __forceinline__ Stats<A> shfl_xor(const Stats<A>& s, int offset) {
  return {__shfl_xor_sync(0xffffffffu, s.n, offset), __shfl_xor_sync(0xffffffffu, s.mean, offset),
          __shfl_xor_sync(0xffffffffu, s.m2, offset)};
}

// Combine the statistics of each group of `tpr` consecutive threads (tpr a power of two); every
// thread of the group gets the result. All threads of the block must call it.
template <typename A>
__device__ Stats<A> group_reduce(Stats<A> s, int tpr, bool rms, Stats<A>* smem) {
  const int width = tpr < 32 ? tpr : 32;
  for (int off = width / 2; off > 0; off >>= 1) s = merge(s, shfl_xor(s, off), rms);
  if (tpr <= 32) return s;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int warps_per_group = tpr >> 5;
  __syncthreads();  // smem may still be read by a previous call
  if (lane == 0) smem[warp] = s;
  __syncthreads();
  const int first = warp - warp % warps_per_group;
  Stats<A> t = lane < warps_per_group ? smem[first + lane] : Stats<A>{A(0), A(0), A(0)};
  for (int off = 16; off > 0; off >>= 1) t = merge(t, shfl_xor(t, off), rms);
  return t;
}

// Sums of K values over each group of `tpr` consecutive threads (tpr a power of two); every thread
// of the group gets them. All threads of the block must call it. `smem` (32 * K values) must not be
// the one the block's previous call used: alternating two buffers, one barrier per call suffices.
// The shuffle levels are unrolled and predicated: a runtime loop costs more than the shuffles.
template <int K, typename A>
__device__ __forceinline__ void group_sums(A (&v)[K], int tpr, A* smem) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    if (off < tpr) {
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
    }
  }
  if (tpr <= 32) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int warps_per_group = tpr >> 5;
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) smem[k * 32 + warp] = v[k];
  }
  __syncthreads();
  // Every lane reads one partial of its group (lane modulo the group's warps), so the xor tree
  // leaves the totals in all 32 lanes.
  const int src = (warp & ~(warps_per_group - 1)) + (lane & (warps_per_group - 1));
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = smem[k * 32 + src];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    if (off < warps_per_group) {
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
    }
  }
}

// Exact statistics, relative to `shift`, of the valid values a thread holds (two passes over
// registers).
template <typename A, typename T, int VEC, int kCache>
__device__ __forceinline__ Stats<A> thread_stats(const Vec<T, VEC> (&cache)[kCache], int64_t first,
                                                 int64_t step, int64_t end, bool rms, A shift) {
  A n = A(0), sum = A(0);
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    if (first + k * step < end) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A v = to_acc(cache[k].v[e]) - shift;
        sum += rms ? v * v : v;
      }
      n += A(VEC);
    }
  }
  if (rms || n == A(0)) return {n, A(0), sum};
  const A mean = sum / n;
  A m2 = A(0);
#pragma unroll
  for (int k = 0; k < kCache; ++k) {
    if (first + k * step < end) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A d = (to_acc(cache[k].v[e]) - shift) - mean;
        m2 += d * d;
      }
    }
  }
  return {n, mean, m2};
}

// y = (x - center) * rstd + offset. The row mean is center + lo exactly (center rounded, lo its
// rounding error), and offset = -lo * rstd. x - center is exact for x near the mean (x + 1000), so
// the output keeps full precision there, and a mean far from the shift costs nothing either.
template <typename A>
struct Affine {
  A center, offset, rstd;
};

template <typename A>
__device__ __forceinline__ A normalized(A x, const Affine<A>& st) {
  return fma(x - st.center, st.rstd, st.offset);
}

// LayerNorm's affine map for a row of mean shift + mean_rel and variance var (RMSNorm: center 0).
// The sum shift + mean_rel is split into its rounded value and its exact error (Knuth's two-sum).
template <typename A>
__device__ __forceinline__ Affine<A> affine_of(A shift, A mean_rel, A var, double eps, bool rms) {
  const A rstd = rsqrt_acc(var + A(eps));
  if (rms) return {A(0), A(0), rstd};
  const A center = shift + mean_rel;
  const A b = center - shift;
  const A lo = (shift - (center - b)) + (mean_rel - b);
  return {center, -lo * rstd, rstd};
}

template <typename A>
__device__ __forceinline__ Affine<A> finalize(const Stats<A>& s, int64_t n, double eps, bool rms, A shift) {
  return affine_of(shift, s.mean, s.m2 / A(n), eps, rms);
}

// Rounds VEC accumulator values to T. Half types convert in pairs: one instruction per two values.
template <typename T, int VEC, typename A>
__device__ __forceinline__ Vec<T, VEC> pack(const A (&v)[VEC]) {
  Vec<T, VEC> y;
  if constexpr (std::is_same<T, __nv_bfloat16>::value && VEC % 2 == 0) {
    auto* pairs = reinterpret_cast<__nv_bfloat162*>(y.v);
#pragma unroll
    for (int e = 0; e < VEC; e += 2) pairs[e / 2] = __floats2bfloat162_rn(v[e], v[e + 1]);
  } else if constexpr (std::is_same<T, __half>::value && VEC % 2 == 0) {
    auto* pairs = reinterpret_cast<__half2*>(y.v);
#pragma unroll
    for (int e = 0; e < VEC; e += 2) pairs[e / 2] = __floats2half2_rn(v[e], v[e + 1]);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) y.v[e] = from_acc<T>(v[e]);
  }
  return y;
}

// y = (x - mean) * rstd * w + b for one vector, the parameters given (has_w / has_b) as values.
// centered = false: y = x * rstd * w, one multiply less, for callers that know the map is RMSNorm's.
template <typename A, typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> normalize_with(const Vec<T, VEC>& x, const Affine<A>& st, bool has_w,
                                                      const A (&wv)[VEC], bool has_b, const A (&bv)[VEC],
                                                      bool centered = true) {
  A out[VEC];
  widen(x.v, out);
  // One test per vector, not per element: a conditional expression per element compiled to
  // branches and cost the cluster kernel 3-5 points (H100).
  if (has_w && has_b) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = fma(centered ? normalized(out[e], st) : out[e] * st.rstd, wv[e], bv[e]);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      A v = centered ? normalized(out[e], st) : out[e] * st.rstd;
      if (has_w) v *= wv[e];
      if (has_b) v += bv[e];
      out[e] = v;
    }
  }
  return pack<T>(out);
}

// The same for one vector whose first element is column `col` of the row, loading the parameters.
template <bool kKeep, typename A, typename T, typename W, int VEC>
__device__ __forceinline__ Vec<T, VEC> normalize_vec(const Vec<T, VEC>& x, const Affine<A>& st,
                                                     const W* w, const W* b, int64_t col) {
  A wv[VEC], bv[VEC];
  if (w) load_params<kKeep, VEC>(w + col, wv);
  if (b) load_params<kKeep, VEC>(b + col, bv);
  return normalize_with(x, st, w != nullptr, wv, b != nullptr, bv);
}

// Weight and bias of the K grid-strided vectors a thread of the resident kernel owns (vectors
// first, first + step, ...), as slots: weight vector k is slot k, bias vector k slot kb + k. Slots
// below `count` are copied once into shared memory (slot j of this thread at smem[j * threads +
// tid]); the rest are read from L2 whenever used. Each thread copies, and later reads, only its own
// slots: no block barrier is needed around them.
template <typename W, int VEC, int K>
struct ParamSlots {
  ParamVec<W, VEC>* smem;
  int count, tid, threads;

  __device__ __forceinline__ void copy(const W* w, const W* b, int first, int step, int nvec) const {
    const int kb = w ? K : 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = first + k * step;
      if (i >= nvec) continue;
#pragma unroll
      for (int j = 0; j < int(sizeof(ParamVec<W, VEC>) / 16); ++j) {  // VEC * sizeof(W) is a multiple of 16 here
        if (w && k < count)
          cp_async<16>(reinterpret_cast<uint4*>(smem[k * threads + tid].v) + j, reinterpret_cast<const uint4*>(w + i * VEC) + j);
        if (b && kb + k < count)
          cp_async<16>(reinterpret_cast<uint4*>(smem[(kb + k) * threads + tid].v) + j, reinterpret_cast<const uint4*>(b + i * VEC) + j);
      }
    }
  }

  // The parameters of the thread's vector k (vector i of the row), converted.
  template <typename A>
  __device__ __forceinline__ void values(const W* w, const W* b, int k, int i, A (&wv)[VEC], A (&bv)[VEC]) const {
    const int kb = w ? K : 0;
    if (w) widen((k < count ? smem[k * threads + tid] : load_param_vec<false, W, VEC>(w + int64_t(i) * VEC)).v, wv);
    if (b) widen((kb + k < count ? smem[(kb + k) * threads + tid] : load_param_vec<false, W, VEC>(b + int64_t(i) * VEC)).v, bv);
  }
};

template <typename T, typename W>
struct RowArgs {
  const T* x;
  T* y;
  const W* w;
  const W* b;
  int64_t rows, n, x_stride;  // n and x_stride in elements
  double eps;
  int tpr;  // threads per row, a power of two
  int rms;
};

// Vectors each thread has in flight per batch; 2 where 4 would exceed 64 registers.
template <typename T> struct UnrollOf { static constexpr int value = 4; };
template <> struct UnrollOf<__nv_bfloat16> { static constexpr int value = 2; };
template <> struct UnrollOf<double> { static constexpr int value = 2; };
// Blocks of kMaxRowThreads per SM the register budget is sized for (64 registers; float64 needs more).
template <typename T> struct MinBlocksOf { static constexpr int value = 2; };
template <> struct MinBlocksOf<double> { static constexpr int value = 1; };
// Blocks of the cluster kernel per SM its register budget is sized for: as many as shared memory
// allows with 64 KB slices (40 registers a thread, as the cached row kernel).
template <typename T> struct ClusterBlocksOf { static constexpr int value = 3; };
template <> struct ClusterBlocksOf<double> { static constexpr int value = 1; };
// The cached row kernel keeps x in shared memory, not registers, so its register budget sets how
// many blocks an SM holds, and the extra rows in flight hide the latency of each row's reductions:
// 3 blocks of 512 threads at 40 registers, or 4 at 32 (`kMore`), where half types with float32
// weights spill. H100, 4 against 3: rows that leave threads of their block idle or share a block
// gain (bf16 4096x12288 LN 86.9 -> 89.7%, fp32 95.0 -> 96.5; bf16 65536x1024 and 32768x2048 +0.3-0.5
// points); a block holding one whole row at 4 vectors a thread loses a little (bf16 4096x16384 LN
// 91.8 -> 91.4%, fp32 8192x8192 -0.2) and keeps 3.
template <typename T, typename W, bool kMore>
constexpr int kCachedRowBlocks = sizeof(T) == 8 ? 1 : kMore && (sizeof(T) == 4 || std::is_same<T, W>::value) ? 4 : 3;

// The vectors [v0, v1) of one row that is not cached, processed by a group of `tpr` threads (this
// is thread `t`): `stats` reads them and returns this thread's statistics; the caller combines
// them; `apply` reads x again (then from L2, the slice having just been read), normalizes and stores.
// Thread t handles vectors t, t + tpr, ...: coalesced global accesses.
template <typename A, typename T, int VEC, bool kEvictFirst = true>
struct RowSlice {
  using V = Vec<T, VEC>;
  static constexpr int kUnroll = UnrollOf<T>::value;
  int64_t v0, v1;
  int t, tpr;

  // Exact statistics of each batch, merged; half the batch: the merge needs registers.
  __device__ __forceinline__ Stats<A> stats(const V* xv, bool rms, A shift) {
    constexpr int kHalf = kUnroll > 1 ? kUnroll / 2 : 1;
    Stats<A> s{A(0), A(0), A(0)};
    for (int64_t base = v0 + t; base < v1; base += int64_t(kHalf) * tpr) {
      V r[kHalf];
#pragma unroll
      for (int u = 0; u < kHalf; ++u) {
        const int64_t i = base + int64_t(u) * tpr;
        if (i < v1) r[u] = load_vec<false>(xv + i);
      }
      s = merge(s, thread_stats<A>(r, base, tpr, v1, rms, shift), rms);
    }
    return s;
  }

  // One vector at a time: the parameters it needs take registers, and latency is hidden by the
  // other rows in flight on the SM rather than by unrolling. Parameters are relative to v0.
  template <bool kKeep, typename W>
  __device__ __forceinline__ void apply(const V* xv, V* yv, const W* w, const W* b, const Affine<A>& st) {
#pragma unroll 2
    for (int64_t i = v0 + t; i < v1; i += tpr) {
      store_vec<kEvictFirst>(yv + i, normalize_vec<kKeep, A>(load_vec<true>(xv + i), st, w, b, (i - v0) * VEC));
    }
  }
};

// Normalizes and stores the `count` cached vectors t, t + tpr, ... of a row (tpr = 1 << sh). One
// loop per case of the template flags (kCenter: LayerNorm, else RMSNorm; kW, kB: weight, bias)
// keeps the checks out of the loop; ncu counted ~20 instructions a vector for them before.
// (Prefetching the next vector's parameters into L1 measured 3-37 points slower, H100.)
template <bool kCenter, bool kW, bool kB, bool kEvictFirst, typename A, typename T, typename W, int VEC>
__device__ __forceinline__ void store_cached_row(const Vec<T, VEC>* cache, Vec<T, VEC>* yv, const W* w, const W* b,
                                                 const Affine<A>& st, int t, int sh, int count) {
#pragma unroll 1
  for (int k = 0; k < count; ++k) {
    const int i = t + (k << sh);
    A wv[VEC], bv[VEC];
    if constexpr (kW) load_params<false, VEC>(w + int64_t(i) * VEC, wv);
    if constexpr (kB) load_params<false, VEC>(b + int64_t(i) * VEC, bv);
    store_vec<kEvictFirst>(yv + i, normalize_with(cache[i], st, kW, wv, kB, bv, kCenter));
  }
}

// store_cached_row for the call's case.
template <bool kEvictFirst, typename A, typename T, typename W, int VEC>
__device__ __forceinline__ void store_own_vectors(const Vec<T, VEC>* cache, Vec<T, VEC>* yv, const W* w, const W* b,
                                             const Affine<A>& st, int t, int sh, int count, bool rms) {
  if (rms && !b) {  // (RMSNorm's affine map has center 0 and offset 0: the general loops serve too)
    if (w) store_cached_row<false, true, false, kEvictFirst>(cache, yv, w, b, st, t, sh, count);
    else store_cached_row<false, false, false, kEvictFirst>(cache, yv, w, b, st, t, sh, count);
  } else if (w && b) {
    store_cached_row<true, true, true, kEvictFirst>(cache, yv, w, b, st, t, sh, count);
  } else if (w) {
    store_cached_row<true, true, false, kEvictFirst>(cache, yv, w, b, st, t, sh, count);
  } else if (b) {
    store_cached_row<true, false, true, kEvictFirst>(cache, yv, w, b, st, t, sh, count);
  } else {
    store_cached_row<true, false, false, kEvictFirst>(cache, yv, w, b, st, t, sh, count);
  }
}

// Copies a thread's vectors t + (k << sh), k < count, of xv into the cache and waits for them
// (cp.async; plain loads for vectors under 4 bytes). A thread reads back only its own copies: no
// barrier needed.
template <bool kEvictFirst, typename T, int VEC>
__device__ __forceinline__ void cache_own_vectors(Vec<T, VEC>* cache, const Vec<T, VEC>* xv, int t, int sh, int count) {
  if constexpr (sizeof(Vec<T, VEC>) >= 4) {
    for (int k = 0; k < count; ++k) cp_async<int(sizeof(Vec<T, VEC>)), kEvictFirst>(cache + t + (k << sh), xv + t + (k << sh));
    cp_async_wait_all();
  } else {
    for (int k = 0; k < count; ++k) cache[t + (k << sh)] = xv[t + (k << sh)];
  }
}

// Passes over a thread's cached vectors t + (k << sh), k < count, for the plain-sum statistics:
// sum of x * scale (scale = 1 / n: a rough mean that cannot overflow near FLT_MAX), sum of x * x,
// and the sums of d = x - c and d * d about a rough mean c.
template <typename A, typename T, int VEC>
__device__ __forceinline__ A cached_scaled_sum(const Vec<T, VEC>* cache, int t, int sh, int count, A scale) {
  A vals[VEC], s = A(0);
#pragma unroll 2
  for (int k = 0; k < count; ++k) {
    widen(cache[t + (k << sh)].v, vals);
#pragma unroll
    for (int e = 0; e < VEC; ++e) s = fma(vals[e], scale, s);
  }
  return s;
}

template <typename A, typename T, int VEC>
__device__ __forceinline__ A cached_square_sum(const Vec<T, VEC>* cache, int t, int sh, int count) {
  A vals[VEC], s = A(0);
#pragma unroll 2
  for (int k = 0; k < count; ++k) {
    widen(cache[t + (k << sh)].v, vals);
#pragma unroll
    for (int e = 0; e < VEC; ++e) s = fma(vals[e], vals[e], s);
  }
  return s;
}

template <typename A, typename T, int VEC>
__device__ __forceinline__ void cached_deviation_sums(const Vec<T, VEC>* cache, int t, int sh, int count, A c,
                                                      A (&out)[2]) {
  A vals[VEC], sd = A(0), sdd = A(0);
#pragma unroll 2
  for (int k = 0; k < count; ++k) {
    widen(cache[t + (k << sh)].v, vals);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const A d = vals[e] - c;
      sd += d;
      sdd = fma(d, d, sdd);
    }
  }
  out[0] = sd;
  out[1] = sdd;
}

// Variance from the means of d and d * d about a rough mean. Below zero by rounding, or inf - inf
// when the squares overflowed (|x| > ~1e19 with spread, or a constant row near FLT_MAX whose rough
// mean is off by an ulp): then rstd = 0, y = b, as PyTorch gives when its variance overflows.
template <typename A>
__device__ __forceinline__ A corrected_variance(A mean_d, A mean_sq) {
  const A var = mean_sq - mean_d * mean_d;
  return var >= A(0) ? var : isinf(mean_sq) ? mean_sq : A(0);
}

// A block's fixed column slice [v0, v1) of every row it handles (cluster and split-slice kernels),
// m vectors, n_b elements; each thread owns vectors t + (k << sh) of it (blockDim a power of two).
// `stats` copies the slice into shared memory and returns its statistics as (count, mean relative
// to `shift`, M2) from plain sums (a rough mean, then the corrected two-pass sums): the partials the
// kernels merge with Chan's formula. Its block reductions alternate the two `sums` buffers (see
// group_sums); `buf` is the next one. `store` normalizes the cached slice and writes it.
template <typename A, typename T, typename W, int VEC>
struct BlockSlice {
  using V = Vec<T, VEC>;
  V* cache;
  const W *w, *b;  // the slice's columns of weight and bias (null when absent)
  int64_t v0;
  int t, sh, m, count;
  A n_b, inv_nb;

  __device__ __forceinline__ BlockSlice(const RowArgs<T, W>& a, int64_t first, int64_t end, unsigned char* smem)
      : cache(reinterpret_cast<V*>(smem)), w(a.w ? a.w + first * VEC : a.w), b(a.b ? a.b + first * VEC : a.b),
        v0(first), t(threadIdx.x), m(int(end - first)) {
    sh = __ffs(int(blockDim.x)) - 1;
    count = m > t ? ((m - 1 - t) >> sh) + 1 : 0;
    n_b = A(m) * A(VEC);
    inv_nb = m > 0 ? A(1) / n_b : A(0);
  }

  __device__ __forceinline__ Stats<A> stats(const RowArgs<T, W>& a, int64_t row, A shift, A (*sums)[64], int& buf) {
    const bool rms = a.rms;
    cache_own_vectors<false>(cache, reinterpret_cast<const V*>(a.x + row * a.x_stride) + v0, t, sh, count);
    A total[1] = {rms ? cached_square_sum<A>(cache, t, sh, count) : cached_scaled_sum(cache, t, sh, count, inv_nb)};
    group_sums(total, 1 << sh, sums[buf]);
    buf ^= 1;
    Stats<A> s{n_b, A(0), total[0]};
    if (!rms) {
      const A c = total[0];
      A dev[2];
      cached_deviation_sums(cache, t, sh, count, c, dev);
      group_sums(dev, 1 << sh, sums[buf]);
      buf ^= 1;
      const A mean_d = dev[0] * inv_nb;
      s.mean = m > 0 ? (c - shift) + mean_d : A(0);  // 0 for an empty slice keeps the merge exact
      s.m2 = corrected_variance(mean_d, dev[1] * inv_nb) * n_b;
    }
    return s;
  }

  __device__ __forceinline__ void store(const RowArgs<T, W>& a, int64_t row, const Affine<A>& st) {
    store_own_vectors<false>(cache, reinterpret_cast<V*>(a.y + row * a.n) + v0, w, b, st, t, sh, count, a.rms);
  }
};

// One row per group of `tpr` threads, blockDim / tpr rows per block; `cache_vec` vectors of shared
// memory per row (0: no cache, x is read twice).
// Cached rows take their statistics in passes over shared memory, each ending in one plain sum
// over the group: the sum of x / n gives a rough mean c, then the corrected two-pass sums of d = x - c
// and d * d give the variance and the exact mean (c plus a small correction), however far the
// mean is from zero. Cheaper than merging (count, mean, M2) triples, whose divisions made up a
// tenth of the bf16 kernel's instructions, and as accurate.
template <typename T, typename W, int VEC, bool kCached, bool kMore = false>
__global__ void __launch_bounds__(kMaxRowThreads, kCached ? kCachedRowBlocks<T, W, kMore> : MinBlocksOf<T>::value) row_norm_kernel(RowArgs<T, W> a, int64_t cache_vec) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ Stats<A> red[32];
  __shared__ A sums[2][64];
  int buf = 0;
  const int tpr = a.tpr, sh = __ffs(tpr) - 1;  // tpr is a power of two: shifts, not divisions
  const int rows_per_block = blockDim.x >> sh;
  const int group = threadIdx.x >> sh, t = threadIdx.x & (tpr - 1);
  const bool rms = a.rms;
  const int64_t nvec = a.n / VEC;
  const A inv_n = A(1) / A(a.n);
  V* cache = kCached ? reinterpret_cast<V*>(dyn_smem) + group * cache_vec : nullptr;
  for (int64_t base = int64_t(blockIdx.x) * rows_per_block; base < a.rows;
       base += int64_t(gridDim.x) * rows_per_block) {
    const int64_t row = base + group;
    const bool active = row < a.rows;
    const V* xv = reinterpret_cast<const V*>(a.x + (active ? row : 0) * a.x_stride);
    V* yv = reinterpret_cast<V*>(a.y + (active ? row : 0) * a.n);
    if constexpr (kCached) {
      // This thread's vectors: t + (k << sh) for k < count (a cached row holds at most kRowCacheBytes).
      const int m = active ? int(nvec) : 0;
      const int count = m > t ? ((m - 1 - t) >> sh) + 1 : 0;
      cache_own_vectors<false>(cache, xv, t, sh, count);
      A total[1] = {rms ? cached_square_sum<A>(cache, t, sh, count) : cached_scaled_sum(cache, t, sh, count, inv_n)};
      group_sums(total, tpr, sums[buf]);
      buf ^= 1;
      Affine<A> st;
      if (rms) {
        st = affine_of(A(0), A(0), total[0] * inv_n, a.eps, true);
      } else {
        const A c = total[0];
        A dev[2];
        cached_deviation_sums(cache, t, sh, count, c, dev);
        group_sums(dev, tpr, sums[buf]);
        buf ^= 1;
        const A mean_d = dev[0] * inv_n;  // the small correction of c, exact enough in a plain sum
        st = affine_of(c, mean_d, corrected_variance(mean_d, dev[1] * inv_n), a.eps, false);
      }
      store_own_vectors<false>(cache, yv, a.w, a.b, st, t, sh, count, rms);
    } else {
      const A shift = (active && !rms) ? A(to_acc(a.x[row * a.x_stride])) : A(0);
      RowSlice<A, T, VEC, false> slice{0, active ? nvec : 0, t, tpr};
      const Stats<A> s = group_reduce(slice.stats(xv, rms, shift), tpr, rms, red);
      if (active) slice.template apply<false>(xv, yv, a.w, a.b, finalize(s, a.n, a.eps, rms, shift));
    }
  }
}

// Few rows (fewer than SMs; latency-bound): one block per row, one vector a thread, x and the
// parameters loaded into registers at once, 32-bit indices, no loop. The row kernel's general path
// issued ~890 instructions a warp on a 1x4096 bf16 LayerNorm against ~570 in torch.compile's Triton
// kernel (ncu, H100); the statistics are the row kernel's plain sums (rough mean, then the
// corrected two-pass sums), so both kernels agree on every row. (2 or 4 vectors a thread, in
// blocks a half or a quarter the size, measured 0.1-1.6 us slower on bf16 rows, level on fp32.)
// One instantiation per norm (kRms), not a runtime flag: bf16 RMSNorm rows 0.1-0.2 us faster
// (1x4096 4.45-4.64 -> 4.29-4.35 us, H100), LayerNorm and fp32 level.
constexpr int kFewRowsThreads = 1024;  // rows of at most this many vectors

template <typename T, typename W, int VEC, bool kRms>
__global__ void __launch_bounds__(kFewRowsThreads) few_rows_kernel(RowArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  __shared__ A sums[2][64];
  const int t = threadIdx.x, nvec = int(a.n / VEC);
  const bool active = t < nvec, rms = kRms, has_w = a.w != nullptr, has_b = a.b != nullptr;
  V xr;
  ParamVec<W, VEC> wr, br;
  A vals[VEC];
  if (active) {
    xr = reinterpret_cast<const V*>(a.x + int64_t(blockIdx.x) * a.x_stride)[t];
    if (has_w) wr = load_param_vec<false, W, VEC>(a.w + t * VEC);
    if (has_b) br = load_param_vec<false, W, VEC>(a.b + t * VEC);
    widen(xr.v, vals);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) vals[e] = A(0);  // idle threads add zeros
  }
  const A inv_n = A(1) / A(a.n);
  A total[1] = {A(0)};
#pragma unroll
  for (int e = 0; e < VEC; ++e) total[0] = rms ? fma(vals[e], vals[e], total[0]) : fma(vals[e], inv_n, total[0]);
  group_sums(total, blockDim.x, sums[0]);
  Affine<A> st;
  if (rms) {
    st = affine_of(A(0), A(0), total[0] * inv_n, a.eps, true);
  } else {
    const A c = total[0];
    A dev[2] = {A(0), A(0)};
    if (active) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A d = vals[e] - c;
        dev[0] += d;
        dev[1] = fma(d, d, dev[1]);
      }
    }
    group_sums(dev, blockDim.x, sums[1]);
    const A mean_d = dev[0] * inv_n;
    st = affine_of(c, mean_d, corrected_variance(mean_d, dev[1] * inv_n), a.eps, false);
  }
  if (!active) return;
  A wv[VEC], bv[VEC];
  if (has_w) widen(wr.v, wv);
  if (has_b) widen(br.v, bv);
  V* yv = reinterpret_cast<V*>(a.y + int64_t(blockIdx.x) * a.n);
  store_vec<false>(yv + t, normalize_with(xr, st, has_w, wv, has_b, bv, !rms));
}

// Split rows: `g` blocks per row, `slots` rows in flight; block `blockIdx.x` works on slot
// blockIdx.x / g, slice blockIdx.x % g, for rows slot, slot + slots, ... (one wave each).
struct SplitWorkspace {
  unsigned int* arrivals;  // per slot, grows by g every wave
  void* partials;          // [2][slots][g] Stats, double-buffered by wave parity
};

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The split kernels' per-row barrier: thread 0 writes the block's partial, arrives at the slot's
// counter and waits until it reaches `target` (g arrivals a wave); then the whole block goes on.
template <typename A>
__device__ __forceinline__ void publish_and_wait(Stats<A>* slot_partial, const Stats<A>& s, unsigned int* arrivals,
                                                 unsigned int target) {
  if (threadIdx.x == 0) {
    *slot_partial = s;
    __threadfence();
    atomicAdd(arrivals, 1u);
    while (load_acquire(arrivals) < target) __nanosleep(32);
  }
  __syncthreads();
}

// Rows whose slices are too many to be resident with a cache: each block reads its slice twice (the
// second time mostly from L2), the row's partial statistics merged by a block reduction.
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kMaxRowThreads, MinBlocksOf<T>::value) split_row_norm_kernel(RowArgs<T, W> a, int g, int slots,
                                                                            SplitWorkspace ws) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  __shared__ Stats<A> red[32];
  __shared__ Affine<A> row_affine;
  const bool rms = a.rms;
  const int slot = blockIdx.x / g, part = blockIdx.x % g;
  if (slot >= slots) return;  // whole block leaves: it takes part in no barrier
  const int64_t nvec = a.n / VEC;
  const int64_t per_block = (nvec + g - 1) / g;
  const int64_t v0 = min(nvec, part * per_block), v1 = min(nvec, v0 + per_block);
  auto* partials = reinterpret_cast<Stats<A>*>(ws.partials);
  // Column offsets in apply() are relative to v0, hence the shifted parameters. Later waves re-read
  // them: keep them in L2 until the last one.
  const W* w = a.w ? a.w + v0 * VEC : a.w;
  const W* b = a.b ? a.b + v0 * VEC : a.b;
  int wave = 0;
  for (int64_t row = slot; row < a.rows; row += slots, ++wave) {
    const V* xv = reinterpret_cast<const V*>(a.x + row * a.x_stride);
    V* yv = reinterpret_cast<V*>(a.y + row * a.n);
    const A shift = rms ? A(0) : A(to_acc(a.x[row * a.x_stride]));  // the same in every block of the row
    RowSlice<A, T, VEC> slice{v0, v1, int(threadIdx.x), int(blockDim.x)};
    const Stats<A> s = group_reduce(slice.stats(xv, rms, shift), blockDim.x, rms, red);
    Stats<A>* mine = partials + (size_t(wave & 1) * slots + slot) * g;
    publish_and_wait(mine + part, s, ws.arrivals + slot, unsigned(g) * unsigned(wave + 1));
    Stats<A> total{A(0), A(0), A(0)};
    for (int i = threadIdx.x; i < g; i += blockDim.x) {
      const Stats<A> q{__ldcg(&mine[i].n), __ldcg(&mine[i].mean), __ldcg(&mine[i].m2)};
      total = merge(total, q, rms);
    }
    total = group_reduce(total, blockDim.x, rms, red);
    if (threadIdx.x == 0) row_affine = finalize(total, a.n, a.eps, rms, shift);
    __syncthreads();
    if (slots < a.rows) slice.template apply<true>(xv, yv, w, b, row_affine);
    else slice.template apply<false>(xv, yv, w, b, row_affine);
  }
  if (slots < a.rows) {
    const int64_t bytes = (v1 - v0) * VEC * int64_t(sizeof(W));
    if (a.w) release_params(a.w + v0 * VEC, bytes);
    if (a.b) release_params(a.b + v0 * VEC, bytes);
  }
}

// Split rows with cached slices (shared memory), their statistics taken as the cluster kernel does:
// plain sums over the block's slice (a rough mean, then the corrected two-pass sums), then every warp
// merges the g slice partials with Chan's formula, without a block barrier. The partials meet in
// global memory behind the slot's arrival counter. Plain loads and stores, and no prefetch of the
// next row into L2 during the barrier: H100, same process, against the previous split kernel (exact
// per-thread statistics merged by block reductions, evict-first x and y, evict-last parameters, the
// L2 prefetch): fp32 256x262144 LN 67 -> 85% of copy, RMS 81.6 -> 88.5; 128x524288 67 -> 81, 80 -> 85;
// bf16 128x524288 55 -> 74, 72 -> 81.6. (The new statistics with the old hints and prefetch: 76 / 80.5;
// hints without the prefetch: 82 / 86.)
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kMaxRowThreads, ClusterBlocksOf<T>::value) split_slice_kernel(RowArgs<T, W> a, int g, int slots,
                                                                                 SplitWorkspace ws) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ A sums[2][64];
  const int slot = blockIdx.x / g, part = blockIdx.x % g;
  if (slot >= slots) return;  // whole block leaves: it takes part in no barrier
  const int64_t nvec = a.n / VEC;
  const int64_t per_block = (nvec + g - 1) / g;
  const int64_t v0 = min(nvec, part * per_block), v1 = min(nvec, v0 + per_block);
  BlockSlice<A, T, W, VEC> slice(a, v0, v1, dyn_smem);
  const int t = threadIdx.x, lane = t & 31;
  const bool rms = a.rms;
  auto* partials = reinterpret_cast<Stats<A>*>(ws.partials);
  int buf = 0, wave = 0;
  for (int64_t row = slot; row < a.rows; row += slots, ++wave) {
    const A shift = rms ? A(0) : A(to_acc(a.x[row * a.x_stride]));  // the same in every block of the row
    const Stats<A> s = slice.stats(a, row, shift, sums, buf);
    // The partials of a wave are read before any block arrives at the next wave's counter (the
    // block barriers of its statistics come first), so two buffers, by wave parity, suffice.
    Stats<A>* mine = partials + (size_t(wave & 1) * slots + slot) * g;
    publish_and_wait(mine + part, s, ws.arrivals + slot, unsigned(g) * unsigned(wave + 1));
    Stats<A> row_stats{A(0), A(0), A(0)};
    for (int i = lane; i < g; i += 32) {
      row_stats = merge(row_stats, Stats<A>{__ldcg(&mine[i].n), __ldcg(&mine[i].mean), __ldcg(&mine[i].m2)}, rms);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) row_stats = merge(row_stats, shfl_xor(row_stats, off), rms);
    slice.store(a, row, finalize(row_stats, a.n, a.eps, rms, shift));
  }
}

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

// Resident rows, rows of megabytes: one cooperative wave of blocks (one per SM) holds a
// whole row on chip, K vectors of x per thread in registers, and keeps weight and bias in shared
// memory, copied once for all rows (the vectors that do not fit come from L2 every row). Rows go
// one after the other: the blocks' partial statistics meet behind a grid-wide barrier, then every
// block normalizes its part from registers. x is read once, y written once, parameters read once.
// From the moment a block arrives at a row's barrier, its vectors of the next rows are staged
// (`prefetch`), so DRAM keeps streaming through the barrier: the next row is copied into a
// shared-memory buffer where there is room beside the parameters, else prefetched into L2, where its
// loads find it (float32 LayerNorm of 16 MB rows, whose 32 MB of parameters leave no room: 289 ->
// 260 us on 16x4194304, H100; DRAM reads rose from 302 to 324 MB, L2 losing a few of the lines).
// With a buffer, the row after the next one can go to L2 as well, so that the buffer's copies come
// from there: rows of 8 MB gain (bf16 16x4194304 LN 158 -> 148 us, fp32 32x2097152 LN 278 -> 256),
// rows of 16 MB lose (fp32 RMS 16x4194304: 220 -> 235 us: L2 does not keep two rows).
// With kGroups = 2 the blocks form two groups that take alternate rows, each behind its own barrier:
// a group's blocks hold twice the vectors a thread (for rows of 4-8 MB, whose critical path per row
// would otherwise cost as much as their traffic), and two rows are in flight.
// Thread t of the group's block b holds vectors g, g + G, ... of the row (g = b * blockDim + t, G
// the group's threads): the block's k-th vectors are one contiguous run of blockDim vectors.
// Statistics are plain sums of moments about the row's first element (shift), in double: the grid
// total is one sum of the blocks' parts, the variance S2 / n - (S1 / n)^2. Since the shift is one
// of the row's values, (mean - shift)^2 <= n var, so the cancellation costs at most a factor n of
// double's precision (n <= 2**24: 4e-9 relative). Each thread's part comes from its exact
// (count, mean, M2) over its registers (two passes). Chan merges (a division per step) cost
// 1.8 us a row per reduction, and DRAM idles while they run (H100).
// A block's part of a row: the sums of x - shift and (x - shift)^2 over its elements.
struct RowMoments {
  double sum, sum_sq;
};
// Bits of the resident kernel's `prefetch`, what it stages while a row waits at its barrier:
// kStageShared, the next row into a shared-memory buffer (TMA copies); kStageL2, a row into L2 (TMA
// prefetches): the next one when there is no buffer, else the one after it.
constexpr int kStageShared = 1, kStageL2 = 2;
constexpr int kResidentThreads = 1024;  // at least the number of SMs: thread j gathers block j's partial
// Row groups of the resident kernel, at most; their arrival counters lie 128 bytes apart.
constexpr int kMaxResidentGroups = 2, kArrivalStride = 32;

template <typename T, typename W, int VEC, int K, int kGroups>
__global__ void __launch_bounds__(kResidentThreads, 1) resident_row_norm_kernel(RowArgs<T, W> a, int smem_slots,
                                                                                int prefetch, SplitWorkspace ws) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  using P = ParamVec<W, VEC>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ A sums[32];
  __shared__ double dsums[2][64];  // consecutive block reductions alternate buffers (see group_sums)
  // The row's first element, copied: 4 bytes (two elements) for 2-byte types, cp.async's smallest.
  constexpr int kShiftBytes = sizeof(T) < 4 ? 4 : int(sizeof(T));
  __shared__ __align__(16) T shift_src[16 / sizeof(T)];
#ifdef FASTNORM_BULK
  __shared__ __align__(8) uint64_t staged_bar;  // completes when the next row's copies have landed
#endif
  const int tid = threadIdx.x, threads = blockDim.x;
  P* slots = reinterpret_cast<P*>(dyn_smem);  // slot j of this thread: slots[j * threads + tid]
  V* next = reinterpret_cast<V*>(slots + smem_slots * threads);  // next row: next[k * threads + tid]
  const bool rms = a.rms, has_w = a.w != nullptr, has_b = a.b != nullptr;
  const int nvec = int(a.n / VEC);  // at most 8 vectors per thread of the group
  // Block b is block b / kGroups of group b % kGroups; group j takes rows j, j + kGroups, ...
  const int group = int(blockIdx.x) % kGroups, gblock = int(blockIdx.x) / kGroups, gblocks = int(gridDim.x) / kGroups;
  const int step = gblocks * threads, first = gblock * threads + tid;
  // Vectors in the block's k-th run, and in all its runs.
  auto run = [&](int k) {
    const int left = nvec - (k * step + gblock * threads);
    return left < 0 ? 0 : left < threads ? left : threads;
  };
  int block_vecs = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) block_vecs += run(k);
  const ParamSlots<W, VEC, K> params{slots, smem_slots, tid, threads};
  params.copy(a.w, a.b, first, step, nvec);
#ifdef FASTNORM_BULK
  if ((prefetch & kStageShared) && tid == 0) mbarrier_init(&staged_bar);
  __syncthreads();
#endif
  // Stages the next rows while row `row` waits at its barrier (see kStage*); thread 0 issues the
  // bulk copies and prefetches.
  auto stage_next = [&](int64_t row) {
    if (row + kGroups >= a.rows) return;
    const T* nx = a.x + (row + kGroups) * a.x_stride;
    if (prefetch & kStageShared) {
      if (!rms && tid == 0) cp_async<kShiftBytes>(shift_src, nx);
#ifdef FASTNORM_BULK
      if (tid == 0) {
        const V* nxv = reinterpret_cast<const V*>(nx) + gblock * threads;
        mbarrier_expect_bytes(&staged_bar, unsigned(block_vecs) * unsigned(sizeof(V)));
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if (run(k) > 0) bulk_copy(&next[k * threads], nxv + k * step, unsigned(run(k)) * unsigned(sizeof(V)), &staged_bar);
        }
      }
#else
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = first + k * step;
        if (i < nvec) cp_async<16>(&next[k * threads + tid], reinterpret_cast<const V*>(nx) + i);
      }
#endif
    }
#ifdef FASTNORM_BULK
    const int64_t l2_row = row + ((prefetch & kStageShared) ? 2 : 1) * kGroups;
    if ((prefetch & kStageL2) && tid == 0 && l2_row < a.rows) {
      const V* lv = reinterpret_cast<const V*>(a.x + l2_row * a.x_stride) + gblock * threads;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (run(k) > 0) bulk_prefetch_l2(lv + k * step, unsigned(run(k)) * unsigned(sizeof(V)));
      }
    }
#endif
  };
  const int iters = int((a.rows - group + kGroups - 1) / kGroups);  // the group's rows
  for (int iter = 0; iter < iters; ++iter) {
    const int64_t row = group + int64_t(iter) * kGroups;
    const V* xv = reinterpret_cast<const V*>(a.x + row * a.x_stride);
    V r[K];
    // LayerNorm's shift (the row's first element) comes through shared memory: one read per block,
    // where a read by every warp of the grid would queue on one L2 slice like the partials below.
    const bool staged = (prefetch & kStageShared) && iter > 0;  // this row's vectors and shift are already copied
    if (!staged) {
      if (!rms && tid == 0) cp_async<kShiftBytes>(shift_src, a.x + row * a.x_stride);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = first + k * step;
        if (i < nvec) r[k] = load_vec<true>(xv + i);
      }
    }
    cp_async_wait_all();  // the parameters (first row), the shift, the staged row (without bulk copies)
    if (!rms) __syncthreads();
    if (staged) {
#ifdef FASTNORM_BULK
      mbarrier_wait(&staged_bar, unsigned(iter - 1) & 1u);
#endif
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (first + k * step < nvec) r[k] = next[k * threads + tid];
      }
    }
    const A shift = rms ? A(0) : A(to_acc(shift_src[0]));
    // The block's part, as moments about the shift: RMSNorm the sum of squares (float); LayerNorm
    // each thread's exact (count, mean, M2) over its registers, turned into the sums of x - shift
    // and (x - shift)^2 in double, one block reduction. Invalid vectors of r are never read.
    // Partials are double-buffered by the parity of the group's rows: a block rewrites this row's
    // buffer two of its rows later, after the next barrier, which no block of the group passes
    // before all have read this one.
    RowMoments* row_parts = reinterpret_cast<RowMoments*>(ws.partials) + (2 * group + (iter & 1)) * gblocks;
    if (rms) {
      A total[1] = {A(0)};
      A vals[VEC];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (first + k * step >= nvec) continue;
        widen(r[k].v, vals);
#pragma unroll
        for (int e = 0; e < VEC; ++e) total[0] = fma(vals[e], vals[e], total[0]);
      }
      group_sums(total, threads, sums);
      if (tid == 0) row_parts[gblock] = RowMoments{0.0, double(total[0])};
    } else {
      A vals[VEC], sum = A(0), m2 = A(0);
      int count = 0;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (first + k * step >= nvec) continue;
        widen(r[k].v, vals);
        ++count;
#pragma unroll
        for (int e = 0; e < VEC; ++e) sum += vals[e] - shift;  // about the shift: 32 x 3e37 would overflow
      }
      const A mean = shift + (count > 0 ? sum / A(count * VEC) : A(0));
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (first + k * step >= nvec) continue;
        widen(r[k].v, vals);
#pragma unroll
        for (int e = 0; e < VEC; ++e) m2 = fma(vals[e] - mean, vals[e] - mean, m2);
      }
      const double tn = double(count * VEC), d = double(mean) - double(shift);
      double moments[2] = {tn * d, double(m2) + tn * d * d};
      group_sums(moments, threads, dsums[0]);
      if (tid == 0) row_parts[gblock] = RowMoments{moments[0], moments[1]};
    }
    // The group's barrier.
    if (tid == 0) {
      __threadfence();
      atomicAdd(ws.arrivals + group * kArrivalStride, 1u);
    }
    // The next row's copies start after the arrival (a fence issued after them would wait for them),
    // once every thread has read the staged row and the shift (group_sums synchronized).
    stage_next(row);
    if (tid == 0) {
      const unsigned int target = unsigned(gblocks) * unsigned(iter + 1);
      while (load_acquire(ws.arrivals + group * kArrivalStride) < target) __nanosleep(20);
    }
    __syncthreads();
    // Thread j < gblocks loads block j's partial: a few requests per block (every warp of the grid
    // reading all partials queues on one L2 slice: 25-30 us a row), all in flight at once. The
    // moments about the shift: sum of n (mean - shift), sum of M2 + n (mean - shift)^2.
    double moments[2] = {0.0, 0.0};
    if (tid < gblocks) moments[0] = __ldcg(&row_parts[tid].sum), moments[1] = __ldcg(&row_parts[tid].sum_sq);
    group_sums(moments, threads, dsums[1]);
    const double inv_n = __drcp_rn(double(a.n));  // (a double division here spilled registers at K = 8)
    const double mean_rel = moments[0] * inv_n, mean_sq = moments[1] * inv_n;
    const Affine<A> st = affine_of(shift, A(mean_rel), A(rms ? mean_sq : corrected_variance(mean_rel, mean_sq)), a.eps, rms);
    V* yv = reinterpret_cast<V*>(a.y + row * a.n);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = first + k * step;
      if (i >= nvec) continue;
      A wv[VEC], bv[VEC];
      params.values(a.w, a.b, k, i, wv, bv);
      store_vec(yv + i, normalize_with(r[k], st, has_w, wv, has_b, bv));
    }
  }
}

// Cluster rows: a row split over the `g` blocks of a thread-block cluster (2..8), each keeping its
// slice in shared memory (plain loads and stores: H100, fp32 1024x65536 LN 85 -> 89% of copy, RMS
// 88 -> 92.8, bf16 81 -> 83, 86.5 -> 88.5, against evict-first x and y). The blocks exchange partial
// statistics through distributed shared memory behind the hardware cluster barrier, so clusters
// never wait for each other: one cluster's loads overlap another's stores on the same SM.
// Cluster instructions exist from sm_90 on; older builds compile the kernel empty (the planner never
// launches it on a device of compute capability below 9).
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

// Each block takes the statistics of its slice as the row kernel does a row (plain sums: rough
// mean, then the corrected two-pass sums), as (count, mean relative to the row's first element, M2);
// the g partials are merged with Chan's formula.
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
  const int t = threadIdx.x, lane = t & 31;
  const bool rms = a.rms;
  int parity = 0;
  for (int64_t row = first_row; row < a.rows; row += row_step, parity ^= 1) {
    const A shift = rms ? A(0) : A(to_acc(a.x[row * a.x_stride]));  // the same in every block of the row
    const Stats<A> s = slice.stats(a, row, shift, sums, buf);
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
    slice.store(a, row, finalize(row_stats, a.n, a.eps, rms, shift));
  }
  cluster_sync();  // no block may exit while another can still read its partials
#else
  __trap();
#endif
}

// Streamed rows, for a few rows of many megabytes (no cache could hold one): three barrier-free
// kernels. (1) partial statistics of row chunks, (2) per-row totals, (3) each block owns a column
// chunk, keeps its weight and bias in registers and sweeps every row: x is read twice, but the
// parameters only once (a row-at-a-time kernel would re-read them for every row).
constexpr int kStreamThreads = 256;
constexpr int kStreamVecs = 4;  // vectors per thread in a column chunk (apply) / per batch (stats)

template <typename T, int VEC>
__global__ void __launch_bounds__(kStreamThreads) stream_stats_kernel(const T* x, int64_t n, int64_t x_stride,
                                                                      int64_t chunk_vec, int rms, void* partials) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  __shared__ Stats<A> red[32];
  const int64_t row = blockIdx.y, nvec = n / VEC;
  const int64_t v0 = int64_t(blockIdx.x) * chunk_vec;
  const int64_t v1 = v0 + chunk_vec < nvec ? v0 + chunk_vec : nvec;
  const T* xr = x + row * x_stride;
  const A shift = rms ? A(0) : A(to_acc(xr[0]));
  RowSlice<A, T, VEC> slice{v0, v1, int(threadIdx.x), int(blockDim.x)};
  const Stats<A> s = group_reduce(slice.stats(reinterpret_cast<const V*>(xr), rms, shift), blockDim.x, rms, red);
  if (threadIdx.x == 0) reinterpret_cast<Stats<A>*>(partials)[row * gridDim.x + blockIdx.x] = s;
}

template <typename T>
__global__ void __launch_bounds__(kStreamThreads) stream_finalize_kernel(const T* x, int64_t n, int64_t x_stride,
                                                                         int chunks, double eps, int rms,
                                                                         const void* partials, void* affine) {
  using A = typename AccOf<T>::type;
  __shared__ Stats<A> red[32];
  const int64_t row = blockIdx.x;
  const auto* part = reinterpret_cast<const Stats<A>*>(partials) + row * chunks;
  Stats<A> s{A(0), A(0), A(0)};
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) s = merge(s, part[i], rms);
  s = group_reduce(s, blockDim.x, rms, red);
  const A shift = rms ? A(0) : A(to_acc(x[row * x_stride]));
  if (threadIdx.x == 0) reinterpret_cast<Affine<A>*>(affine)[row] = finalize(s, n, eps, rms, shift);
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kStreamThreads) stream_apply_kernel(RowArgs<T, W> a, const void* affine) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  const int64_t nvec = a.n / VEC;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x * kStreamVecs + threadIdx.x;
  A wv[kStreamVecs][VEC], bv[kStreamVecs][VEC];
#pragma unroll
  for (int k = 0; k < kStreamVecs; ++k) {
    const int64_t i = first + int64_t(k) * blockDim.x;
#pragma unroll
    for (int e = 0; e < VEC; ++e) wv[k][e] = A(1), bv[k][e] = A(0);
    if (i < nvec && a.w) load_params<false, VEC>(a.w + i * VEC, wv[k]);
    if (i < nvec && a.b) load_params<false, VEC>(a.b + i * VEC, bv[k]);
  }
  const auto* aff = reinterpret_cast<const Affine<A>*>(affine);
  for (int64_t row = 0; row < a.rows; ++row) {
    const Affine<A> st = aff[row];
    const V* xv = reinterpret_cast<const V*>(a.x + row * a.x_stride);
    V* yv = reinterpret_cast<V*>(a.y + row * a.n);
    V r[kStreamVecs];
#pragma unroll
    for (int k = 0; k < kStreamVecs; ++k) {
      const int64_t i = first + int64_t(k) * blockDim.x;
      if (i < nvec) r[k] = load_vec<true>(xv + i);
    }
#pragma unroll
    for (int k = 0; k < kStreamVecs; ++k) {
      const int64_t i = first + int64_t(k) * blockDim.x;
      if (i < nvec) {
        A out[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) out[e] = normalized(A(to_acc(r[k].v[e])), st) * wv[k][e] + bv[k][e];
        store_vec(yv + i, pack<T>(out));
      }
    }
  }
}

template <typename T, typename W>
struct StridedArgs {
  const T* x;
  T* y;
  const W* w;
  const W* b;
  int64_t outer, n, inner, x_outer_stride;
  double eps;
  int tx;  // threads along inner; blockDim.x / tx threads along the reduced axis
  int rms;
};

// Combine per-column statistics across the tyn thread rows of a block (a tree in shared memory,
// red holds tyn x cols entries); every thread gets the totals of its VEC columns.
template <typename A, int VEC>
__device__ __forceinline__ void combine_columns(Stats<A>* red, Stats<A> (&s)[VEC], int ty, int tyn, int lane,
                                                int64_t cols, bool rms) {
  __syncthreads();  // red may still be read from the previous tile
#pragma unroll
  for (int e = 0; e < VEC; ++e) red[ty * cols + lane * VEC + e] = s[e];
  __syncthreads();
  for (int half = tyn / 2; half > 0; half >>= 1) {
    if (ty < half) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int64_t idx = ty * cols + lane * VEC + e;
        red[idx] = merge(red[idx], red[idx + half * cols], rms);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int e = 0; e < VEC; ++e) s[e] = red[lane * VEC + e];
}

// Channel-axis kernel for tiles that fit in shared memory: the whole tile (n x tx vectors) is
// copied with cp.async (all loads in flight, few registers), statistics and output come from
// shared memory. Thread (ty, lane) copies, and later reads back, channels ty, ty + tyn, ...
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(256) strided_tile_kernel(StridedArgs<T, W> a, int64_t red_bytes) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* red = reinterpret_cast<Stats<A>*>(smem_raw);  // [tyn][tx * VEC]
  V* tile_buf = reinterpret_cast<V*>(smem_raw + red_bytes);  // [n][tx]
  const bool rms = a.rms;
  const int tx = a.tx, tyn = blockDim.x / tx;
  const int lane = threadIdx.x % tx, ty = threadIdx.x / tx;
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t tiles_per_outer = (a.inner + cols - 1) / cols;
  const int64_t tiles = a.outer * tiles_per_outer;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer;
    const int64_t col = (tile % tiles_per_outer) * cols + int64_t(lane) * VEC;
    const bool active = col < a.inner;
    const T* xo = a.x + o * a.x_outer_stride + (active ? col : 0);
    T* yo = a.y + o * a.n * a.inner + (active ? col : 0);
    if (active) {
      for (int64_t j = ty; j < a.n; j += tyn) {
        const V* src = reinterpret_cast<const V*>(xo + j * a.inner);
        if constexpr (sizeof(V) >= 4) cp_async<int(sizeof(V)), false>(tile_buf + j * tx + lane, src);
        else tile_buf[j * tx + lane] = load_vec<true>(src);
      }
    }
    A shift[VEC];  // channel 0 of each column, shared by all threads of the column
    V first;
    if (active && !rms) first = *reinterpret_cast<const V*>(xo);
    cp_async_wait_all();
    A sum[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      shift[e] = (active && !rms) ? A(to_acc(first.v[e])) : A(0);
      sum[e] = A(0);
    }
    A cnt = A(0);
    if (active) {
      for (int64_t j = ty; j < a.n; j += tyn) {
        const V r = tile_buf[j * tx + lane];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A v = to_acc(r.v[e]) - shift[e];
          sum[e] += rms ? v * v : v;
        }
        cnt += A(1);
      }
    }
    Stats<A> s[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) s[e] = {cnt, A(0), sum[e]};
    if (!rms && cnt > A(0)) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        s[e].mean = sum[e] / cnt;
        s[e].m2 = A(0);
      }
      for (int64_t j = ty; j < a.n; j += tyn) {
        const V r = tile_buf[j * tx + lane];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A d = (to_acc(r.v[e]) - shift[e]) - s[e].mean;
          s[e].m2 += d * d;
        }
      }
    }
    combine_columns(red, s, ty, tyn, lane, cols, rms);
    if (!active) continue;
    Affine<A> st[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) st[e] = finalize(s[e], a.n, a.eps, rms, shift[e]);
    for (int64_t j = ty; j < a.n; j += tyn) {
      const V r = tile_buf[j * tx + lane];
      const A wj = a.w ? A(to_acc(a.w[j])) : A(1);
      const A bj = a.b ? A(to_acc(a.b[j])) : A(0);
      A out[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) out[e] = normalized(A(to_acc(r.v[e])), st[e]) * wj + bj;
      store_vec<false>(reinterpret_cast<V*>(yo + j * a.inner), pack<T>(out));
    }
  }
}

// Channel-axis kernel for tiles too large for shared memory: registers hold kCache channels per
// thread at a time; when n exceeds one chunk, x is read twice.
// One tile = all n reduced elements of tx*VEC consecutive inner positions of one outer index.
// Thread (ty, lane) holds channels ty, ty + tyn, ... (kCache of them per chunk).
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(256, 1) strided_norm_kernel(StridedArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  constexpr int kCache = kCacheOf<T>;
  extern __shared__ unsigned char smem_raw[];
  auto* red = reinterpret_cast<Stats<A>*>(smem_raw);  // [tyn][tx * VEC]
  const bool rms = a.rms;
  const int tx = a.tx, tyn = blockDim.x / tx;
  const int lane = threadIdx.x % tx, ty = threadIdx.x / tx;
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t tiles_per_outer = (a.inner + cols - 1) / cols;
  const int64_t tiles = a.outer * tiles_per_outer;
  const int64_t chunk = int64_t(kCache) * tyn;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer;
    const int64_t col = (tile % tiles_per_outer) * cols + int64_t(lane) * VEC;
    const bool active = col < a.inner;
    const T* xo = a.x + o * a.x_outer_stride + (active ? col : 0);
    T* yo = a.y + o * a.n * a.inner + (active ? col : 0);
    V cache[kCache];
    Stats<A> s[VEC];
    A shift[VEC];  // channel 0 of each column, shared by all threads of the column
    V first;
    if (active && !rms) first = *reinterpret_cast<const V*>(xo);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      s[e] = {A(0), A(0), A(0)};
      shift[e] = (active && !rms) ? A(to_acc(first.v[e])) : A(0);
    }
    const bool once = a.n <= chunk;
    for (int64_t c = 0; c < a.n; c += chunk) {
#pragma unroll
      for (int k = 0; k < kCache; ++k) {
        const int64_t j = c + int64_t(k) * tyn + ty;
        if (active && j < a.n) {
          const V* p = reinterpret_cast<const V*>(xo + j * a.inner);
          cache[k] = once ? load_vec<true>(p) : load_vec<false>(p);
        }
      }
      // Exact per-column statistics of this chunk, merged into the running ones.
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A cnt = A(0), sum = A(0);
#pragma unroll
        for (int k = 0; k < kCache; ++k) {
          if (active && c + int64_t(k) * tyn + ty < a.n) {
            const A v = to_acc(cache[k].v[e]) - shift[e];
            sum += rms ? v * v : v;
            cnt += A(1);
          }
        }
        Stats<A> cs{cnt, A(0), sum};
        if (!rms && cnt > A(0)) {
          const A mean = sum / cnt;
          A m2 = A(0);
#pragma unroll
          for (int k = 0; k < kCache; ++k) {
            if (active && c + int64_t(k) * tyn + ty < a.n) {
              const A d = (to_acc(cache[k].v[e]) - shift[e]) - mean;
              m2 += d * d;
            }
          }
          cs = {cnt, mean, m2};
        }
        s[e] = merge(s[e], cs, rms);
      }
    }
    combine_columns(red, s, ty, tyn, lane, cols, rms);
    Affine<A> st[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) st[e] = finalize(s[e], a.n, a.eps, rms, shift[e]);
    if (!active) continue;
    for (int64_t c = 0; c < a.n; c += chunk) {
      if (!once) {
#pragma unroll
        for (int k = 0; k < kCache; ++k) {
          const int64_t j = c + int64_t(k) * tyn + ty;
          if (j < a.n) cache[k] = load_vec<true>(reinterpret_cast<const V*>(xo + j * a.inner));
        }
      }
#pragma unroll
      for (int k = 0; k < kCache; ++k) {
        const int64_t j = c + int64_t(k) * tyn + ty;
        if (j < a.n) {
          const A wj = a.w ? A(to_acc(a.w[j])) : A(1);
          const A bj = a.b ? A(to_acc(a.b[j])) : A(0);
          A out[VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            out[e] = normalized(A(to_acc(cache[k].v[e])), st[e]) * wj + bj;
          }
          store_vec(reinterpret_cast<V*>(yo + j * a.inner), pack<T>(out));
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Planner and launchers.

struct Device {
  int sms = 0;
  int coop = 0;
  int major = 0;  // compute capability; clusters need 9 (Hopper) or later
  int smem_optin = 0;  // shared memory a block may ask for
};

static Device device_info() {
  static Device cache[64];
  int dev = 0;
  cudaGetDevice(&dev);
  Device& d = cache[dev & 63];
  if (d.sms == 0) {
    cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev);
    cudaDeviceGetAttribute(&d.coop, cudaDevAttrCooperativeLaunch, dev);
    cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  }
  return d;
}

static int pow2_at_least(int64_t v) {
  int p = 1;
  while (p < v && p < (1 << 30)) p <<= 1;
  return p;
}

static bool aligned16(const void* p) { return p == nullptr || (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

static int elem_size(int dtype) { return dtype == FN_F64 ? 8 : dtype == FN_F32 ? 4 : 2; }

// Vector width of the last-dim kernels: 16 bytes when every pointer and row start allows it.
static int row_vec(const NormParams& p) {
  const int vec = 16 / elem_size(p.dtype);
  const bool ok = aligned16(p.x) && aligned16(p.y) && aligned16(p.weight) && aligned16(p.bias) &&
                  p.n % vec == 0 && p.x_outer_stride % vec == 0;
  return ok ? vec : 1;
}

// Tuning overrides are hints: round to a power of two the kernels support.
static int threads_hint(const NormParams& p, int lo) {
  if (p.threads <= 0) return 0;
  int t = lo;
  while (t * 2 <= p.threads && t * 2 <= kMaxRowThreads) t *= 2;
  return t;
}

static int split_threads(const NormParams& p) {
  const int t = threads_hint(p, 32);
  return t > 0 ? t : kMaxRowThreads;
}

constexpr int64_t kRowCacheBytes = 96 << 10;  // row kernel: shared memory for a block's rows, at most
constexpr int64_t kSliceBytes = 64 << 10;     // split kernel: target slice per block
constexpr int64_t kMaxSmem = 200 << 10;       // dynamic shared memory opt-in limit we ask for

// Blocks per row wanted for a last-dim call (1: row kernel). Rows whose cache would not fit a block
// are split; so are the rows of a few-row call, to spread them over the whole chip.
static int64_t wanted_blocks_per_row(const NormParams& p, int sms) {
  if (p.blocks_per_row > 0) return p.blocks_per_row;
  const int64_t row_bytes = p.n * elem_size(p.dtype);
  const bool few_rows = p.outer < sms;
  if (row_bytes <= kRowCacheBytes && !(few_rows && row_bytes >= (64 << 10))) return 1;
  int64_t g = (row_bytes + kSliceBytes - 1) / kSliceBytes;
  if (few_rows) {
    const int64_t spread = (int64_t(sms) * 2) / p.outer, min_slice = row_bytes / (16 << 10);
    const int64_t want = spread < min_slice ? spread : min_slice;
    if (want > g) g = want;
  }
  return g;
}

constexpr int64_t kStreamRowBytes = 4 << 20;  // rows from 4 MB up, fewer than the SMs: resident or streamed
constexpr int64_t kStreamChunkVec = 4096;    // vectors per partial-statistics block
constexpr int64_t kResidentRowBytes = 8 << 20;  // the resident kernel's rows in one group, at least
// Rows too short for the resident kernel, at least this many: the split kernel instead (H100, same
// process: fp32 64x1048576 LN 60 -> 63% of copy, RMS 61 -> 75; 100x1048576 62 -> 66, 63 -> 75.5;
// bf16 32x2097152 56 -> 58.5, 58.5 -> 68). With 1-8 rows the streamed kernels, which spread a row
// over the whole chip, stay ahead (fp32 4x1800000 LN 47 against 30%).
constexpr int64_t kSplitRows = 32;
// Rows of a call, at least, for two groups of the resident kernel (see resident_groups).
constexpr int64_t kGroupedRows = 2;

// Few long rows: the resident kernel where it takes them, else the three streamed kernels.
static bool streamed_rows(const NormParams& p, int sms) {
  const int64_t row_bytes = p.n * elem_size(p.dtype);
  return p.blocks_per_row <= 0 && row_bytes >= kStreamRowBytes && p.outer < sms &&
         !(p.outer >= kSplitRows && row_bytes < kResidentRowBytes);
}

// Workspace of the resident kernel: an arrival counter per row group (kResidentHeader bytes), then
// the partial moments of every block, double-buffered.
constexpr int64_t kResidentHeader = int64_t(kMaxResidentGroups) * kArrivalStride * 4;
static int64_t grid_rows_workspace(int sms) { return kResidentHeader + 2 * int64_t(sms) * int64_t(sizeof(RowMoments)); }

// Workspace of the streamed path: partial statistics [rows][chunks], then per-row Affine.
static int64_t stream_chunks(const NormParams& p, int vec) { return (p.n / vec + kStreamChunkVec - 1) / kStreamChunkVec; }

// Shared memory above 48 KB must be asked for once per kernel.
template <typename Kernel>
static void allow_smem(Kernel kernel) {
  cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                       int(kMaxSmem));
}

// Cluster kernel (H100 measurements: benchmarks/NOTES.md): slices of at most 64 KB, 512 threads,
// three blocks an SM, and twice as many clusters as are resident. Rows longer than 8 such slices go
// to the split kernel: 16-block clusters and 128 KB slices both measured slower.
constexpr int64_t kClusterSliceBytes = 64 << 10;
constexpr int kClusterWaves = 2;

// Blocks per cluster for a last-dim call, 0 when the cluster kernel does not suit it: rows short
// enough for the row kernel, too long for 8 slices of shared memory, or too few to fill the chip
// (the split kernel spreads those wider). Tuning overrides address the row and split kernels.
static int cluster_blocks(const NormParams& p, const Device& dev) {
  if (dev.major < 9 || p.blocks_per_row > 0 || p.threads > 0) return 0;
  const int64_t row_bytes = p.n * elem_size(p.dtype);
  if (row_bytes <= kRowCacheBytes) return 0;
  int g = 2;
  while (g < kMaxCluster && row_bytes > g * kClusterSliceBytes) g *= 2;
  if ((row_bytes + g - 1) / g > kClusterSliceBytes || p.outer * g < dev.sms) return 0;
  return g;
}

template <typename T, typename W, int VEC>
static void configure_cluster_kernel() {
  static bool done = false;
  if (done) return;
  allow_smem(cluster_row_norm_kernel<T, W, VEC>);
  done = true;
}

static cudaLaunchConfig_t cluster_config(int clusters, int g, size_t smem, cudaStream_t stream,
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
static int cluster_capacity(const NormParams& p, int g, size_t smem) {
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

static size_t cluster_smem(const NormParams& p, int g, int vec) {
  const int64_t slice_vec = (p.n / vec + g - 1) / g;
  return size_t(slice_vec) * size_t(vec) * size_t(elem_size(p.dtype));
}

// Blocks per cluster if this call runs on the cluster kernel, else 0.
static int cluster_plan(const NormParams& p, const Device& dev, int vec) {
  const int g = cluster_blocks(p, dev);
  return g > 0 && cluster_capacity(p, g, cluster_smem(p, g, vec)) > 0 ? g : 0;
}

// How a last-dim call is run. g == 1: row kernel, else split kernel with `slots` rows in flight.
struct RowPlan {
  int tpr, threads, g, slots, grid;
  int64_t cache_vec;  // shared-memory vectors per row (row kernel) or per slice (split); 0: none
  size_t smem;
  bool more_blocks;   // row kernel: the 4-blocks-an-SM budget (kCachedRowBlocks)
};

template <typename T, typename W, int VEC>
static RowPlan plan_rows(const NormParams& p) {
  using V = Vec<T, VEC>;
  const Device dev = device_info();
  const int64_t nvec = p.n / VEC;
  int64_t g = wanted_blocks_per_row(p, dev.sms);
  if (g > 1 && dev.coop) {
    static bool smem_allowed = false;
    if (!smem_allowed) allow_smem(split_slice_kernel<T, W, VEC>), smem_allowed = true;
    const int threads = split_threads(p);
    int64_t slice = (nvec + g - 1) / g;
    size_t smem = size_t(slice) * sizeof(V);
    if (int64_t(smem) > kMaxSmem) smem = 0;
    int per_sm = 0;
    if (smem) cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_slice_kernel<T, W, VEC>, threads, smem);
    if (int64_t(per_sm) * dev.sms < g) {  // too many slices to be resident: no cache, read x twice
      smem = 0;
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_row_norm_kernel<T, W, VEC>, threads, 0);
    }
    const int64_t resident = int64_t(per_sm) * dev.sms;
    if (resident >= 1) {
      if (g > resident) g = resident;
      int64_t slots = resident / g;
      if (slots > p.outer) slots = p.outer;
      return RowPlan{threads, threads, int(g), int(slots), int(slots * g), smem ? slice : 0, smem, false};
    }
  }
  // Vectors per thread: 4 (H100: best of 2, 4, 8 on rows of 2-32 KB, fp32 and bf16); a call with
  // fewer rows than SMs is latency-bound: one vector per thread (up to 512 threads), so each
  // thread waits for one round of loads, not several.
  const int64_t per_thread = p.outer < dev.sms ? 1 : 4;
  int tpr = p.threads > 0 ? threads_hint(p, 1) : pow2_at_least((nvec + per_thread - 1) / per_thread);
  if (tpr > kMaxRowThreads) tpr = kMaxRowThreads;
  const int threads = tpr >= 256 ? tpr : 256;
  const int64_t rows_per_block = threads / tpr;
  const int64_t cache_bytes = rows_per_block * nvec * int64_t(sizeof(V));
  const int64_t cache_vec = cache_bytes <= kRowCacheBytes ? nvec : 0;
  if (cache_vec) {
    static bool smem_allowed = false;
    if (!smem_allowed) {
      allow_smem(row_norm_kernel<T, W, VEC, true>);
      if constexpr (kCachedRowBlocks<T, W, true> != kCachedRowBlocks<T, W, false>) allow_smem(row_norm_kernel<T, W, VEC, true, true>);
      smem_allowed = true;
    }
  }
  const bool whole_block_row = threads == kMaxRowThreads && tpr == threads && nvec == per_thread * tpr;
  const bool more_blocks = kCachedRowBlocks<T, W, true> != kCachedRowBlocks<T, W, false> && !whole_block_row;
  const int64_t blocks = (p.outer + rows_per_block - 1) / rows_per_block;
  // Blocks beyond what is resident queue up, but smaller blocks leave a shorter tail: a cap of 32
  // blocks per SM (two row batches per block at 65536x1024) measured 1-2 points slower than 256.
  const int64_t cap = int64_t(dev.sms) * 256;
  return RowPlan{tpr, threads, 1, 0, int(blocks < cap ? blocks : cap), cache_vec,
                 size_t(cache_vec ? cache_bytes : 0), more_blocks};
}

template <typename T, typename W, int VEC>
static const char* launch_streamed(const NormParams& p, cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  const int64_t chunks = stream_chunks(p, VEC);
  const int64_t need = p.outer * chunks * int64_t(sizeof(Stats<A>)) + p.outer * int64_t(sizeof(Affine<A>));
  if (p.workspace == nullptr || p.workspace_bytes < need) return "streamed-rows workspace missing or too small";
  void* partials = p.workspace;
  void* affine = static_cast<unsigned char*>(p.workspace) + p.outer * chunks * int64_t(sizeof(Stats<A>));
  const T* x = static_cast<const T*>(p.x);
  stream_stats_kernel<T, VEC><<<dim3(unsigned(chunks), unsigned(p.outer)), kStreamThreads, 0, stream>>>(
      x, p.n, p.x_outer_stride, kStreamChunkVec, p.rms, partials);
  stream_finalize_kernel<T><<<unsigned(p.outer), kStreamThreads, 0, stream>>>(x, p.n, p.x_outer_stride, int(chunks),
                                                                               p.eps, p.rms, partials, affine);
  RowArgs<T, W> a{x, static_cast<T*>(p.y), static_cast<const W*>(p.weight), static_cast<const W*>(p.bias),
                  p.outer, p.n, p.x_outer_stride, p.eps, 0, p.rms};
  const int64_t per_block = int64_t(kStreamThreads) * kStreamVecs;
  const int64_t blocks = (p.n / VEC + per_block - 1) / per_block;
  stream_apply_kernel<T, W, VEC><<<unsigned(blocks), kStreamThreads, 0, stream>>>(a, affine);
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <typename T, typename W, int VEC>
static const char* launch_cluster(const NormParams& p, int g, cudaStream_t stream) {
  configure_cluster_kernel<T, W, VEC>();
  const size_t smem = cluster_smem(p, g, VEC);
  const int64_t slice_vec = int64_t(smem / sizeof(Vec<T, VEC>));
  // Persistent clusters, each striding over the rows.
  int64_t clusters = cluster_capacity(p, g, smem);
  clusters *= kClusterWaves;
  if (clusters > p.outer) clusters = p.outer;
  RowArgs<T, W> a{static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
                  static_cast<const W*>(p.bias), p.outer, p.n, p.x_outer_stride, p.eps, kClusterThreads, p.rms};
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_config(int(clusters), g, smem, stream, &attr);
  const cudaError_t err = cudaLaunchKernelEx(&cfg, cluster_row_norm_kernel<T, W, VEC>, a, slice_vec);
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// Resident blocks of `kernel` per SM at `threads` threads and `smem` bytes, asked of the driver once
// per configuration and device.
static int blocks_per_sm(const void* kernel, int threads, size_t smem) {
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

// Resident rows: vectors per thread (1..8; 0 when the call does not suit the kernel), parameter
// slots in shared memory, how the next row is staged (kStage*), and row groups. A next-row buffer
// takes room from the parameters; it is kept when the parameters this pushes out (re-read from L2
// every row) stay within kResidentL2Params, else the next row is prefetched into L2 (Hopper's bulk
// prefetch); with a buffer, rows of up to kResidentL2AheadBytes (counting both groups' rows) also
// have the row after next prefetched. Measured on H100 (benchmarks/NOTES.md "resident2"), the
// kernel in one group beats the streamed one from rows of 8 MB on (16x4194304 fp32: LN 307 -> 290
// us, RMS 251 -> 219; bf16 166 -> 157, 156 -> 134), and loses on 4 MB rows (fp32 64x1048576: 300
// -> 372 us): each row's statistics, block reductions and grid barrier sit on one critical path, a
// fixed cost per row that long rows amortize, and which two groups overlap (resident_groups).
struct ResidentPlan {
  int k, smem_slots, prefetch, groups;
  size_t smem;
};
constexpr int64_t kResidentL2Params = 8 << 20;
constexpr int64_t kResidentL2AheadBytes = 12 << 20;

// Vectors of x a thread holds, at most: 8 (32 registers) for 4-byte types; 2-byte types (which
// widen 8 elements a vector) and float64 spill at 8 under the 64-register cap.
constexpr int resident_max_k(int elem_bytes) { return elem_bytes == 4 ? 8 : 4; }

// Row groups of the resident kernel for a last-dim call (0: the kernel does not take it): two groups
// of half the SMs for rows of 4 MB up that fit them, in any call of 2+ rows; one group for longer
// rows of 8 MB up that fit the chip, however many (calls of as many rows as SMs went to the split
// kernel: fp32 200x4194304 LN 19 -> 74% of copy, RMS 30 -> 88; 140x3000000 34 -> 70, 47 -> 89;
// bf16 200x4194304 39.5 -> 66, 57 -> 78; H100, same process). One group for 2-byte rows of 5-8 MB
// measured mixed (bf16 16x3000000 RMS 54 -> 63.6, 64x2500000 67 -> 59.5): they stay on the split
// and streamed kernels. Two groups against what took these rows before (H100,
// benchmarks/results/h100-row-groups.txt, % of copy LN / RMS): fp32 64x1048576 split slices 62.5 /
// 74 -> 75 / 81; 160x2097152 split 39 / 55 -> 77 / 90; 16x1048576 streamed 51 / 54 -> 67 / 74;
// 32x2097152 one group 73 / 80 -> 75 / 86.5; bf16 32x2097152 split 57.5 / 67 -> 66 / 74-79. Rows of
// 2 MB (2 vectors a thread in two groups) measured slower than the split kernel (fp32 128x524288 LN
// 80 -> 57%, bf16 64x1048576 71 -> 48).
static int resident_groups(const NormParams& p, const Device& dev, int vec) {
  if (!dev.coop || dev.sms > kResidentThreads || vec == 1 || p.blocks_per_row > 0) return 0;
  const int64_t row_bytes = p.n * elem_size(p.dtype);
  const int64_t per_sm = int64_t(kResidentThreads) * resident_max_k(elem_size(p.dtype)) * vec;  // elements an SM holds
  if (row_bytes >= kStreamRowBytes && p.outer >= kGroupedRows && p.n <= (dev.sms / 2) * per_sm) return 2;
  return row_bytes >= kResidentRowBytes && p.n <= dev.sms * per_sm ? 1 : 0;
}

// The kernel for K vectors a thread and G groups; two groups hold rows of 4 MB up, at least 4
// vectors a thread, so only those are built.
template <typename T, typename W, int VEC, int G>
static const void* resident_kernel_of(int k) {
  if (k == 8) {
    if constexpr (resident_max_k(sizeof(T)) >= 8) return reinterpret_cast<const void*>(resident_row_norm_kernel<T, W, VEC, 8, G>);
    return nullptr;
  }
  if (k == 4) return reinterpret_cast<const void*>(resident_row_norm_kernel<T, W, VEC, 4, G>);
  if constexpr (G == 1) {
    if (k == 2) return reinterpret_cast<const void*>(resident_row_norm_kernel<T, W, VEC, 2, G>);
    if (k == 1) return reinterpret_cast<const void*>(resident_row_norm_kernel<T, W, VEC, 1, G>);
  }
  return nullptr;
}

template <typename T, typename W, int VEC>
static const void* resident_kernel(int k, int groups) {
  return groups == 2 ? resident_kernel_of<T, W, VEC, 2>(k) : resident_kernel_of<T, W, VEC, 1>(k);
}

template <typename T, typename W, int VEC>
static ResidentPlan resident_plan(const NormParams& p, const Device& dev) {
  const ResidentPlan none{0, 0, 0, 0, 0};
  const int groups = resident_groups(p, dev, VEC);
  if (groups == 0) return none;
  const int64_t threads = int64_t(dev.sms / groups) * kResidentThreads;
  const int k = pow2_at_least((p.n / VEC + threads - 1) / threads);
  const int64_t slot_bytes = int64_t(kResidentThreads) * int64_t(sizeof(ParamVec<W, VEC>));
  const int64_t buffer_bytes = int64_t(k) * kResidentThreads * int64_t(sizeof(Vec<T, VEC>));
  const int64_t budget = int64_t(dev.smem_optin) - (2 << 10);  // room for the kernel's static arrays
  const int64_t wanted = int64_t(k) * ((p.weight ? 1 : 0) + (p.bias ? 1 : 0));
  auto slots_within = [&](int64_t bytes) { return bytes > 0 ? std::min(wanted, bytes / slot_bytes) : int64_t(0); };
  const int64_t spilled = (wanted - slots_within(budget - buffer_bytes)) * slot_bytes * (dev.sms / groups);
  // Two groups stage two rows at once: with 8 MB rows, the next rows in L2 and no buffer (fp32
  // 32x2097152 RMS 82 -> 87%, against a buffer and the rows after them in L2).
  const bool l2_ahead = p.n * elem_size(p.dtype) * groups <= kResidentL2AheadBytes;
  const bool buffer = p.outer > groups && budget >= buffer_bytes && spilled <= kResidentL2Params && (groups == 1 || l2_ahead);
  const bool l2 = dev.major >= 9 && p.outer > groups && (!buffer || l2_ahead);
  const int prefetch = (buffer ? kStageShared : 0) | (l2 ? kStageL2 : 0);
  const int64_t slots = slots_within(buffer ? budget - buffer_bytes : budget);
  const size_t smem = size_t(slots * slot_bytes + (buffer ? buffer_bytes : 0));
  const void* kernel = resident_kernel<T, W, VEC>(k, groups);
  if (kernel == nullptr) return none;
  static bool smem_allowed[8] = {false, false, false, false, false, false, false, false};
  const int which = (k == 1 ? 0 : k == 2 ? 1 : k == 4 ? 2 : 3) + 4 * (groups - 1);
  if (!smem_allowed[which]) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget));
    smem_allowed[which] = true;
  }
  if (blocks_per_sm(kernel, kResidentThreads, smem) < 1) return none;
  return ResidentPlan{k, int(slots), prefetch, groups, smem};
}

template <typename T, typename W, int VEC>
static const char* launch_resident(const NormParams& p, const ResidentPlan& plan, cudaStream_t stream) {
  const Device dev = device_info();
  if (p.workspace == nullptr || p.workspace_bytes < grid_rows_workspace(dev.sms)) return "resident-rows workspace missing or too small";
  SplitWorkspace ws{static_cast<unsigned int*>(p.workspace), static_cast<unsigned char*>(p.workspace) + kResidentHeader};
  RowArgs<T, W> a{static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
                  static_cast<const W*>(p.bias), p.outer, p.n, p.x_outer_stride, p.eps, kResidentThreads, p.rms};
  int slots = plan.smem_slots, prefetch = plan.prefetch;
  void* args[] = {&a, &slots, &prefetch, &ws};
  const unsigned grid = unsigned(dev.sms / plan.groups * plan.groups);
  const cudaError_t err = cudaLaunchCooperativeKernel(resident_kernel<T, W, VEC>(plan.k, plan.groups), dim3(grid),
                                                      dim3(kResidentThreads), args, plan.smem, stream);
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <typename T, typename W, int VEC>
static const char* launch_few_rows(const NormParams& p, cudaStream_t stream) {
  const int threads = std::max(32, pow2_at_least(p.n / VEC));
  RowArgs<T, W> a{static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
                  static_cast<const W*>(p.bias), p.outer, p.n, p.x_outer_stride, p.eps, threads, p.rms};
  if (p.rms) {
    few_rows_kernel<T, W, VEC, true><<<unsigned(p.outer), threads, 0, stream>>>(a);
  } else {
    few_rows_kernel<T, W, VEC, false><<<unsigned(p.outer), threads, 0, stream>>>(a);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <typename T, typename W, int VEC>
static const char* launch_rows(const NormParams& p, cudaStream_t stream) {
  const Device dev = device_info();
  if constexpr (VEC > 1) {
    const ResidentPlan resident = resident_plan<T, W, VEC>(p, dev);
    if (resident.k > 0) return launch_resident<T, W, VEC>(p, resident, stream);
  }
  if (streamed_rows(p, dev.sms)) return launch_streamed<T, W, VEC>(p, stream);
  const int g = cluster_plan(p, dev, VEC);
  if (g > 0) return launch_cluster<T, W, VEC>(p, g, stream);
  if (p.outer < dev.sms && p.n / VEC <= kFewRowsThreads && p.threads <= 0) return launch_few_rows<T, W, VEC>(p, stream);
  const RowPlan plan = plan_rows<T, W, VEC>(p);
  RowArgs<T, W> a{static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
                  static_cast<const W*>(p.bias), p.outer, p.n, p.x_outer_stride, p.eps, plan.tpr, p.rms};
  if (plan.grid == 0) return nullptr;
  if (plan.g == 1) {
    if (plan.cache_vec) {
      if constexpr (kCachedRowBlocks<T, W, true> != kCachedRowBlocks<T, W, false>) {
        if (plan.more_blocks) row_norm_kernel<T, W, VEC, true, true><<<plan.grid, plan.threads, plan.smem, stream>>>(a, plan.cache_vec);
      }
      if (!plan.more_blocks) {
        row_norm_kernel<T, W, VEC, true><<<plan.grid, plan.threads, plan.smem, stream>>>(a, plan.cache_vec);
      }
    } else {
      row_norm_kernel<T, W, VEC, false><<<plan.grid, plan.threads, 0, stream>>>(a, 0);
    }
  } else {
    using A = typename AccOf<T>::type;
    const int64_t need = int64_t(plan.slots) * 16 + int64_t(2) * plan.slots * plan.g * sizeof(Stats<A>);
    if (p.workspace == nullptr || p.workspace_bytes < need) return "split-row workspace missing or too small";
    SplitWorkspace ws{static_cast<unsigned int*>(p.workspace),
                      static_cast<unsigned char*>(p.workspace) + int64_t(plan.slots) * 16};
    int g = plan.g, slots = plan.slots;
    void* args[] = {&a, &g, &slots, &ws};
    const void* kernel = plan.cache_vec ? reinterpret_cast<const void*>(split_slice_kernel<T, W, VEC>)
                                        : reinterpret_cast<const void*>(split_row_norm_kernel<T, W, VEC>);
    cudaError_t err = cudaLaunchCooperativeKernel(kernel, dim3(plan.grid), dim3(plan.threads), args, plan.smem, stream);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

// Channel tiles (H100, same-process A/B against 32 lanes in 64 KB): up to 64 lanes of 16 bytes, so a
// tile reads 1 KB runs of each channel row and reduces over 4 thread rows instead of 8, in up to
// 96 KB of shared memory when there are at most 64 channels (bf16 LayerNorm 112x64x512x512: 75.7 ->
// 88.2% of copy, 8x32x224x224 36 -> 53%; fp32 RMSNorm seed 94.4 -> 95.1%; fp32 32x64x128x128 LN
// -1.5 points). More channels keep 64 KB: wider tiles in 96 KB cost them 1-15 points (fewer blocks
// an SM: 16x256x64x64 fp32 LN 80 -> 65%).
constexpr int64_t kTileBytes = 64 << 10;
constexpr int64_t kWideTileBytes = 96 << 10;
constexpr int64_t kWideTileChannels = 64;
constexpr int kTileLanes = 64;

template <typename T, typename W, int VEC>
static const char* launch_strided(const NormParams& p, cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  const Device dev = device_info();
  const int64_t inner_vec = (p.inner + VEC - 1) / VEC;
  const int threads = 256;
  const int64_t lanes = pow2_at_least(inner_vec);
  int tx = int(std::min<int64_t>(lanes, 32));
  const int64_t red_bytes = int64_t(threads) * VEC * sizeof(Stats<A>);  // tyn * tx * VEC entries
  // Widest tile (up to kTileLanes lanes of 16 bytes) whose n x tx vectors fit the shared-memory budget.
  const int64_t budget = p.n <= kWideTileChannels ? kWideTileBytes : kTileBytes;
  int tile_tx = int(std::min<int64_t>(lanes, kTileLanes));
  while (tile_tx > 4 && red_bytes + p.n * tile_tx * int64_t(sizeof(V)) > budget) tile_tx /= 2;
  const bool tiled = red_bytes + p.n * tile_tx * int64_t(sizeof(V)) <= budget;
  if (tiled) {
    tx = tile_tx;
  } else {
    // Narrower tiles, more threads along the reduced axis, until it fits the register cache.
    while (tx > 4 && int64_t(threads / tx) * kCacheOf<T> < p.n) tx /= 2;
  }
  StridedArgs<T, W> a{static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
                      static_cast<const W*>(p.bias), p.outer, p.n, p.inner, p.x_outer_stride, p.eps, tx, p.rms};
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t tiles = p.outer * ((p.inner + cols - 1) / cols);
  const int64_t cap = int64_t(dev.sms) * 64;
  const int grid = int(tiles < cap ? tiles : cap);
  if (tiled) {
    static bool smem_allowed = false;
    if (!smem_allowed) allow_smem(strided_tile_kernel<T, W, VEC>), smem_allowed = true;
    const size_t smem = size_t(red_bytes + p.n * tx * int64_t(sizeof(V)));
    strided_tile_kernel<T, W, VEC><<<grid, threads, smem, stream>>>(a, red_bytes);
  } else {
    strided_norm_kernel<T, W, VEC><<<grid, threads, size_t(red_bytes), stream>>>(a);
  }
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <typename T, typename W>
static const char* dispatch_layout(const NormParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (p.inner == 1) return row_vec(p) > 1 ? launch_rows<T, W, kVec>(p, stream) : launch_rows<T, W, 1>(p, stream);
  const bool vec_ok = aligned16(p.x) && aligned16(p.y) && p.inner % kVec == 0 && p.x_outer_stride % kVec == 0;
  return vec_ok ? launch_strided<T, W, kVec>(p, stream) : launch_strided<T, W, 1>(p, stream);
}

template <typename T>
static const char* dispatch_weight(const NormParams& p, cudaStream_t stream) {
  if (p.wdtype == FN_NONE || p.wdtype == p.dtype) return dispatch_layout<T, T>(p, stream);
  if (p.wdtype == FN_F32) return dispatch_layout<T, float>(p, stream);
  return "weight dtype must match the input or be float32";
}

}  // namespace fastnorm

int64_t fastnorm_cuda_workspace_bytes(const NormParams& p) {
  using namespace fastnorm;
  if (p.inner != 1 || p.outer == 0 || p.n == 0) return 0;
  const Device dev = device_info();
  // The resident kernel's, and enough for the kernels taking the call if it does not launch.
  const int64_t resident = resident_groups(p, dev, row_vec(p)) > 0 ? grid_rows_workspace(dev.sms) : 0;
  if (streamed_rows(p, dev.sms)) {
    const int64_t streamed = p.outer * stream_chunks(p, row_vec(p)) * int64_t(sizeof(Stats<double>)) +
                             p.outer * int64_t(sizeof(Affine<double>));
    return std::max(streamed, resident);
  }
  if (!dev.coop || wanted_blocks_per_row(p, dev.sms) <= 1 || cluster_plan(p, dev, row_vec(p)) > 0) return resident;
  // Bound for any split plan: every resident block may own a slot (a 16-byte counter) and writes
  // two partial statistics (double-buffered).
  const int64_t max_blocks = int64_t(dev.sms) * (2048 / split_threads(p) + 1);
  return std::max(resident, max_blocks * 16 + 2 * max_blocks * int64_t(sizeof(Stats<double>)));
}

const char* fastnorm_cuda_forward(const NormParams& p, void* stream_ptr) {
  using namespace fastnorm;
  if (p.outer == 0 || p.n == 0 || p.inner == 0) return nullptr;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  switch (p.dtype) {
    case FN_F32: return dispatch_weight<float>(p, stream);
    case FN_F16: return dispatch_weight<__half>(p, stream);
    case FN_BF16: return dispatch_weight<__nv_bfloat16>(p, stream);
    case FN_F64:
      if (p.wdtype != FN_NONE && p.wdtype != FN_F64) return "float64 input needs float64 weight";
      return dispatch_layout<double, double>(p, stream);
    default: return "unsupported dtype";
  }
}
