// Shared by the last-dim kernels (inner == 1): the call's arguments, per-dtype register budgets,
// the uncached (RowSlice) and cached (shared-memory) row helpers, a block's slice of a row split over
// several blocks (BlockSlice), and the per-row barrier through global memory of the split kernels.
#pragma once
#include "cuda_launch.cuh"
#include "cuda_stats.cuh"

namespace fastnorm {

constexpr int kMaxRowThreads = 512;  // block size of the row and split kernels, at most
constexpr int64_t kRowCacheBytes = 96 << 10;  // row kernel: shared memory for a block's rows, at most
constexpr int64_t kSliceBytes = 64 << 10;     // split kernel: target slice per block
// A call giving the SMs fewer blocks each than this is latency-bound: the row and offset-row kernels then
// give a row more threads (planner.cuh plan_rows, offset_rows_kernel.cuh launch_offset_rows).
constexpr int64_t kRowFillBlocks = 2;

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
  void* stats;  // [rows][3] accumulator-type affine maps to save, or null (row, offset-row, thread-row kernels)
};

// The row kernels' arguments of a call; tpr: threads a row, as the kernel reads it.
template <typename T, typename W>
static inline RowArgs<T, W> row_args(const NormParams& p, int tpr) {
  return {static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
          static_cast<const W*>(p.bias), p.outer, p.n, p.x_outer_stride, p.eps, tpr, p.rms, p.stats};
}

// A launch of a grid-striding row kernel whose only argument is the call's RowArgs: `blocks` blocks of
// `threads`, at most 2^31 - 1.
template <typename T, typename W>
static inline const char* launch_row_grid(const void* kernel, const NormParams& p, int tpr, int threads, int64_t blocks,
                                          cudaStream_t stream) {
  constexpr int64_t kMaxGrid = (int64_t(1) << 31) - 1;
  RowArgs<T, W> a = row_args<T, W>(p, tpr);
  void* args[] = {&a};
  return launch_result(cudaLaunchKernel(kernel, dim3(unsigned(blocks < kMaxGrid ? blocks : kMaxGrid)), dim3(threads),
                                        args, 0, stream));
}

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
// Whether (T, W) has a 4-blocks instance at all (else kMore changes nothing and is not built). In
// parentheses: the solver's pruner (reachable.py) reads top-level commas as declarators.
template <typename T, typename W>
constexpr bool kCachedRowHasMore = (kCachedRowBlocks<T, W, true> != kCachedRowBlocks<T, W, false>);

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

  // Vectors of x loaded together: half the unroll (the merge needs registers); 16 bytes of a scalar
  // row's elements (8 of 2 bytes, 4 floats), whose loads would otherwise wait for each other.
  static constexpr int kBatch = sizeof(V) < 8 ? 16 / int(sizeof(V)) : kUnroll > 1 ? kUnroll / 2 : 1;

  // Exact statistics of each batch, merged.
  __device__ __forceinline__ Stats<A> stats(const V* xv, bool rms, A shift) {
    Stats<A> s{A(0), A(0), A(0)};
    for (int64_t base = v0 + t; base < v1; base += int64_t(kBatch) * tpr) {
      V r[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t i = base + int64_t(u) * tpr;
        if (i < v1) r[u] = load_vec<false>(xv + i);
      }
      s = merge(s, thread_stats<A>(r, base, tpr, v1, rms, shift), rms);
    }
    return s;
  }

  // One vector at a time: the parameters it needs take registers, and latency is hidden by the
  // other rows in flight on the SM rather than by unrolling. Parameters are relative to v0.
  // Scalar rows load a batch of x and parameters first: one element's worth of loads in flight
  // does not hide it.
  template <bool kKeep, typename W>
  __device__ __forceinline__ void apply(const V* xv, V* yv, const W* w, const W* b, const Affine<A>& st) {
    if constexpr (sizeof(V) < 8) {
      for (int64_t base = v0 + t; base < v1; base += int64_t(kBatch) * tpr) {
        V r[kBatch];
        A wv[kBatch][VEC], bv[kBatch][VEC];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int64_t i = base + int64_t(u) * tpr;
          if (i < v1) {
            r[u] = load_vec<true>(xv + i);
            if (w) load_params<kKeep, VEC>(w + (i - v0) * VEC, wv[u]);
            if (b) load_params<kKeep, VEC>(b + (i - v0) * VEC, bv[u]);
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int64_t i = base + int64_t(u) * tpr;
          if (i < v1) store_vec<kEvictFirst>(yv + i, normalize_with(r[u], st, w != nullptr, wv[u], b != nullptr, bv[u]));
        }
      }
    } else {
#pragma unroll 2
      for (int64_t i = v0 + t; i < v1; i += tpr) {
        store_vec<kEvictFirst>(yv + i, normalize_vec<kKeep, A>(load_vec<true>(xv + i), st, w, b, (i - v0) * VEC));
      }
    }
  }
};

