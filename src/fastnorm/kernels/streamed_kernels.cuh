// The streamed kernels: few rows in two or three barrier-free launches (no cooperative launch, no
// zeroed workspace); their launcher.
#pragma once
#include "cuda_launch.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int64_t kStreamChunkVec = 4096;    // vectors per partial-statistics block, at most
constexpr int64_t kStreamMinChunkVec = 512;  // ... and at least, where fewer blocks than SMs would take a call

// Streamed rows: (1) partial statistics of row chunks, (2) per-row totals (a launch of its own, or
// merged by every block of (3) where they are few: kStreamFusedPartials), (3) the output. In (3)
// either each block owns a column chunk, keeps its weight and bias in registers and sweeps every
// row (rows of many megabytes: the parameters are read once, where a row-at-a-time kernel would
// re-read them for every row), or a block takes one row's column chunk (calls of a few MB whose
// sweep would leave SMs idle). x is read twice; in calls of a few MB the second read comes from L2.
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

// A row's affine map from its `chunks` partials, merged by the whole block in a fixed order (every
// block that merges them gets the same bits); valid in thread 0.
template <typename T, typename A = typename AccOf<T>::type>
__device__ __forceinline__ Affine<A> stream_row_affine(const T* x, int64_t row, int64_t n, int64_t x_stride, int chunks,
                                                       double eps, int rms, const void* partials, Stats<A>* red) {
  const auto* part = reinterpret_cast<const Stats<A>*>(partials) + row * chunks;
  Stats<A> s{A(0), A(0), A(0)};
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) s = merge(s, part[i], rms);
  s = group_reduce(s, blockDim.x, rms, red);
  return finalize(s, n, eps, rms, rms ? A(0) : A(to_acc(x[row * x_stride])));
}

// The finalize launch's map of a row (rows of more partials than threads): the same merges in the same order, a
// thread's partials loaded kStreamMergeLoads at a time and LayerNorm's shift first, where a load beside each merge
// made a thread's loads wait in turn (bf16 1x2784270 RMS: 2.00 -> 1.64 us, H200).
constexpr int kStreamMergeLoads = 4;
template <typename T, typename A = typename AccOf<T>::type>
__device__ __forceinline__ Affine<A> stream_row_affine_batched(const T* x, int64_t row, int64_t n, int64_t x_stride,
                                                               int chunks, double eps, int rms, const void* partials,
                                                               Stats<A>* red) {
  const auto* part = reinterpret_cast<const Stats<A>*>(partials) + row * chunks;
  const A shift = rms ? A(0) : A(to_acc(x[row * x_stride]));
  Stats<A> s{A(0), A(0), A(0)};
  for (int i0 = threadIdx.x; i0 < chunks; i0 += kStreamMergeLoads * blockDim.x) {
    Stats<A> got[kStreamMergeLoads];
#pragma unroll
    for (int u = 0; u < kStreamMergeLoads; ++u) {
      if (i0 + u * int(blockDim.x) < chunks) got[u] = part[i0 + u * int(blockDim.x)];
    }
#pragma unroll
    for (int u = 0; u < kStreamMergeLoads; ++u) {
      if (i0 + u * int(blockDim.x) < chunks) s = merge(s, got[u], rms);
    }
  }
  s = group_reduce(s, blockDim.x, rms, red);
  return finalize(s, n, eps, rms, shift);
}

template <typename T>
__global__ void __launch_bounds__(kStreamThreads) stream_finalize_kernel(const T* x, int64_t n, int64_t x_stride,
                                                                         int chunks, double eps, int rms,
                                                                         const void* partials, void* affine) {
  using A = typename AccOf<T>::type;
  __shared__ Stats<A> red[32];
  const Affine<A> st = stream_row_affine_batched(x, blockIdx.x, n, x_stride, chunks, eps, rms, partials, red);
  if (threadIdx.x == 0) reinterpret_cast<Affine<A>*>(affine)[blockIdx.x] = st;
}

// The finalize step inside the apply kernel: a block merges the partials of each of its rows into
// shared memory.
template <typename T>
__device__ __forceinline__ const Affine<typename AccOf<T>::type>* stream_affines_in_block(
    const T* x, int64_t rows, int64_t n, int64_t x_stride, int chunks, double eps, int rms, const void* partials,
    unsigned char* smem) {
  using A = typename AccOf<T>::type;
  __shared__ Stats<A> red[32];
  auto* aff = reinterpret_cast<Affine<A>*>(smem);
  for (int64_t row = 0; row < rows; ++row) {
    const Affine<A> st = stream_row_affine(x, row, n, x_stride, chunks, eps, rms, partials, red);
    if (threadIdx.x == 0) aff[row] = st;
    __syncthreads();  // red is reused by the next row
  }
  return aff;
}

