// The backward over a non-trailing axis (inner > 1, e.g. the channels of NCHW).
//
// Fused, when a block's 256 threads can hold a whole column tile (n <= K x thread rows, K <= 4 channels a
// thread: n <= 128 with at least 8 lanes along a channel row, runs of 128 bytes, 64 for 2-byte types): a tile
// is tx*VEC consecutive columns (o, i..) of all n channels, x and dy read once, their column sums met across
// the thread rows in shared memory, dx written: 3 passes over memory, the floor. The dweight / dbias partials
// are per block, [grid][n], each thread keeping its channels' sums over all the tiles it takes. Vectors of 4
// bytes and more take channel_backward_staged_kernel (each thread's share of the next tile copied into shared
// memory while it works on this one); 2-byte scalar columns channel_backward_tile_kernel (in registers).
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
  const int cols = tx * VEC, shift = __ffs(cols) - 1;  // (tx and VEC: powers of two)
  const A* rows = reinterpret_cast<const A*>(red);
  for (int q = threadIdx.x; q < R * cols; q += blockDim.x) {
    const int r = q >> shift, c = q & (cols - 1);
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

// A tile (o, c) of a grid-stride walk over outer x tiles_per_outer tiles, stepped without dividing (64-bit
// division is a called routine).
struct TileCursor {
  int64_t o, c, per_outer, step_o, step_c;
  __device__ TileCursor(int64_t tile, int64_t per, int64_t step)
      : o(tile / per), c(tile % per), per_outer(per), step_o(step / per), step_c(step % per) {}
  __device__ __forceinline__ void advance() {
    o += step_o;
    c += step_c;
    if (c >= per_outer) c -= per_outer, ++o;
  }
};

// Blocks an SM the staged kernel's registers allow (its values live in shared memory): 4 at 64 registers, 3 for
// 16-byte vectors at 4 channels a thread (79 registers; their stages' shared memory fits 3 blocks for RMSNorm).
template <typename T, int VEC, int K>
constexpr int kChannelStagedBlocks = sizeof(Vec<T, VEC>) >= 16 && K >= 4 ? 3 : 4;
// Stages of its ring: the copies run one tile ahead (3 stages: level on RMSNorm, slower on LayerNorm, whose
// float32 stages then leave one block an SM).
constexpr int kChannelStages = 2;

// The tile kernel with its reads in flight across tiles: each thread copies its own slots of x and dy
// (cp.async; it reads back only its own copies, so no barrier) for the tile kStages - 1 ahead of the one it
// sums and writes, where the register kernel waits on each tile's loads with nothing else in flight but the
// other blocks'. Slots: [kStages][2K, + 1 for LayerNorm's shift (channel 0 of the column)][256] vectors; a
// tile's values are read from them twice (sums, output), not held in registers, hence more blocks an SM for
// 2-byte types. Vectors of 4 bytes and more (cp.async's least). H200, backward, same process, against the
// register kernel (results/h200-channel-backward.txt): bf16 RMS 32x64x512x512 1698 -> 1182 us, LN 16x64x512x512
// 943 -> 737, 8x32x224x224 54.8 -> 49.7, fp32 LN 32x64x512x512 1838 -> 1729, RMS 1705 -> 1695 (the fp32 RMSNorm
// seed's training step 9774 -> 9618, torch.compile 9645), LN 16x96x56x56 30.5 -> 28.2.
template <typename T, typename W, int VEC, int K, int kStages>
__global__ void __launch_bounds__(kChannelTileThreads, kChannelStagedBlocks<T, VEC, K>) channel_backward_staged_kernel(
    BackwardArgs<T, W> a, int tx) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  static_assert(sizeof(V) >= 4, "cp.async copies 4 bytes at least");
  constexpr int S = kChannelTileThreads;  // a slot's stride, in vectors
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* red = reinterpret_cast<ColumnSums<A, VEC>*>(smem_raw);  // [R][tyn][tx], then [R][tx] totals
  const bool rms = a.rms;
  const int sums = rms ? 2 : 3, slots = 2 * K + (rms ? 0 : 1);
  V* own = reinterpret_cast<V*>(red + sums * (S + 32)) + threadIdx.x;  // this thread's slot 0 of stage 0
  const int tyn = blockDim.x / tx;
  const int lane = threadIdx.x % tx, ty = threadIdx.x / tx;
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t per_outer = (a.inner + cols - 1) / cols;
  const A inv_n = A(1) / A(a.n);
  // Copies of a tile's x and dy (and LayerNorm's shift) into a stage's slots; a group per tile, empty past the
  // last, so that the wait below counts the same groups on every tile.
  auto issue = [&](const TileCursor& t, int stage) {
    const int64_t col = t.c * cols + int64_t(lane) * VEC;
    if (t.o < a.outer && col < a.inner) {
      const T* xo = a.x + t.o * a.x_stride + col;
      const T* go = a.dy + t.o * a.n * a.inner + col;
      V* s = own + stage * slots * S;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int64_t j = ty + int64_t(k) * tyn;
        if (j < a.n) {
          cp_async<int(sizeof(V)), true>(s + k * S, xo + j * a.inner);
          cp_async<int(sizeof(V)), true>(s + (K + k) * S, go + j * a.inner);
        }
      }
      if (!rms) cp_async<int(sizeof(V)), false>(s + 2 * K * S, xo);
    }
    cp_async_commit();
  };
  A dw[K], db[K], wk[K];  // (the weights of the thread's channels: the same on every tile)
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = ty + int64_t(k) * tyn;
    dw[k] = db[k] = A(0);
    wk[k] = (a.w && j < a.n) ? A(to_acc(a.w[j])) : A(1);
  }
  TileCursor cur(blockIdx.x, per_outer, gridDim.x), ahead = cur;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(ahead, s), ahead.advance();
  for (int stage = 0; cur.o < a.outer; cur.advance()) {
    issue(ahead, stage == 0 ? kStages - 1 : stage - 1);
    ahead.advance();
    cp_async_wait_group<kStages - 1>();
    const V* s = own + stage * slots * S;
    stage = stage + 1 == kStages ? 0 : stage + 1;
    const int64_t col = cur.c * cols + int64_t(lane) * VEC;
    const bool active = col < a.inner;
    const int64_t go = cur.o * a.n * a.inner + (active ? col : 0);  // dy, dx and dx_add: contiguous
    // LayerNorm: sums about channel 0's value (a shift that keeps x + 1000 exact), then the mean.
    A shift[VEC], mean[1][VEC];
    V first;
    if (active && !rms) first = s[2 * K * S];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      shift[e] = (active && !rms) ? A(to_acc(first.v[e])) : A(0);
      mean[0][e] = A(0);
    }
    if (!rms) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (active && ty + int64_t(k) * tyn < a.n) {
          const V xk = s[k * S];
#pragma unroll
          for (int e = 0; e < VEC; ++e) mean[0][e] += A(to_acc(xk.v[e])) - shift[e];
        }
      }
      column_sums<1>(mean, red, ty, tyn, lane, tx);
