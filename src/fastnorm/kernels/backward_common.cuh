// Shared by the backward kernels: their arguments, the per-row (or per-column) coefficients of the
// input gradient, and the fixed-order reduction of dweight / dbias partials.
//
// With xhat = (x - mean) * rstd and g = dy * w (w = 1 without a weight):
//   LayerNorm  dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   RMSNorm    dx = rstd * (g - xhat * mean(g * xhat))            (xhat = x * rstd)
//   dweight = sum over rows of dy * xhat, dbias = sum over rows of dy.
// dweight and dbias are summed as per-block partials in the accumulator type, then reduced across
// blocks in a fixed order (reduce_partials_kernel): bitwise the same result on every run, no atomics.
#pragma once
#include <algorithm>

#include "cuda_launch.cuh"
#include "cuda_stats.cuh"
#include "norm_backward_params.h"

namespace fastnorm {

template <typename T, typename W>
struct BackwardArgs {
  const T* __restrict__ x;
  const T* __restrict__ dy;
  const W* __restrict__ w;
  T* __restrict__ dx;
  const T* __restrict__ dx_add;  // added to dx, or null
  int64_t outer, n, inner, x_stride;  // x_stride: between outer indices, in elements
  double eps;
  int rms;
  void* dw_part;  // [parts][n] accumulator-type partials of dweight, or null
  void* db_part;  // [parts][n] partials of dbias, or null
  const void* affine;  // the row backward: the forward's saved affine maps [outer][3], or null
};

// dx = rstd * (g - c1 - xhat * c2) for one row (or column), xhat from the forward's affine map.
template <typename A>
struct GradCoeffs {
  Affine<A> st;
  A c1, c2;
};

// Coefficients from moments about a shift s (the row's first element; 0 for RMSNorm), summed in
// double: S1 = sum(x - s), S2 = sum((x - s)^2), G = sum(g), GD = sum(g * (x - s)).
// Since s is one of the values, the cancellation in S2 / n - (S1 / n)^2 costs at most a factor n of
// double's precision (as in the resident forward kernel).
template <typename A>
__device__ __forceinline__ GradCoeffs<A> coeffs_from_moments(double s, double S1, double S2, double G, double GD,
                                                             int64_t n, double eps, bool rms) {
  const double inv_n = 1.0 / double(n);
  const double mean_rel = rms ? 0.0 : S1 * inv_n;
  double var = S2 * inv_n - mean_rel * mean_rel;
  if (!(var >= 0.0)) var = isinf(S2) ? S2 : 0.0;
  GradCoeffs<A> c;
  c.st = affine_of(A(s), A(mean_rel), A(var), eps, rms);
  const double rstd = double(c.st.rstd);
  c.c1 = rms ? A(0) : A(G * inv_n);
  c.c2 = A(rstd * (GD * inv_n - mean_rel * G * inv_n));
  return c;
}

// dx of one element, and its contributions to dweight (dy * xhat) and dbias (dy).
template <typename A>
__device__ __forceinline__ A grad_input(A x, A g, const GradCoeffs<A>& c, A& xhat) {
  xhat = normalized(x, c.st);
  return c.st.rstd * (g - c.c1 - xhat * c.c2);
}

// VEC accumulator values (a thread's dweight or dbias partials) to p, aligned to their size, in stores of up
// to 16 bytes. Stored one by one, a warp's store touched 32 sectors for 128 bytes: 17-34 us of the bf16
// row backward where a block takes a row (H100, session 32).
template <typename A, int VEC>
__device__ __forceinline__ void store_acc_vec(A* p, const Vec<A, VEC>& v) {
  constexpr int kBytes = int(sizeof(A)) * VEC;
  if constexpr (kBytes % 16 == 0) {
#pragma unroll
    for (int piece = 0; piece < kBytes / 16; ++piece)
      reinterpret_cast<uint4*>(p)[piece] = reinterpret_cast<const uint4*>(v.v)[piece];
  } else if constexpr (kBytes == 8) {
    *reinterpret_cast<uint2*>(p) = *reinterpret_cast<const uint2*>(v.v);
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) p[e] = v.v[e];
  }
}