// gridDim.y == 1: block x owns column chunk x of every row; else block (x, y) takes column chunk x of
// row y. The rows' maps: from stream_finalize_kernel (affine), or kFused: the block takes them from the
// `chunks` partials itself (dynamic shared memory of a map a row it takes; compiled apart, so that the
// kernel without the merge keeps its registers: 40 against 46 in fp16).
template <typename T, typename W, int VEC, bool kFused>
__global__ void __launch_bounds__(kStreamThreads) stream_apply_kernel(RowArgs<T, W> a, const void* affine,
                                                                      const void* partials, int chunks) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  // A block of one row sees a call of that row alone. (A row range taken from blockIdx.y raised the
  // registers from 34 to 66 in fp16, and fp16 4x9592278, which sweeps, from 134 to 146 us.)
  if (gridDim.y > 1) {
    a.x += blockIdx.y * a.x_stride;
    a.y += blockIdx.y * a.n;
    a.rows = 1;
    if (kFused) partials = reinterpret_cast<const Stats<A>*>(partials) + int64_t(blockIdx.y) * chunks;
    else affine = reinterpret_cast<const Affine<A>*>(affine) + blockIdx.y;
  }
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
  // (Loading x before the merge, to hide it, spilled in the 16-byte bfloat16 kernel.)
  const Affine<A>* aff = kFused ? stream_affines_in_block(a.x, a.rows, a.n, a.x_stride, chunks, a.eps, a.rms, partials,
                                                          dyn_smem)
                                : reinterpret_cast<const Affine<A>*>(affine);
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

// Scalar rows (VEC 1: odd n, misaligned rows) as 16-byte granules. Element by element, a warp's load moved
// 64 bytes (2-byte types) and an apply block 1024 elements, 4 a thread, each with its own parameter loads:
// bf16 1x2784270 RMS took 18.7 us against torch.compile's 14.9 (H200). Statistics block b of a row takes the
// chunk / E granules b * chunk / E ... of x's 16-byte grid (elements outside the row masked), all loaded at
// once (U a thread); the output is written in y's grid, a 16-byte chunk a thread (store_granule_chunks: x's
// granules, now mostly in L2, and the parameters' read and realigned). One row a block in the output: rows
// start at their own offsets.
template <typename T>
__global__ void __launch_bounds__(kStreamThreads) stream_granule_stats_kernel(const T* x, int64_t n, int64_t x_stride,
                                                                              int64_t chunk, int rms, void* partials) {
  using A = typename AccOf<T>::type;
  constexpr int E = 16 / int(sizeof(T));
  constexpr int U = int(kStreamChunkVec / kStreamThreads) / E;  // a block's granules at the largest chunk, a thread
  __shared__ Stats<A> red[32];
  const int64_t row = blockIdx.y;
  const T* xr = x + row * x_stride;
  const A shift = rms ? A(0) : A(to_acc(xr[0]));
  const int off = int(reinterpret_cast<uintptr_t>(xr) & 15) / int(sizeof(T));
  const uint4* xg = reinterpret_cast<const uint4*>(xr - off);
  const int64_t granules = (off + n + E - 1) / E, g0 = int64_t(blockIdx.x) * (chunk / E);
  const int64_t g1 = g0 + chunk / E < granules ? g0 + chunk / E : granules;
  A v[U][E];
  int64_t i0[U];  // the row index of each granule's element 0 (n: no granule)
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t g = g0 + threadIdx.x + int64_t(u) * kStreamThreads;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (g < g1) raw = xg[g];
    i0[u] = g < g1 ? g * E - off : n;
    widen(reinterpret_cast<const Vec<T, E>*>(&raw)->v, v[u]);
  }
  auto in = [&](int u, int e) { return i0[u] + e >= 0 && i0[u] + e < n; };
  // The thread's exact statistics about the shift (two passes over the registers).
  A cnt = A(0), sum = A(0);
#pragma unroll
  for (int u = 0; u < U; ++u) {
#pragma unroll
    for (int e = 0; e < E; ++e) {
      const A d = v[u][e] - shift;
      cnt += in(u, e) ? A(1) : A(0);
      sum += in(u, e) ? (rms ? d * d : d) : A(0);
    }
  }
  Stats<A> s{cnt, A(0), sum};
  if (!rms && cnt > A(0)) {
    const A mean = sum / cnt;
    A m2 = A(0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int e = 0; e < E; ++e) {
        const A d = (v[u][e] - shift) - mean;
        m2 += in(u, e) ? d * d : A(0);
      }
    }
    s = {cnt, mean, m2};
  }
  s = group_reduce(s, blockDim.x, rms, red);
  if (threadIdx.x == 0) reinterpret_cast<Stats<A>*>(partials)[row * gridDim.x + blockIdx.x] = s;
}