#pragma unroll
      for (int e = 0; e < VEC; ++e) mean[0][e] *= inv_n;
    }
    // Centered sums: of d^2, of g * d and (LayerNorm) of g, with d = x - shift - mean and g = dy * w.
    A m[3][VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) m[0][e] = m[1][e] = m[2][e] = A(0);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (active && ty + int64_t(k) * tyn < a.n) {
        const V xk = s[k * S], gk = s[(K + k) * S];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A d = (A(to_acc(xk.v[e])) - shift[e]) - mean[0][e];
          const A g = A(to_acc(gk.v[e])) * wk[k];
          m[0][e] = fma(d, d, m[0][e]);
          m[1][e] = fma(g, d, m[1][e]);
          m[2][e] += g;
        }
      }
    }
    if (rms) column_sums<2>(reinterpret_cast<A(&)[2][VEC]>(m), red, ty, tyn, lane, tx);  // (sum g unused)
    else column_sums<3>(m, red, ty, tyn, lane, tx);
    if (!active) continue;
    A rstd[VEC], c1[VEC], c2[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      rstd[e] = rsqrt_acc(m[0][e] * inv_n + A(a.eps));
      c1[e] = rms ? A(0) : m[2][e] * inv_n;
      c2[e] = rstd[e] * m[1][e] * inv_n;  // mean(g * xhat)
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t j = ty + int64_t(k) * tyn;
      if (j < a.n) {
        const V xk = s[k * S], gk = s[(K + k) * S];
        A out[VEC];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A dy = A(to_acc(gk.v[e]));
          const A xhat = ((A(to_acc(xk.v[e])) - shift[e]) - mean[0][e]) * rstd[e];
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
  cp_async_wait_all();  // (only empty groups are left: the copies past the last tile were not issued)
  if (a.dw_part == nullptr && a.db_part == nullptr) return;
  group_sums(dw, tx, static_cast<A*>(nullptr));
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
// not fit. FASTNORM_CHANNEL_STAGED=0 / 1 (read at each call, for tests and A/B runs): the register kernel / the
// staged one on every call it can take.
struct ChannelTilePlan {
  int tx, k, grid;
  size_t smem;
  bool staged;  // channel_backward_staged_kernel, else channel_backward_tile_kernel
};

// FASTNORM_CHANNEL_BWD (read at each call, for A/B runs): 0 forces the two-kernel path, 1/2/4 caps K
// (fewer channels a thread: narrower tiles, more blocks an SM).
static inline int channel_backward_override() {
  return int(env_int("FASTNORM_CHANNEL_BWD", -1));
}

template <typename T, typename W, int VEC, int K>
static inline const void* channel_tile_kernel_of(int k, bool staged) {
  if constexpr (K > kChannelTileMaxK) {
    return nullptr;
  } else {
    if (k != K) return channel_tile_kernel_of<T, W, VEC, K * 2>(k, staged);
    if constexpr (sizeof(Vec<T, VEC>) >= 4) {
      if (staged) return reinterpret_cast<const void*>(channel_backward_staged_kernel<T, W, VEC, K, kChannelStages>);
    }
    return reinterpret_cast<const void*>(channel_backward_tile_kernel<T, W, VEC, K>);
  }
}

template <typename T, typename W, int VEC>
static inline ChannelTilePlan plan_channel_tile(const NormBackwardParams& p) {
  using A = typename AccOf<T>::type;
  const ChannelTilePlan none{0, 0, 0, 0, false};
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
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t tiles = p.outer * ((p.inner + cols - 1) / cols);
  const auto plan = [&](bool staged) {
    const void* kernel = channel_tile_kernel_of<T, W, VEC, 1>(k, staged);
    // The column sums' rows and totals (3 sums; the staged kernel's RMSNorm 2), then the staged kernel's ring.
    size_t smem = size_t((staged && p.rms ? 2 : 3) * (kChannelTileThreads + 32)) * sizeof(ColumnSums<A, VEC>);
    if (staged) {
      smem += size_t(kChannelStages) * (2 * k + (p.rms ? 0 : 1)) * kChannelTileThreads * sizeof(Vec<T, VEC>);
      static bool allowed[kChannelTileMaxK + 1] = {};
      if (!allowed[k]) allow_smem(kernel), allowed[k] = true;
    }
    const int64_t resident = int64_t(blocks_per_sm(kernel, kChannelTileThreads, smem)) * device_info().sms;
    return ChannelTilePlan{resident > 0 ? tx : 0, resident > 0 ? k : 0, int(tiles < resident ? tiles : resident), smem,
                           staged};
  };
  // The staged kernel where its blocks take 4 tiles or more: its first tile's copies are not overlapped, and on fewer
  // tiles the register kernel was level or faster (H200: fp32 RMS 8x32x64x64, 1 tile a block, 12.7 against 13.3 us;
  // fp16 LN 64x128x28x28, 3, 35.1 / 36.0; fp32 LN 16x96x56x56, 6, 30.4 / 28.3).
  const int64_t forced = env_int("FASTNORM_CHANNEL_STAGED", -1);
  if (sizeof(Vec<T, VEC>) >= 4 && forced != 0) {
    const ChannelTilePlan staged = plan(true);
    if (staged.k > 0 && (forced == 1 || tiles >= 4 * int64_t(staged.grid))) return staged;
  }
  const ChannelTilePlan in_registers = plan(false);
  return in_registers.k > 0 ? in_registers : none;
}

template <typename T, typename W, int VEC>
static inline const char* launch_channel_tile(const NormBackwardParams& p, const ChannelTilePlan& plan, void* dw_part,
                                              void* db_part, cudaStream_t stream) {
  BackwardArgs<T, W> a{static_cast<const T*>(p.x), static_cast<const T*>(p.dy), static_cast<const W*>(p.weight),
                       static_cast<T*>(p.dx), static_cast<const T*>(p.dx_add), p.outer, p.n, p.inner, p.x_outer_stride, p.eps, p.rms, dw_part, db_part};
  const void* kernel = channel_tile_kernel_of<T, W, VEC, 1>(plan.k, plan.staged);
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
