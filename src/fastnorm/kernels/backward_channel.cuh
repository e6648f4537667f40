// The backward over a non-trailing axis (inner > 1, e.g. the channels of NCHW).
//
// Fused (channel_backward_tile_kernel), when a block's 256 threads can hold a whole column tile in
// registers (n <= K x thread rows, K <= 4 channels a thread: n <= 128 with at least 8 lanes along
// a channel row, runs of 128 bytes, 64 for 2-byte types): a tile is tx*VEC consecutive columns
// (o, i..) of all n channels, x and dy read once, their column sums met across the thread rows in
// shared memory, dx written: 3 passes over memory, the floor. The dweight / dbias partials are per
// block, [grid][n], each thread keeping its channels' sums over all the tiles it takes.
//
// Otherwise, two kernels: (1) a thread per column (o, i) sums its moments over the n channels, in
// double, and writes the column's coefficients; (2) a block per channel row (o, j), contiguous along
// i, writes dx and its row's sums of dy * xhat and dy: the dweight / dbias partials [outer][n],
// reduced over o after. x and dy are read twice; the columns' coefficients once more per channel,
// mostly from L2.
#pragma once
#include <cstdlib>

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

// ---- fused: one read of x and dy -------------------------------------------------------------

constexpr int kChannelTileThreads = 256;
// Channels a thread holds, and elements a vector, so that two blocks an SM fit in registers without
// spills: 4 channels (8 spill) of 4 columns (16-byte vectors of 4-byte types, 8-byte ones of 2-byte
// types: 8 columns spill at (256, 2)).
constexpr int kChannelTileMaxK = 4;
template <int VEC> constexpr int kChannelTileVec = VEC > 4 ? 4 : VEC;

// VEC per-column sums of one thread, moved through shared memory as one or two 16-byte accesses.
template <typename A, int VEC>
struct alignas(sizeof(A) * VEC >= 16 ? 16 : sizeof(A) * VEC) ColumnSums {
  A v[VEC];
};

// Sums of R per-column values over the tyn thread rows of a block, each thread's VEC columns, in a
// fixed order (bitwise the same on every run); every thread gets the totals of its columns. The sums
// are taken once per column, not once per thread: thread q adds up column value q over the rows.
// red: [R][tyn][tx] entries, then [R][tx] totals. All threads of the block must call it.
template <int R, typename A, int VEC>
__device__ __forceinline__ void column_sums(A (&v)[R][VEC], ColumnSums<A, VEC>* red, int ty, int tyn, int lane,
                                            int tx) {
  ColumnSums<A, VEC>* totals = red + R * blockDim.x;
  __syncthreads();  // red may still be read from the previous call
#pragma unroll
  for (int r = 0; r < R; ++r) {
    ColumnSums<A, VEC> c;
#pragma unroll
    for (int e = 0; e < VEC; ++e) c.v[e] = v[r][e];
    red[(r * tyn + ty) * tx + lane] = c;
  }
  __syncthreads();
  const int cols = tx * VEC;
  const A* rows = reinterpret_cast<const A*>(red);
  for (int q = threadIdx.x; q < R * cols; q += blockDim.x) {
    const int r = q / cols, c = q % cols;
    A sum = A(0);
    for (int t = 0; t < tyn; ++t) sum += rows[(r * tyn + t) * cols + c];
    reinterpret_cast<A*>(totals)[q] = sum;
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const ColumnSums<A, VEC> c = totals[r * tx + lane];
#pragma unroll
    for (int e = 0; e < VEC; ++e) v[r][e] = c.v[e];
  }
}

// Blocks an SM at K channels a thread without spills (4: 2, 2: 3, 1: 4; double: 2).
template <typename T, int K> constexpr int kChannelTileBlocks = sizeof(T) == 8 || K >= 4 ? 2 : K == 2 ? 3 : 4;

// Thread (ty, lane) of a block holds channels ty, ty + tyn, ... (K of them) of the VEC columns at
// lane * VEC in each tile it takes; tiles go round the grid. H100 (benchmarks/NOTES.md, "channel
// tile"): fp32 RMSNorm seed backward 17.6 -> 8.0 ms (90% of copy), bf16 LayerNorm 112x64x512x512
// 21.4 -> 7.0 ms (54%: latency-bound at 2 blocks an SM, 121 registers).