// Block (x, y): chunks x * kStreamThreads ... of row y's output, a chunk a thread. kFused: the block merges the
// row's `chunks` partials itself.
template <typename T, typename W, bool kFused>
__global__ void __launch_bounds__(kStreamThreads) stream_granule_apply_kernel(RowArgs<T, W> a, const void* affine,
                                                                              const void* partials, int chunks) {
  using A = typename AccOf<T>::type;
  constexpr int E = 16 / int(sizeof(T));
  const int64_t row = blockIdx.y, c0 = int64_t(blockIdx.x) * kStreamThreads;
  const T* xr = a.x + row * a.x_stride;
  T* yr = a.y + row * a.n;
  {  // The block's x and parameters into L2 while it waits for its row's map (a round trip less for small calls).
    const int64_t off_y = int64_t(reinterpret_cast<uintptr_t>(yr) & 15) / int64_t(sizeof(T));
    const int64_t lo = c0 * E - off_y > 0 ? c0 * E - off_y : 0;
    const int64_t hi = (c0 + kStreamThreads) * E - off_y < a.n ? (c0 + kStreamThreads) * E - off_y : a.n;
    if (hi > lo) {
      prefetch_l2(xr + lo, (hi - lo) * int64_t(sizeof(T)));
      if (a.w) prefetch_l2(a.w + lo, (hi - lo) * int64_t(sizeof(W)));
      if (a.b) prefetch_l2(a.b + lo, (hi - lo) * int64_t(sizeof(W)));
    }
  }
  Affine<A> st;
  if constexpr (kFused) {
    __shared__ Stats<A> red[32];
    __shared__ Affine<A> row_st;
    const Affine<A> merged = stream_row_affine(a.x, row, a.n, a.x_stride, chunks, a.eps, a.rms, partials, red);
    if (threadIdx.x == 0) row_st = merged;
    __syncthreads();
    st = row_st;
  } else {
    st = reinterpret_cast<const Affine<A>*>(affine)[row];
  }
  store_granule_chunks<int64_t>(reinterpret_cast<const Vec<T, 1>*>(xr), yr, a.n, a.w, a.b, st, a.rms, c0 + threadIdx.x,
                                c0 + kStreamThreads, int64_t(kStreamThreads));
}

// Column chunks of the apply kernel (a block's vectors: kStreamThreads x kStreamVecs).
static inline int64_t stream_column_blocks(const NormParams& p, int vec) {
  const int64_t per_block = int64_t(kStreamThreads) * kStreamVecs;
  return (p.n / vec + per_block - 1) / per_block;
}

// The apply kernel takes one row's chunk a block where sweeping every row would leave SMs idle.
static inline bool stream_by_row(const NormParams& p, int vec, int sms) {
  return p.outer > 1 && stream_column_blocks(p, vec) < sms;
}

// Partials an apply block merges itself, at most (one a thread), instead of a finalize launch. H100:
// one row of 40-90 partials 1.3-2.4 us faster fused (fp32 1x238830 13.1 -> 11.4 us, bf16 1x366452
// 13.9 -> 11.5), rows of 424-680 partials 1.2-2.8 us slower (fp32 1x1734971 26.5 -> 29.4, bf16
// 1x2784270 25.0 -> 26.2): 2-3 merges a thread in each of 1700-2700 blocks. FASTNORM_STREAM_FUSE=0
// (read at each call, for A/B runs) keeps the launch.
constexpr int64_t kStreamFusedPartials = kStreamThreads;

// Vectors of a partial-statistics block: kStreamChunkVec, halved (down to kStreamMinChunkVec) while
// the call would have fewer such blocks than SMs. (Doubled, up to 16384, where that let each output
// block merge its partials itself: fp32 1x1734971 27.1 -> 30.8 us, bf16 1x2784270 23.6 -> 28.3, since
// each of its 1700-2700 output blocks then merges up to 256 partials.)
static inline int64_t stream_chunk_vec(const NormParams& p, int vec, int sms) {
  int64_t chunk = kStreamChunkVec;
  while (chunk > kStreamMinChunkVec && p.outer * ((p.n / vec + chunk - 1) / chunk) < sms) chunk /= 2;
  return chunk;
}