// Normalizes and stores the `count` cached vectors t, t + tpr, ... of a row (tpr = 1 << sh). One
// loop per case of the template flags (kCenter: LayerNorm, else RMSNorm; kW, kB: weight, bias)
// keeps the checks out of the loop; ncu counted ~20 instructions a vector for them before.
// (Prefetching the next vector's parameters into L1 measured 3-37 points slower, H100.)
// Scalar rows (vectors under 8 bytes) load the parameters of two elements before they use the first
// (4 spilled in the 32 registers of the 4-blocks row kernel, in a build that also batched the copies
// of x into the cache, which measured slower). H100, against one at a time: bf16 512x100001 LN 206 -> 172 us, fp16
// 2000x20001 RMS 116 -> 104, 11x22150 LN 28.7 -> 23.6 (benchmarks/results/h100-long-scalar-rows.txt).
template <bool kCenter, bool kW, bool kB, bool kEvictFirst, int kCount, typename A, typename T, typename W, int VEC>
__device__ __forceinline__ void store_cached_row(const Vec<T, VEC>* cache, Vec<T, VEC>* yv, const W* w, const W* b,
                                                 const Affine<A>& st, int t, int sh, int count) {
  if constexpr (kCount > 0) count = kCount;  // a count known at compile time: a loop without remainder
  if constexpr (sizeof(Vec<T, VEC>) < 8) {
    constexpr int kStoreBatch = 2;
#pragma unroll 1
    for (int k0 = 0; k0 < count; k0 += kStoreBatch) {
      A wv[kStoreBatch][VEC], bv[kStoreBatch][VEC];
#pragma unroll
      for (int u = 0; u < kStoreBatch; ++u) {
        const int i = t + ((k0 + u) << sh);
        if (k0 + u < count) {
          if constexpr (kW) load_params<false, VEC>(w + int64_t(i) * VEC, wv[u]);
          if constexpr (kB) load_params<false, VEC>(b + int64_t(i) * VEC, bv[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kStoreBatch; ++u) {
        const int i = t + ((k0 + u) << sh);
        if (k0 + u < count) store_vec<kEvictFirst>(yv + i, normalize_with(cache[i], st, kW, wv[u], kB, bv[u], kCenter));
      }
    }
  } else {
#pragma unroll 1
    for (int k = 0; k < count; ++k) {
      const int i = t + (k << sh);
      A wv[VEC], bv[VEC];
      if constexpr (kW) load_params<false, VEC>(w + int64_t(i) * VEC, wv);
      if constexpr (kB) load_params<false, VEC>(b + int64_t(i) * VEC, bv);
      store_vec<kEvictFirst>(yv + i, normalize_with(cache[i], st, kW, wv, kB, bv, kCenter));
    }
  }
}

// store_cached_row for the call's case (kCount > 0: every thread holds exactly kCount vectors).
template <bool kEvictFirst, int kCount = 0, typename A, typename T, typename W, int VEC>
__device__ __forceinline__ void store_own_vectors(const Vec<T, VEC>* cache, Vec<T, VEC>* yv, const W* w, const W* b,
                                             const Affine<A>& st, int t, int sh, int count, bool rms) {
  if (rms && !b) {  // (RMSNorm's affine map has center 0 and offset 0: the general loops serve too)
    if (w) store_cached_row<false, true, false, kEvictFirst, kCount>(cache, yv, w, b, st, t, sh, count);
    else store_cached_row<false, false, false, kEvictFirst, kCount>(cache, yv, w, b, st, t, sh, count);
  } else if (w && b) {
    store_cached_row<true, true, true, kEvictFirst, kCount>(cache, yv, w, b, st, t, sh, count);
  } else if (w) {
    store_cached_row<true, true, false, kEvictFirst, kCount>(cache, yv, w, b, st, t, sh, count);
  } else if (b) {
    store_cached_row<true, false, true, kEvictFirst, kCount>(cache, yv, w, b, st, t, sh, count);
  } else {
    store_cached_row<true, false, false, kEvictFirst, kCount>(cache, yv, w, b, st, t, sh, count);
  }
}

// Copies a thread's vectors t + (k << sh), k < count, of xv into the cache and waits for them
// (cp.async; plain loads for vectors under 4 bytes). A thread reads back only its own copies: no
// barrier needed.
template <bool kEvictFirst, int kK = 0, bool kExact = false, typename T, int VEC>
__device__ __forceinline__ void cache_own_vectors(Vec<T, VEC>* cache, const Vec<T, VEC>* xv, int t, int sh, int count) {
  if constexpr (kK > 0) {
    static_assert(sizeof(Vec<T, VEC>) >= 4, "count bounds are for vectors of 4 bytes and more");
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      if (kExact || k < count) cp_async<int(sizeof(Vec<T, VEC>)), kEvictFirst>(cache + t + (k << sh), xv + t + (k << sh));
    }
    cp_async_wait_all();
  } else if constexpr (sizeof(Vec<T, VEC>) >= 4) {
    for (int k = 0; k < count; ++k) cp_async<int(sizeof(Vec<T, VEC>)), kEvictFirst>(cache + t + (k << sh), xv + t + (k << sh));
    cp_async_wait_all();
  } else {
    for (int k = 0; k < count; ++k) cache[t + (k << sh)] = xv[t + (k << sh)];
  }
}

// Scalar rows (VEC 1: odd n, or rows off a 16-byte boundary): the 16-byte granules of global memory
// that hold the row's n elements are copied whole (cp.async, 16 bytes a copy: 2-byte rows took one
// synchronous load an element, 4-byte rows one copy an element), element 0 landing at byte x & 15 of
// the cache, whose first element it returns. The granules' bytes outside the row lie in the row's
// allocation (allocations are 16-byte aligned). The group's threads share the granules, hence the
// barriers: before (the previous row may still be read) and after. The whole block must call it.
template <typename V, typename T>
__device__ __forceinline__ V* cache_row_granules(V* cache, const T* x, int64_t n, int t, int tpr) {
  const int off = int(reinterpret_cast<uintptr_t>(x) & 15);
  const uint4* src = reinterpret_cast<const uint4*>(reinterpret_cast<const char*>(x) - off);
  const int chunks = n > 0 ? int((off + n * int64_t(sizeof(T)) + 15) >> 4) : 0;
  uint4* dst = reinterpret_cast<uint4*>(cache);
  __syncthreads();
  for (int c = t; c < chunks; c += tpr) cp_async<16, false>(dst + c, src + c);
  cp_async_wait_all();
  __syncthreads();
  return reinterpret_cast<V*>(reinterpret_cast<char*>(cache) + off);
}

// The output of a scalar row, chunks first, first + step, ... (below end; !kEnd: to the last) of the up to n + 1 that
// hold it in y's 16-byte grid, the first and last partly outside the row; x0: the row's element 0 in the row cache
// (cache_row_granules) or in global memory (the streamed kernels). An inner chunk reads its x values as the 16 bytes
// that hold them (two granules realigned where x's and y's rows start at other offsets in their 16 bytes), its
// parameters likewise (two 16-byte loads, realigned; parameters of x's size only), and stores 16 bytes: a store for E
// elements where the element pass took E. Every granule read holds an element of the row, so it lies in the row's
// allocation. The two edge chunks go element by element. I: the index type (int64_t for rows of 2^31 elements and
// more). (The chunk count computed after the addresses cost the granule-row kernels registers: float32 K = 4 48 -> 57,
// 4 blocks of 256 an SM instead of 5, RMS 28532x3938 at an offset 250 -> 271 us.)
template <typename I, bool kEnd = true, typename A, typename T, typename W>
__device__ __forceinline__ void store_granule_chunks(const Vec<T, 1>* x0v, T* y, I n, const W* w, const W* b,
                                                     const Affine<A>& st, bool rms, I first, I end, I step) {
  constexpr int E = 16 / int(sizeof(T));
  constexpr bool kVecParams = sizeof(W) == sizeof(T);
  const T* x0 = reinterpret_cast<const T*>(x0v);
  const int off_y = int(reinterpret_cast<uintptr_t>(y) & 15) / int(sizeof(T));
  const I chunks = n > 0 ? (I(off_y) + n + E - 1) / E : I(0), stop = kEnd && end < chunks ? end : chunks;
  // Chunk c holds the row's elements c * E - off_y ...: in x at xc + 16 c, in the parameters at wc + 16 c
  // (byte addresses), each read as its two 16-byte granules and realigned.
  const uintptr_t xc = reinterpret_cast<uintptr_t>(x0) - uintptr_t(off_y) * sizeof(T);
  const uintptr_t wc = reinterpret_cast<uintptr_t>(w) - uintptr_t(off_y) * sizeof(W);  // (read only where w is given)
  const uintptr_t bc = reinterpret_cast<uintptr_t>(b) - uintptr_t(off_y) * sizeof(W);
  const int sx = int(xc & 15), sw = int(wc & 15), sb = int(bc & 15);
  const uint4* xg = reinterpret_cast<const uint4*>(xc - sx);
  const uint4* wg = reinterpret_cast<const uint4*>(wc - sw);
  const uint4* bg = reinterpret_cast<const uint4*>(bc - sb);
  auto granules = [](const uint4* g, I c, int s) { return s ? realigned(g[c], g[c + 1], s) : g[c]; };
  for (I c = first; c < stop; c += step) {
    const I i0 = c * E - off_y;
    if (i0 >= 0 && i0 + E <= n) {
      const uint4 xr = granules(xg, c, sx);
      A v[E];
      widen(reinterpret_cast<const Vec<T, E>*>(&xr)->v, v);
#pragma unroll
      for (int e = 0; e < E; ++e) v[e] = rms ? v[e] * st.rstd : normalized(v[e], st);
      // The parameters one after the other, converted as used (at the 32-40 register budgets of the
      // row kernel, converted arrays of both spilled).
      if (w) {
        if constexpr (kVecParams) {
          const uint4 r = granules(wg, c, sw);
          const W* p = reinterpret_cast<const Vec<W, E>*>(&r)->v;
#pragma unroll
          for (int e = 0; e < E; ++e) v[e] *= A(to_acc(p[e]));
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) v[e] *= A(to_acc(w[i0 + e]));
        }
      }
      if (b) {
        if constexpr (kVecParams) {
          const uint4 r = granules(bg, c, sb);
          const W* p = reinterpret_cast<const Vec<W, E>*>(&r)->v;
#pragma unroll
          for (int e = 0; e < E; ++e) v[e] += A(to_acc(p[e]));
        } else {
#pragma unroll
          for (int e = 0; e < E; ++e) v[e] += A(to_acc(b[i0 + e]));
        }
      }
      store_vec<false>(reinterpret_cast<Vec<T, E>*>(y + i0), pack<T>(v));
    } else {
      for (int e = 0; e < E; ++e) {
        const I i = i0 + e;
        if (i < 0 || i >= n) continue;
        A v = A(to_acc(x0[i]));
        v = rms ? v * st.rstd : normalized(v, st);
        if (w) v *= A(to_acc(w[i]));
        if (b) v += A(to_acc(b[i]));
        y[i] = from_acc<T>(v);
      }
    }
  }
}

// The output of a scalar row cached as granules (x0: its element 0 in the cache, cache_row_granules), in y's
// 16-byte grid: thread t takes chunks t, t + tpr, ... (store_granule_chunks).
template <typename A, typename T, typename W>
__device__ __forceinline__ void store_granule_row(const Vec<T, 1>* x0v, T* y, int n, const W* w, const W* b,
                                                  const Affine<A>& st, bool rms, int t, int tpr) {
  store_granule_chunks<int, false>(x0v, y, n, w, b, st, rms, t, 0, tpr);
}

// Passes over a thread's cached vectors t + (k << sh), k < count (kK > 0: count is at most kK, exactly
// kK with kExact, the loop unrolled whole), for the plain-sum statistics: sum of x * scale (scale = 1 / n:
// a rough mean that cannot overflow near FLT_MAX), sum of x * x, and the sums of d = x - c and d * d
// about a rough mean c.
template <int kK, bool kExact, typename F>
__device__ __forceinline__ void for_own_vectors(int count, F&& step) {
  if constexpr (kK > 0) {
#pragma unroll
    for (int k = 0; k < kK; ++k) {
      if (kExact || k < count) step(k);
    }
  } else {
#pragma unroll 2
    for (int k = 0; k < count; ++k) step(k);
  }
}

template <int kK = 0, bool kExact = false, typename A, typename T, int VEC>
__device__ __forceinline__ A cached_scaled_sum(const Vec<T, VEC>* cache, int t, int sh, int count, A scale) {
  A s = A(0);
  for_own_vectors<kK, kExact>(count, [&](int k) {
    A vals[VEC];
    widen(cache[t + (k << sh)].v, vals);
#pragma unroll
    for (int e = 0; e < VEC; ++e) s = fma(vals[e], scale, s);
  });
  return s;
}

template <typename A, int kK = 0, bool kExact = false, typename T, int VEC>
__device__ __forceinline__ A cached_square_sum(const Vec<T, VEC>* cache, int t, int sh, int count) {
  A s = A(0);
  for_own_vectors<kK, kExact>(count, [&](int k) {
    A vals[VEC];
    widen(cache[t + (k << sh)].v, vals);
#pragma unroll
    for (int e = 0; e < VEC; ++e) s = fma(vals[e], vals[e], s);
  });
  return s;
}

template <int kK = 0, bool kExact = false, typename A, typename T, int VEC>
__device__ __forceinline__ void cached_deviation_sums(const Vec<T, VEC>* cache, int t, int sh, int count, A c,
                                                      A (&out)[2]) {
  A sd = A(0), sdd = A(0);
  for_own_vectors<kK, kExact>(count, [&](int k) {
    A vals[VEC];
    widen(cache[t + (k << sh)].v, vals);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const A d = vals[e] - c;
      sd += d;
      sdd = fma(d, d, sdd);
    }
  });
  out[0] = sd;
  out[1] = sdd;
}

