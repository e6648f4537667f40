// Statistics of a row (count, mean, M2), their merging (Chan's formula) and block reductions, and
// the normalize step: the affine map y = (x - center) * rstd + offset of a row, applied to vectors.
#pragma once
#include "cuda_vec.cuh"

namespace fastnorm {

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

// Sums of K values over the whole block, of any number of warps; every thread gets them. `smem` as for
// group_sums (32 * K values, alternating two buffers).
template <int K, typename A>
__device__ __forceinline__ void block_sums(A (&v)[K], A* smem) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
#pragma unroll
    for (int k = 0; k < K; ++k) smem[k * 32 + warp] = v[k];
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < K; ++k) v[k] = lane < int(blockDim.x >> 5) ? smem[k * 32 + lane] : A(0);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
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

// A row's affine map saved by the forward for the backward (NormParams::stats: [rows][3]).
template <typename A>
__device__ __forceinline__ void save_affine(void* stats, int64_t row, const Affine<A>& st) {
  A* s = static_cast<A*>(stats) + row * 3;
  s[0] = st.center, s[1] = st.offset, s[2] = st.rstd;
}

template <typename A>
__device__ __forceinline__ Affine<A> load_affine(const void* stats, int64_t row) {
  const A* s = static_cast<const A*>(stats) + row * 3;
  return {s[0], s[1], s[2]};
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

// The affine map of a row one thread holds whole: v[0, n) (zeros past n, K >= n). LayerNorm sums about the
// row's first element, so rows far from zero (x + 1000) stay exact. The thread-row and packed-row kernels.
template <typename A, int K>
__device__ __forceinline__ Affine<A> thread_row_affine(const A (&v)[K], int n, A inv_n, double eps, bool rms) {
  if (rms) {
    A s = A(0);
#pragma unroll
    for (int k = 0; k < K; ++k) s = fma(v[k], v[k], s);  // zeros past n add nothing
    return affine_of(A(0), A(0), s * inv_n, eps, true);
  }
  A s = A(0);
#pragma unroll
  for (int k = 0; k < K; ++k) s += k < n ? v[k] - v[0] : A(0);
  const A mean_rel = s * inv_n;
  A q = A(0);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const A d = (v[k] - v[0]) - mean_rel;
    q = k < n ? fma(d, d, q) : q;
  }
  return affine_of(v[0], mean_rel, q * inv_n, eps, false);
}

// Variance from the means of d and d * d about a rough mean. Below zero by rounding, or inf - inf
// when the squares overflowed (|x| > ~1e19 with spread, or a constant row near FLT_MAX whose rough
// mean is off by an ulp): then rstd = 0, y = b, as PyTorch gives when its variance overflows.
template <typename A>
__device__ __forceinline__ A corrected_variance(A mean_d, A mean_sq) {
  const A var = mean_sq - mean_d * mean_d;
  return var >= A(0) ? var : isinf(mean_sq) ? mean_sq : A(0);
}

}  // namespace fastnorm