template <typename T, typename W, int VEC, int K>
__global__ void __launch_bounds__(kChannelTileThreads, kChannelTileBlocks<T, K>) channel_backward_tile_kernel(
    BackwardArgs<T, W> a, int tx) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* red = reinterpret_cast<ColumnSums<A, VEC>*>(smem_raw);  // [3][tyn][tx]
  const bool rms = a.rms;
  const int tyn = blockDim.x / tx;
  const int lane = threadIdx.x % tx, ty = threadIdx.x / tx;
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t tiles_per_outer = (a.inner + cols - 1) / cols;
  const int64_t tiles = a.outer * tiles_per_outer;
  const A inv_n = A(1) / A(a.n);
  A dw[K], db[K];
#pragma unroll
  for (int k = 0; k < K; ++k) dw[k] = db[k] = A(0);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer;
    const int64_t col = (tile % tiles_per_outer) * cols + int64_t(lane) * VEC;
    const bool active = col < a.inner;
    const T* xo = a.x + o * a.x_stride + (active ? col : 0);
    const int64_t go = o * a.n * a.inner + (active ? col : 0);  // dy, dx and dx_add: contiguous
    V xv[K], gv[K];
    A wk[K];  // the weights, from L1 each tile: registers are short
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t j = ty + int64_t(k) * tyn;
      if (active && j < a.n) {
        xv[k] = load_vec<true>(reinterpret_cast<const V*>(xo + j * a.inner));
        gv[k] = load_vec<true>(reinterpret_cast<const V*>(a.dy + go + j * a.inner));
      }
      wk[k] = (a.w && j < a.n) ? A(to_acc(a.w[j])) : A(1);
    }
    // LayerNorm: sums about channel 0's value (a shift that keeps x + 1000 exact), then the mean.
    A shift[VEC], mean[1][VEC];
    V first;
    if (active && !rms) first = *reinterpret_cast<const V*>(xo);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      shift[e] = (active && !rms) ? A(to_acc(first.v[e])) : A(0);
      mean[0][e] = A(0);
    }
    if (!rms) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (active && ty + int64_t(k) * tyn < a.n) {
#pragma unroll
          for (int e = 0; e < VEC; ++e) mean[0][e] += A(to_acc(xv[k].v[e])) - shift[e];
        }
      }
      column_sums<1>(mean, red, ty, tyn, lane, tx);
#pragma unroll
      for (int e = 0; e < VEC; ++e) mean[0][e] *= inv_n;
    }
    // Centered sums: of d^2, of g and of g * d, with d = x - shift - mean and g = dy * w.
    A m[3][VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) m[0][e] = m[1][e] = m[2][e] = A(0);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (active && ty + int64_t(k) * tyn < a.n) {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A d = (A(to_acc(xv[k].v[e])) - shift[e]) - mean[0][e];
          const A g = A(to_acc(gv[k].v[e])) * wk[k];
          m[0][e] = fma(d, d, m[0][e]);
          m[1][e] += g;
          m[2][e] = fma(g, d, m[2][e]);
        }
      }
    }
    column_sums<3>(m, red, ty, tyn, lane, tx);
    if (!active) continue;
    A rstd[VEC], c1[VEC], c2[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      rstd[e] = rsqrt_acc(m[0][e] * inv_n + A(a.eps));
      c1[e] = rms ? A(0) : m[1][e] * inv_n;
      c2[e] = rstd[e] * m[2][e] * inv_n;  // mean(g * xhat)
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t j = ty + int64_t(k) * tyn;
      if (j < a.n) {
        A out[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A dy = A(to_acc(gv[k].v[e]));
          const A xhat = ((A(to_acc(xv[k].v[e])) - shift[e]) - mean[0][e]) * rstd[e];
          out[e] = rstd[e] * (dy * wk[k] - c1[e] - xhat * c2[e]);
          dw[k] = fma(dy, xhat, dw[k]);
          db[k] += dy;
        }
        if (a.dx) {
          add_gradient(a.dx_add ? a.dx_add + go + j * a.inner : nullptr, 0, out);
          store_vec(reinterpret_cast<V*>(a.dx + go + j * a.inner), pack<T>(out));
        }
      }
    }
  }
  if (a.dw_part == nullptr && a.db_part == nullptr) return;
  // The block's partials: each channel's sums over the tx lanes that share it (tx, a power of two
  // <= 32, keeps the lane group inside one warp).
  group_sums(dw, tx, static_cast<A*>(nullptr));  // tx <= 32: shuffles only, no shared memory
  group_sums(db, tx, static_cast<A*>(nullptr));
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = ty + int64_t(k) * tyn;
    if (lane == 0 && j < a.n) {
      if (a.dw_part) static_cast<A*>(a.dw_part)[blockIdx.x * a.n + j] = dw[k];
      if (a.db_part) static_cast<A*>(a.db_part)[blockIdx.x * a.n + j] = db[k];
    }
  }
}

