// Fused residual add and norm for last-dim rows a block holds (up to 1024 threads x 4 vectors):
// h = x + residual is rounded to its dtype, written once, and normalized from registers: x and
// residual read once, h and y written once. A group of tpr threads takes a row, each thread its
// vectors t, t + tpr, ... (at most K); statistics as the row kernel takes them (a rough mean, then
// the corrected two-pass sums). Other calls are not fused (the caller adds first).
#pragma once
#include <algorithm>

#include "cuda_launch.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int kResidualThreads = 1024;  // threads a row, at most
template <typename T> constexpr int kResidualThreadElems = sizeof(T) == 8 ? 8 : 16;  // by default

// H: the dtype of residual and h (x's, or float32 to keep the residual stream in float32).
// h stays in registers as stored (H, packed), widened in each pass: bf16 rows of 2 vectors a thread
// took 52 registers with float copies, 48 so (5 blocks of 256 an SM, not 4). x and r are loaded
// plainly: evict-first loads were 1-2% slower (H100, results/h100-residual.txt).
template <typename T, typename H, typename W, int VEC, int K>
__global__ void __launch_bounds__(kResidualThreads) residual_row_kernel(RowArgs<T, W> a, const H* __restrict__ res,
                                                                        H* __restrict__ h) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  using VH = Vec<H, VEC>;
  __shared__ A sums[2][64];
  const int tpr = a.tpr, sh = __ffs(tpr) - 1, rows_per_block = blockDim.x >> sh;
  const int group = threadIdx.x >> sh, t = threadIdx.x & (tpr - 1);
  const int64_t row = int64_t(blockIdx.x) * rows_per_block + group, nvec = a.n / VEC;
  const int count = row < a.rows && nvec > t ? int((nvec - 1 - t) >> sh) + 1 : 0;
  const int64_t r0 = count ? row : 0;
  const V* xv = reinterpret_cast<const V*>(a.x + r0 * a.x_stride);
  const VH* rv = reinterpret_cast<const VH*>(res + r0 * a.n);
  VH* hv_out = reinterpret_cast<VH*>(h + r0 * a.n);
  V xr[K];
  VH hr[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (k < count) {
      xr[k] = load_vec<false>(xv + t + (k << sh));
      hr[k] = load_vec<false>(rv + t + (k << sh));
    }
  }
  const A inv_n = A(1) / A(a.n);
  A total[1] = {A(0)};
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (k >= count) break;
    A xs[VEC], hs[VEC];
    widen(xr[k].v, xs);
    widen(hr[k].v, hs);
#pragma unroll
    for (int e = 0; e < VEC; ++e) hs[e] += xs[e];
    hr[k] = pack<H>(hs);
    store_vec<false>(hv_out + t + (k << sh), hr[k]);
    widen(hr[k].v, hs);  // the norm sees h as stored (rounded)
#pragma unroll
    for (int e = 0; e < VEC; ++e) total[0] = a.rms ? fma(hs[e], hs[e], total[0]) : fma(hs[e], inv_n, total[0]);
  }
  group_sums(total, tpr, sums[0]);
  Affine<A> st;
  if (a.rms) {
    st = affine_of(A(0), A(0), total[0] * inv_n, a.eps, true);
  } else {
    const A c = total[0];
    A dev[2] = {A(0), A(0)};
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (k >= count) break;
      A hs[VEC];
      widen(hr[k].v, hs);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A d = hs[e] - c;
        dev[0] += d;
        dev[1] = fma(d, d, dev[1]);
      }
    }
    group_sums(dev, tpr, sums[1]);
    const A mean_d = dev[0] * inv_n;
    st = affine_of(c, mean_d, corrected_variance(mean_d, dev[1] * inv_n), a.eps, false);
  }
  V* yv = reinterpret_cast<V*>(a.y + r0 * a.n);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (k >= count) break;
    const int i = t + (k << sh);
    A wv[VEC], bv[VEC], out[VEC];
    if (a.w) load_params<false, VEC>(a.w + int64_t(i) * VEC, wv);
    if (a.b) load_params<false, VEC>(a.b + int64_t(i) * VEC, bv);
    widen(hr[k].v, out);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      A v = a.rms ? out[e] * st.rstd : normalized(out[e], st);
      if (a.w) v *= wv[e];
      if (a.b) v += bv[e];
      out[e] = v;
    }
    store_vec<false>(yv + i, pack<T>(out));
  }
}

template <typename T, typename H, typename W, int VEC, int K>
static inline const char* launch_residual_k(const NormParams& p, int tpr, cudaStream_t stream) {
  const int threads = tpr > 256 ? tpr : 256;
  const int64_t rows_per_block = threads / tpr, blocks = (p.outer + rows_per_block - 1) / rows_per_block;
  RowArgs<T, W> a = row_args<T, W>(p, tpr);
  residual_row_kernel<T, H, W, VEC, K><<<unsigned(blocks), threads, 0, stream>>>(
      a, static_cast<const H*>(p.residual), static_cast<H*>(p.h));
  return launch_result(cudaGetLastError());
}

// The fused kernel for this call, or FASTNORM_RESIDUAL_NOT_FUSED.
template <typename T, typename H, typename W, int VEC>
static inline const char* launch_residual(const NormParams& p, cudaStream_t stream) {
  const int64_t nvec = p.n / VEC;
  // At most kResidualThreadElems elements a thread; 2-byte rows of other than a power of two vectors
  // take up to 4 vectors a thread (half the threads a row, twice the rows an SM in flight):
  // bf16 8192x5120 118.7 -> 116.4 us, where rows of 2^k vectors gain nothing (H100,
  // results/h100-residual.txt).
  const int def_k = kResidualThreadElems<T> / VEC >= 4 || (sizeof(H) == sizeof(T) && (nvec & (nvec - 1)) != 0) ? 4 : 2;
  const int max_k = int(std::min<int64_t>(std::max<int64_t>(env_int("FASTNORM_RESIDUAL_VECS", def_k), 1), 4));
  const int tpr = pow2_at_least((nvec + max_k - 1) / max_k);
  if (p.inner != 1 || tpr > kResidualThreads || !aligned16(p.residual) || !aligned16(p.h) ||
      p.n % VEC != 0) {
    return FASTNORM_RESIDUAL_NOT_FUSED;
  }
  const int k = pow2_at_least((nvec + tpr - 1) / tpr);
  if (k == 1) return launch_residual_k<T, H, W, VEC, 1>(p, tpr, stream);
  if (k == 2) return launch_residual_k<T, H, W, VEC, 2>(p, tpr, stream);
  if (k == 4) return launch_residual_k<T, H, W, VEC, 4>(p, tpr, stream);
  return FASTNORM_RESIDUAL_NOT_FUSED;
}

}  // namespace fastnorm
