// The backward of last-dim rows too long for one block (or unaligned rows too long for the row
// backward's scalar path), in three kernels: (1) moments of row chunks (x, dy read), (2) per-row
// coefficients, (3) column tiles that sweep a range of rows: dx, and dweight / dbias summed in
// registers for the tile's columns (x, dy read again), one partial per row range.
#pragma once
#include "backward_common.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int kLongBackwardThreads = 256;
constexpr int64_t kLongBackwardChunkVec = 4096;  // vectors per moments block
constexpr int kLongBackwardRowBatch = 4;         // rows whose loads a thread has in flight at once

// S1, S2, G, GD of one chunk (see coeffs_from_moments), in double.
struct ChunkMoments {
  double s1, s2, g, gd;
};

// Block b: chunk b % chunks of row b / chunks.
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kLongBackwardThreads) long_backward_moments_kernel(BackwardArgs<T, W> a,
                                                                                     int64_t chunks,
                                                                                     ChunkMoments* out) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  __shared__ double red[4][32];
  const int64_t row = blockIdx.x / chunks, chunk = blockIdx.x % chunks, nvec = a.n / VEC;
  const int64_t v0 = chunk * kLongBackwardChunkVec, v1 = min(nvec, v0 + kLongBackwardChunkVec);
  const T* xr = a.x + row * a.x_stride;
  const V* xv = reinterpret_cast<const V*>(xr);
  const V* gv = reinterpret_cast<const V*>(a.dy + row * a.n);
  const double s = a.rms ? 0.0 : double(to_acc(xr[0]));
  double m[4] = {0.0, 0.0, 0.0, 0.0};
  for (int64_t i = v0 + threadIdx.x; i < v1; i += blockDim.x) {
    A xs[VEC], gs[VEC], wv[VEC];
    widen(load_vec<false>(xv + i).v, xs);
    widen(load_vec<false>(gv + i).v, gs);
    if (a.w) load_params<false, VEC>(a.w + i * VEC, wv);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      const double d = double(xs[e]) - s, g = a.w ? double(gs[e] * wv[e]) : double(gs[e]);
      m[0] += d;
      m[1] = fma(d, d, m[1]);
      m[2] += g;
      m[3] = fma(g, d, m[3]);
    }
  }
  group_sums(m, blockDim.x, &red[0][0]);
  if (threadIdx.x == 0) out[blockIdx.x] = ChunkMoments{m[0], m[1], m[2], m[3]};
}

template <typename T>
__global__ void __launch_bounds__(kLongBackwardThreads) long_backward_coeffs_kernel(
    const T* x, int64_t x_stride, int64_t n, int chunks, double eps, int rms, const ChunkMoments* moments,
    GradCoeffs<typename AccOf<T>::type>* coeffs) {
  using A = typename AccOf<T>::type;
  __shared__ double red[4][32];
  const int64_t row = blockIdx.x;
  double m[4] = {0.0, 0.0, 0.0, 0.0};
  for (int i = threadIdx.x; i < chunks; i += blockDim.x) {
    const ChunkMoments& c = moments[row * chunks + i];
    m[0] += c.s1, m[1] += c.s2, m[2] += c.g, m[3] += c.gd;
  }
  group_sums(m, blockDim.x, &red[0][0]);
  if (threadIdx.x == 0) {
    const double s = rms ? 0.0 : double(to_acc(x[row * x_stride]));
    coeffs[row] = coeffs_from_moments<A>(s, m[0], m[1], m[2], m[3], n, eps, rms);
  }
}

