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

// out += the VEC values of dx_add at vector i (when given).
template <typename A, typename T, int VEC>
__device__ __forceinline__ void add_gradient(const T* dx_add, int64_t i, A (&out)[VEC]) {
  if (dx_add == nullptr) return;
  A add[VEC];
  widen(load_vec<true>(reinterpret_cast<const Vec<T, VEC>*>(dx_add) + i).v, add);
#pragma unroll
  for (int e = 0; e < VEC; ++e) out[e] += add[e];
}

// out[c] = sum over p of part[p][c], p in order: each block takes 32 columns, its 8 thread rows
// take the partials p = r, r + 8, ... and meet in shared memory in a fixed order.
constexpr int kReduceCols = 32, kReduceRows = 8;

template <typename A, typename W>
__global__ void __launch_bounds__(kReduceCols * kReduceRows) reduce_partials_kernel(const A* __restrict__ part,
                                                                                   int64_t parts, int64_t n,
                                                                                   W* __restrict__ out) {
  __shared__ A red[kReduceRows][kReduceCols];
  const int lane = threadIdx.x % kReduceCols, r = threadIdx.x / kReduceCols;
  const int64_t c = int64_t(blockIdx.x) * kReduceCols + lane;
  A s[4] = {A(0), A(0), A(0), A(0)};  // four chains in flight
  if (c < n) {
    int64_t p = r;
    for (; p + 3 * kReduceRows < parts; p += 4 * kReduceRows) {
#pragma unroll
      for (int u = 0; u < 4; ++u) s[u] += part[(p + u * kReduceRows) * n + c];
    }
    for (; p < parts; p += kReduceRows) s[0] += part[p * n + c];
  }
  red[r][lane] = (s[0] + s[1]) + (s[2] + s[3]);
  __syncthreads();
  if (r == 0 && c < n) {
    A total = A(0);
#pragma unroll
    for (int i = 0; i < kReduceRows; ++i) total += red[i][lane];
    out[c] = from_acc<W>(total);
  }
}

template <typename A, typename W>
static inline void launch_reduce_partials(const void* part, int64_t parts, int64_t n, void* out, cudaStream_t stream) {
  if (part == nullptr || out == nullptr) return;
  const int64_t blocks = (n + kReduceCols - 1) / kReduceCols;
  reduce_partials_kernel<A, W><<<unsigned(blocks), kReduceCols * kReduceRows, 0, stream>>>(
      static_cast<const A*>(part), parts, n, static_cast<W*>(out));
}

}  // namespace fastnorm
