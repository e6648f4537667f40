// The few-rows kernel: rows of at most 1024 vectors, fewer than SMs or one wave of blocks (latency-bound calls).
#pragma once
#include "cuda_launch.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

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

// Threads a row: one vector each.
static inline int few_rows_threads(const NormParams& p, int vec) { return std::max(32, pow2_at_least(p.n / vec)); }

// Calls of more rows than SMs take it too while all their blocks fit one wave (threads an SM holds:
// kFewRowsWaveThreads) and a row has at least kFewRowsWaveVectors, except where the forward saves
// training statistics (the row kernel does). H100, against the row kernel: fp32 246x1024 RMS 5.63 ->
// 5.12 us, 1000x1000 7.33 -> 6.85, bf16 1071x768 RMS 6.14 -> 5.57, LN 1000x1000 7.01 -> 6.30, fp16
// 141x2048 RMS 5.09 -> 4.64; but fp16 3266x40 LN (5 vectors, a warp a row) 5.18 -> 6.24.
// FASTNORM_FEW_ROWS_WAVE=0 (read at each call, for A/B runs) leaves them to the row kernel.
constexpr int64_t kFewRowsWaveThreads = 2048;
constexpr int64_t kFewRowsWaveVectors = 64;

static inline bool few_rows_take(const NormParams& p, int vec, int sms) {
  if (p.threads > 0 || p.n / vec > kFewRowsThreads) return false;
  if (p.outer < sms) return true;
  if (vec == 1 || p.n / vec < kFewRowsWaveVectors || p.stats || env_int("FASTNORM_FEW_ROWS_WAVE", 1) == 0) return false;
  return p.outer * few_rows_threads(p, vec) <= int64_t(sms) * kFewRowsWaveThreads;
}

template <typename T, typename W, int VEC>
static inline const char* launch_few_rows(const NormParams& p, cudaStream_t stream) {
  const int threads = few_rows_threads(p, VEC);
  RowArgs<T, W> a = row_args<T, W>(p, threads);
  if (p.rms) {
    few_rows_kernel<T, W, VEC, true><<<unsigned(p.outer), threads, 0, stream>>>(a);
  } else {
    few_rows_kernel<T, W, VEC, false><<<unsigned(p.outer), threads, 0, stream>>>(a);
  }
  const cudaError_t err = cudaGetLastError();
  return launch_result(err);
}

}  // namespace fastnorm
