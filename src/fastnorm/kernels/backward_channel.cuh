// The backward over a non-trailing axis (inner > 1, e.g. the channels of NCHW), in two kernels:
// (1) a thread per column (o, i) sums its moments over the n channels, in double, and writes the
// column's coefficients; (2) a block per channel row (o, j), contiguous along i, writes dx and its
// row's sums of dy * xhat and dy: the dweight / dbias partials [outer][n], reduced over o after.
// x and dy are read twice; the columns' coefficients once more per channel, mostly from L2.
#pragma once
#include "backward_common.cuh"

namespace fastnorm {

constexpr int kChannelBackwardThreads = 256;

template <typename T, typename W>
__global__ void __launch_bounds__(kChannelBackwardThreads) channel_backward_coeffs_kernel(
    BackwardArgs<T, W> a, GradCoeffs<typename AccOf<T>::type>* coeffs) {
  using A = typename AccOf<T>::type;
  const int64_t columns = a.outer * a.inner;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < columns; q += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = q / a.inner, i = q % a.inner;
    const T* xc = a.x + o * a.x_stride + i;
    const T* gc = a.dy + o * a.n * a.inner + i;
    const double s = a.rms ? 0.0 : double(to_acc(xc[0]));
    double m[4] = {0.0, 0.0, 0.0, 0.0};
    for (int64_t j = 0; j < a.n; ++j) {
      const double d = double(to_acc(xc[j * a.inner])) - s;
      double g = double(to_acc(gc[j * a.inner]));
      if (a.w) g *= double(to_acc(a.w[j]));
      m[0] += d;
      m[1] = fma(d, d, m[1]);
      m[2] += g;
      m[3] = fma(g, d, m[3]);
    }
    coeffs[q] = coeffs_from_moments<A>(s, m[0], m[1], m[2], m[3], a.n, a.eps, a.rms);
  }
}

// Block b: channel row j = b % n of outer index o = b / n.
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kChannelBackwardThreads) channel_backward_apply_kernel(
    BackwardArgs<T, W> a, const GradCoeffs<typename AccOf<T>::type>* coeffs) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  __shared__ A sums[2 * 32];
  const int64_t o = blockIdx.x / a.n, j = blockIdx.x % a.n;
  const V* xv = reinterpret_cast<const V*>(a.x + o * a.x_stride + j * a.inner);
  const V* gv = reinterpret_cast<const V*>(a.dy + (o * a.n + j) * a.inner);
  V* dxv = reinterpret_cast<V*>(a.dx + (o * a.n + j) * a.inner);
  const GradCoeffs<A>* co = coeffs + o * a.inner;
  const A wj = a.w ? A(to_acc(a.w[j])) : A(1);
  A m[2] = {A(0), A(0)};  // sum dy * xhat, sum dy
  for (int64_t v = threadIdx.x; v < a.inner / VEC; v += blockDim.x) {
    A xs[VEC], gs[VEC], out[VEC];
    widen(load_vec<true>(xv + v).v, xs);
    widen(load_vec<true>(gv + v).v, gs);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      A xhat;
      out[e] = grad_input(xs[e], gs[e] * wj, co[v * VEC + e], xhat);
      m[0] = fma(gs[e], xhat, m[0]);
      m[1] += gs[e];
    }
    if (a.dx) {
      add_gradient(a.dx_add ? a.dx_add + (o * a.n + j) * a.inner : nullptr, v, out);
      store_vec(dxv + v, pack<T>(out));
    }
  }
  if (a.dw_part == nullptr && a.db_part == nullptr) return;
  group_sums(m, blockDim.x, sums);
  if (threadIdx.x == 0) {
    if (a.dw_part) static_cast<A*>(a.dw_part)[o * a.n + j] = m[0];
    if (a.db_part) static_cast<A*>(a.db_part)[o * a.n + j] = m[1];
  }
}

// Workspace: the columns' coefficients (the dweight / dbias partials come after).
static inline int64_t channel_backward_workspace(const NormBackwardParams& p) {
  return p.outer * p.inner * int64_t(sizeof(GradCoeffs<double>));
}

template <typename T, typename W, int VEC>
static inline const char* launch_channel_backward(const NormBackwardParams& p, void* dw_part, void* db_part,
                                           cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  auto* coeffs = static_cast<GradCoeffs<A>*>(p.workspace);
  BackwardArgs<T, W> a{static_cast<const T*>(p.x), static_cast<const T*>(p.dy), static_cast<const W*>(p.weight),
                       static_cast<T*>(p.dx), static_cast<const T*>(p.dx_add), p.outer, p.n, p.inner, p.x_outer_stride, p.eps, p.rms, dw_part, db_part};
  const Device dev = device_info();
  const int64_t columns = p.outer * p.inner;
  const int64_t blocks = std::min<int64_t>((columns + kChannelBackwardThreads - 1) / kChannelBackwardThreads,
                                           int64_t(dev.sms) * 16);
  channel_backward_coeffs_kernel<T, W><<<unsigned(blocks), kChannelBackwardThreads, 0, stream>>>(a, coeffs);
  const int threads = std::max(32, std::min(kChannelBackwardThreads, pow2_at_least(p.inner / VEC)));
  channel_backward_apply_kernel<T, W, VEC><<<unsigned(p.outer * p.n), threads, 0, stream>>>(a, coeffs);
  const cudaError_t err = cudaGetLastError();
  return launch_result(err);
}

}  // namespace fastnorm