// Partial-statistics blocks of a row: its vectors in chunks; scalar rows, the granules of x's 16-byte grid that
// hold a row at its worst offset, chunk / E a block (stream_granule_stats_kernel: the element path takes no more).
static inline int64_t stream_chunks(const NormParams& p, int vec, int64_t chunk) {
  if (vec > 1) return (p.n / vec + chunk - 1) / chunk;
  const int64_t e = 16 / elem_size(p.dtype), granules = (p.n + 2 * e - 2) / e, per_block = chunk / e;
  return (granules + per_block - 1) / per_block;
}

// Workspace of the streamed path: partial statistics [rows][chunks], then per-row Affine. Every byte
// read is written first in the same call: it needs no zeroing.
static inline int64_t stream_workspace_bytes(const NormParams& p, int vec, int sms, int acc_bytes) {
  const int64_t chunk = stream_chunk_vec(p, vec, sms), chunks = stream_chunks(p, vec, chunk);
  return p.outer * chunks * 3 * acc_bytes + p.outer * 3 * acc_bytes;  // Stats<A> and Affine<A>: 3 values each
}

template <typename T, typename W, int VEC>
static inline const char* launch_streamed(const NormParams& p, int sms, cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  const int64_t chunk_vec = stream_chunk_vec(p, VEC, sms);
  const int64_t need = stream_workspace_bytes(p, VEC, sms, int(sizeof(A)));
  if (p.workspace == nullptr || p.workspace_bytes < need) return "streamed-rows workspace missing or too small";
  void* partials = p.workspace;
  const T* x = static_cast<const T*>(p.x);
  const bool by_row = stream_by_row(p, VEC, sms);
  // Scalar rows in granules (FASTNORM_STREAM_GRANULES=0, read at each call, for A/B runs: element by element),
  // the output a row at a time: not where blocks sweep several rows holding their parameters.
  const bool granules = VEC == 1 && (by_row || p.outer == 1) && env_int("FASTNORM_STREAM_GRANULES", 1) != 0;
  const int64_t chunks = granules ? stream_chunks(p, VEC, chunk_vec) : (p.n / VEC + chunk_vec - 1) / chunk_vec;
  void* affine = static_cast<unsigned char*>(p.workspace) + p.outer * chunks * int64_t(sizeof(Stats<A>));
  if (granules) {
    stream_granule_stats_kernel<T><<<dim3(unsigned(chunks), unsigned(p.outer)), kStreamThreads, 0, stream>>>(
        x, p.n, p.x_outer_stride, chunk_vec, p.rms, partials);
  } else {
    stream_stats_kernel<T, VEC><<<dim3(unsigned(chunks), unsigned(p.outer)), kStreamThreads, 0, stream>>>(
        x, p.n, p.x_outer_stride, chunk_vec, p.rms, partials);
  }
  const int64_t rows_a_block = by_row ? 1 : p.outer;
  const bool fused = rows_a_block * chunks <= kStreamFusedPartials && env_int("FASTNORM_STREAM_FUSE", 1) != 0;
  if (!fused) {
    stream_finalize_kernel<T><<<unsigned(p.outer), kStreamThreads, 0, stream>>>(x, p.n, p.x_outer_stride, int(chunks),
                                                                                 p.eps, p.rms, partials, affine);
  }
  RowArgs<T, W> a = row_args<T, W>(p, 0);  // (no statistics saved: launch_rows answers such calls before)
  if (granules) {
    const int64_t out_chunks = (p.n * int64_t(sizeof(T)) + 15 + 15) / 16;  // y's chunks at its worst offset
    const dim3 rows_grid(unsigned((out_chunks + kStreamThreads - 1) / kStreamThreads), unsigned(p.outer));
    if (fused) {
      stream_granule_apply_kernel<T, W, true><<<rows_grid, kStreamThreads, 0, stream>>>(a, nullptr, partials, int(chunks));
    } else {
      stream_granule_apply_kernel<T, W, false><<<rows_grid, kStreamThreads, 0, stream>>>(a, affine, nullptr, 0);
    }
    return launch_result(cudaGetLastError());
  }
  const dim3 grid(unsigned(stream_column_blocks(p, VEC)), by_row ? unsigned(p.outer) : 1u);
  const size_t smem = size_t(rows_a_block) * sizeof(Affine<A>);
  if (fused) {
    stream_apply_kernel<T, W, VEC, true><<<grid, kStreamThreads, smem, stream>>>(a, nullptr, partials, int(chunks));
  } else {
    stream_apply_kernel<T, W, VEC, false><<<grid, kStreamThreads, 0, stream>>>(a, affine, nullptr, 0);
  }
  const cudaError_t err = cudaGetLastError();
  return launch_result(err);
}

}  // namespace fastnorm