// A block's fixed column slice [v0, v1) of every row it handles (cluster and split-slice kernels),
// m vectors, n_b elements; each thread owns vectors t + (k << sh) of it (blockDim a power of two).
// `stats` returns the statistics of the slice its kernel copied into the cache as (count, mean relative
// to `shift`, M2) from plain sums (a rough mean, then the corrected two-pass sums): the partials the
// kernels merge with Chan's formula. Its block reductions alternate the two `sums` buffers (see
// group_sums); `buf` is the next one. `store` normalizes the cached slice and writes it.
template <typename A, typename T, typename W, int VEC>
struct BlockSlice {
  using V = Vec<T, VEC>;
  V* cache;  // the slice's element 0 (slices of granules: within the block's shared memory)
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

  // For a block with one row to normalize: its parameters are first read in the store, after the row's
  // barrier, from DRAM, so they are fetched into L2 while the slice loads (H100, session 24). Blocks
  // with more rows find them in L2 from the second row on; the prefetch cost those 2-3.5% (session 23).
  __device__ __forceinline__ void prefetch_params() const {
    const int64_t bytes = int64_t(m) * VEC * int64_t(sizeof(W));
    if (w) prefetch_l2(w, bytes);
    if (b) prefetch_l2(b, bytes);
  }

  __device__ __forceinline__ Stats<A> stats(const RowArgs<T, W>& a, A shift, A (*sums)[64], int& buf) {
    const bool rms = a.rms;
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

// Split rows: `g` blocks per row, `slots` rows in flight; block `blockIdx.x` works on slot
// blockIdx.x / g, slice blockIdx.x % g, for rows slot, slot + slots, ... (one wave each).
struct SplitWorkspace {
  unsigned int* arrivals;  // per slot, grows by g every wave
  void* partials;          // [2][slots][g] Stats, double-buffered by wave parity
};

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

}  // namespace fastnorm