// Block (c, r): columns [c * blockDim * VEC, ...) of rows [r * rows_per_part, ...), one vector a
// thread, kLongBackwardRowBatch rows' loads in flight; its dweight / dbias sums go to partial r.
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kLongBackwardThreads) long_backward_apply_kernel(
    BackwardArgs<T, W> a, int64_t rows_per_part, const GradCoeffs<typename AccOf<T>::type>* coeffs) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  constexpr int R = kLongBackwardRowBatch;
  const int64_t nvec = a.n / VEC, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nvec) return;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_part, r1 = min(a.outer, r0 + rows_per_part);
  A wv[VEC], dw[VEC], db[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) wv[e] = A(1), dw[e] = A(0), db[e] = A(0);
  if (a.w) load_params<false, VEC>(a.w + i * VEC, wv);
  for (int64_t row = r0; row < r1; row += R) {
    V xr[R], gr[R];
#pragma unroll
    for (int u = 0; u < R; ++u) {
      if (row + u < r1) {
        xr[u] = load_vec<true>(reinterpret_cast<const V*>(a.x + (row + u) * a.x_stride) + i);
        gr[u] = load_vec<true>(reinterpret_cast<const V*>(a.dy + (row + u) * a.n) + i);
      }
    }
#pragma unroll
    for (int u = 0; u < R; ++u) {
      if (row + u >= r1) break;
      const GradCoeffs<A> co = coeffs[row + u];
      A xs[VEC], gs[VEC], out[VEC];
      widen(xr[u].v, xs);
      widen(gr[u].v, gs);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A xhat;
        out[e] = grad_input(xs[e], gs[e] * wv[e], co, xhat);
        dw[e] = fma(gs[e], xhat, dw[e]);
        db[e] += gs[e];
      }
      if (a.dx) {
        add_gradient(a.dx_add ? a.dx_add + (row + u) * a.n : nullptr, i, out);
        store_vec(reinterpret_cast<V*>(a.dx + (row + u) * a.n) + i, pack<T>(out));
      }
    }
  }
  Vec<A, VEC> sums;
#pragma unroll
  for (int e = 0; e < VEC; ++e) sums.v[e] = dw[e];
  if (a.dw_part) store_acc_vec(static_cast<A*>(a.dw_part) + blockIdx.y * a.n + i * VEC, sums);
#pragma unroll
  for (int e = 0; e < VEC; ++e) sums.v[e] = db[e];
  if (a.db_part) store_acc_vec(static_cast<A*>(a.db_part) + blockIdx.y * a.n + i * VEC, sums);
}

// Row ranges (partials) of the apply kernel: enough blocks for two waves, at least 8 rows a range.
static inline int64_t long_backward_parts(const NormBackwardParams& p, int vec) {
  const Device dev = device_info();
  const int64_t col_blocks = (p.n / vec + kLongBackwardThreads - 1) / kLongBackwardThreads;
  int64_t parts = (int64_t(dev.sms) * 16 + col_blocks - 1) / col_blocks;  // ~16 blocks of 256 an SM
  const int64_t most = (p.outer + 7) / 8;
  return std::max<int64_t>(1, std::min(parts, most));
}

static inline int64_t long_backward_chunks(const NormBackwardParams& p, int vec) {
  return (p.n / vec + kLongBackwardChunkVec - 1) / kLongBackwardChunkVec;
}

// Workspace: chunk moments, then per-row coefficients (the dweight / dbias partials come after).
static inline int64_t long_backward_workspace(const NormBackwardParams& p, int vec) {
  return p.outer * long_backward_chunks(p, vec) * int64_t(sizeof(ChunkMoments)) +
         p.outer * int64_t(sizeof(GradCoeffs<double>));
}

template <typename T, typename W, int VEC>
static inline const char* launch_long_backward(const NormBackwardParams& p, int64_t parts, void* dw_part, void* db_part,
                                        cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  const int64_t chunks = long_backward_chunks(p, VEC);
  auto* moments = static_cast<ChunkMoments*>(p.workspace);
  auto* coeffs = reinterpret_cast<GradCoeffs<A>*>(moments + p.outer * chunks);
  BackwardArgs<T, W> a{static_cast<const T*>(p.x), static_cast<const T*>(p.dy), static_cast<const W*>(p.weight),
                       static_cast<T*>(p.dx), static_cast<const T*>(p.dx_add), p.outer, p.n, 1, p.x_outer_stride, p.eps, p.rms, dw_part, db_part};
  long_backward_moments_kernel<T, W, VEC><<<unsigned(p.outer * chunks), kLongBackwardThreads, 0, stream>>>(
      a, chunks, moments);
  long_backward_coeffs_kernel<T><<<unsigned(p.outer), kLongBackwardThreads, 0, stream>>>(
      a.x, p.x_outer_stride, p.n, int(chunks), p.eps, p.rms, moments, coeffs);
  const int64_t col_blocks = (p.n / VEC + kLongBackwardThreads - 1) / kLongBackwardThreads;
  const int64_t rows_per_part = (p.outer + parts - 1) / parts;
  long_backward_apply_kernel<T, W, VEC><<<dim3(unsigned(col_blocks), unsigned(parts)), kLongBackwardThreads, 0, stream>>>(
      a, rows_per_part, coeffs);
  const cudaError_t err = cudaGetLastError();
  return launch_result(err);
}

}  // namespace fastnorm