// out += the VEC values of dx_add at vector i (when given).
template <typename A, typename T, int VEC>
__device__ __forceinline__ void add_gradient(const T* dx_add, int64_t i, A (&out)[VEC]) {
  if (dx_add == nullptr) return;
  A add[VEC];
  widen(load_vec<true>(reinterpret_cast<const Vec<T, VEC>*>(dx_add) + i).v, add);
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] += add[e];
}

// out[c] = sum over p of part[p][c], p in order, for dweight and dbias in one launch (blockIdx.y):
// each block takes `cols` columns and blockDim / cols thread rows; thread row r takes the partials
// p = r, r + rows, ... in four chains, and the rows meet in shared memory in a fixed order. The
// shape follows the work: about 4 partials or more a thread (16 rows at most), and columns halved
// (to 8) until every SM has a block. (One launch of 32 x 8 threads per output was latency-bound:
// 10 us for dweight + dbias of 264 partials of 4096, 17 us at n = 1024; 16 thread rows for the 2
// partials of 4M columns, mostly idle, added 0.46 ms to the LayerNorm seed's training step.)
constexpr int kReduceThreads = 512;

template <typename A, typename W>
__global__ void __launch_bounds__(kReduceThreads) reduce_partials_kernel(const A* __restrict__ part0, W* __restrict__ out0,
                                                                        const A* __restrict__ part1, W* __restrict__ out1,
                                                                        int64_t parts, int64_t n, int cols) {
  __shared__ A red[kReduceThreads];
  const A* __restrict__ part = blockIdx.y ? part1 : part0;
  W* __restrict__ out = blockIdx.y ? out1 : out0;
  const int rows = int(blockDim.x) / cols, lane = threadIdx.x % cols, r = threadIdx.x / cols;
  const int64_t c = int64_t(blockIdx.x) * cols + lane;
  A s[4] = {A(0), A(0), A(0), A(0)};  // four chains in flight
  if (c < n) {
    int64_t p = r;
    for (; p + 3 * rows < parts; p += 4 * rows) {
#pragma unroll
      for (int u = 0; u < 4; ++u) s[u] += part[(p + u * rows) * n + c];
    }
    for (; p < parts; p += rows) s[0] += part[p * n + c];
  }
  const A mine = (s[0] + s[1]) + (s[2] + s[3]);
  if (rows == 1) {
    if (c < n) out[c] = from_acc<W>(mine);
    return;
  }
  red[threadIdx.x] = mine;
  __syncthreads();
  if (r == 0 && c < n) {
    A total = A(0);
    for (int i = 0; i < rows; ++i) total += red[i * cols + lane];
    out[c] = from_acc<W>(total);
  }
}

// dweight and dbias from their [parts][n] partials (either pair may be absent: null part or out).
template <typename A, typename W>
static inline void launch_reduce_partials(const void* dw_part, void* dweight, const void* db_part, void* dbias,
                                          int64_t parts, int64_t n, cudaStream_t stream) {
  const A* part[2];
  W* out[2];
  int kinds = 0;
  if (dw_part && dweight) part[kinds] = static_cast<const A*>(dw_part), out[kinds++] = static_cast<W*>(dweight);
  if (db_part && dbias) part[kinds] = static_cast<const A*>(db_part), out[kinds++] = static_cast<W*>(dbias);
  if (kinds == 0) return;
  if (kinds == 1) part[1] = part[0], out[1] = out[0];
  int rows = 1;
  while (rows < 16 && rows * 4 < parts) rows *= 2;
  int cols = kReduceThreads / rows;
  const int64_t sms = device_info().sms;
  while (cols > 8 && (n + cols - 1) / cols * kinds < sms) cols /= 2;
  const dim3 grid(unsigned((n + cols - 1) / cols), unsigned(kinds));
  reduce_partials_kernel<A, W><<<grid, rows * cols, 0, stream>>>(part[0], out[0], part[1], out[1], parts, n, cols);
}

}  // namespace fastnorm