// The fused kernel's launch: lanes tx along the columns (16-byte vectors, as many as the inner
// extent takes, up to 32), the rest of the 256 threads along the channels, each holding K of them.
// tx >= 8 keeps runs of each channel row of 128 bytes (64 for 2-byte types); k == 0: the call does
// not fit.
struct ChannelTilePlan {
  int tx, k, grid;
  size_t smem;
};

// FASTNORM_CHANNEL_BWD (read at each call, for A/B runs): 0 forces the two-kernel path, 1/2/4 caps K
// (fewer channels a thread: narrower tiles, more blocks an SM).
static inline int channel_backward_override() {
  return int(env_int("FASTNORM_CHANNEL_BWD", -1));
}

template <typename T, typename W, int VEC, int K>
static inline const void* channel_tile_kernel_of(int k) {
  if constexpr (K > kChannelTileMaxK) {
    return nullptr;
  } else {
    if (k == K) return reinterpret_cast<const void*>(channel_backward_tile_kernel<T, W, VEC, K>);
    return channel_tile_kernel_of<T, W, VEC, K * 2>(k);
  }
}

template <typename T, typename W, int VEC>
static inline ChannelTilePlan plan_channel_tile(const NormBackwardParams& p) {
  using A = typename AccOf<T>::type;
  const ChannelTilePlan none{0, 0, 0, 0};
  const int force = channel_backward_override();
  if (force == 0) return none;
  const int max_k = force > 0 && force < kChannelTileMaxK ? force : kChannelTileMaxK;
  const int64_t inner_vec = (p.inner + VEC - 1) / VEC;
  int tx = int(std::min<int64_t>(pow2_at_least(inner_vec), 32));
  int k = 0;
  while (true) {
    k = pow2_at_least((p.n + kChannelTileThreads / tx - 1) / (kChannelTileThreads / tx));
    if (k <= max_k) break;
    if (tx <= 8) return none;  // fewer than 8 lanes along a channel row: the two-kernel path
    tx /= 2;
  }
  const void* kernel = channel_tile_kernel_of<T, W, VEC, 1>(k);
  const size_t smem = size_t(3 * kChannelTileThreads + 3 * 32) * sizeof(ColumnSums<A, VEC>);  // rows, totals
  const int per_sm = blocks_per_sm(kernel, kChannelTileThreads, smem);
  if (per_sm < 1) return none;
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t tiles = p.outer * ((p.inner + cols - 1) / cols);
  const int64_t resident = int64_t(per_sm) * device_info().sms;
  return ChannelTilePlan{tx, k, int(tiles < resident ? tiles : resident), smem};
}

template <typename T, typename W, int VEC>
static inline const char* launch_channel_tile(const NormBackwardParams& p, const ChannelTilePlan& plan, void* dw_part,
                                              void* db_part, cudaStream_t stream) {
  BackwardArgs<T, W> a{static_cast<const T*>(p.x), static_cast<const T*>(p.dy), static_cast<const W*>(p.weight),
                       static_cast<T*>(p.dx), static_cast<const T*>(p.dx_add), p.outer, p.n, p.inner, p.x_outer_stride, p.eps, p.rms, dw_part, db_part};
  const void* kernel = channel_tile_kernel_of<T, W, VEC, 1>(plan.k);
  int tx = plan.tx;
  void* args[] = {&a, &tx};
  return launch_result(cudaLaunchKernel(kernel, dim3(plan.grid), dim3(kChannelTileThreads), args, plan.smem, stream));
}

// ---- two kernels --------------------------------------------------------------------------------

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
