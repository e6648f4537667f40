// The streamed kernels: a few rows of many megabytes in three barrier-free kernels; their launcher.
#pragma once
#include "cuda_launch.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int64_t kStreamChunkVec = 4096;    // vectors per partial-statistics block

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

// Workspace of the streamed path: partial statistics [rows][chunks], then per-row Affine.
static inline int64_t stream_chunks(const NormParams& p, int vec) { return (p.n / vec + kStreamChunkVec - 1) / kStreamChunkVec; }

template <typename T, typename W, int VEC>
static inline const char* launch_streamed(const NormParams& p, cudaStream_t stream) {
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
  return launch_result(err);
}

}  // namespace fastnorm
