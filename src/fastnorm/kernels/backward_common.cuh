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

// A LayerNorm row's backward statistics over a set of its elements: count, mean relative to the
// row's shift (its first element), M2, and the sums of g and of g * (x - mean). Merged with Chan's
// formula, so every thread's exact two-pass moments of its own elements meet in one reduction.
template <typename A>
struct GradStats {
  A n, mean, m2, g, gd;
};

template <typename A>
__device__ __forceinline__ GradStats<A> merge(const GradStats<A>& a, const GradStats<A>& b) {
  const A n = a.n + b.n;
  if (n == A(0)) return a;
  const A d = b.mean - a.mean, wb = b.n / n;
  // sum g (x - mean) about the merged mean: a's part moves by (a.mean - mean) = -d wb, b's by d a.n / n.
  return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb, a.g + b.g, a.gd + b.gd + d * (b.g * a.n - a.g * b.n) / n};
}

template <typename A>
__device__ __forceinline__ GradStats<A> shfl_xor(const GradStats<A>& s, int offset) {
  return {__shfl_xor_sync(0xffffffffu, s.n, offset), __shfl_xor_sync(0xffffffffu, s.mean, offset),
          __shfl_xor_sync(0xffffffffu, s.m2, offset), __shfl_xor_sync(0xffffffffu, s.g, offset),
          __shfl_xor_sync(0xffffffffu, s.gd, offset)};
}

// Merges over each group of `tpr` consecutive threads (a power of two); every thread of the group
// gets the result. All threads of the block must call it.
template <typename A>
__device__ GradStats<A> group_merge(GradStats<A> s, int tpr, GradStats<A>* smem) {
  const int width = tpr < 32 ? tpr : 32;
  for (int off = width / 2; off > 0; off >>= 1) s = merge(s, shfl_xor(s, off));
  if (tpr <= 32) return s;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps_per_group = tpr >> 5;
  __syncthreads();  // smem may still be read by the previous call
  if (lane == 0) smem[warp] = s;
  __syncthreads();
  const int first = warp - warp % warps_per_group;
  GradStats<A> r = lane < warps_per_group ? smem[first + lane] : GradStats<A>{A(0), A(0), A(0), A(0), A(0)};
  for (int off = 16; off > 0; off >>= 1) r = merge(r, shfl_xor(r, off));
  return r;
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
