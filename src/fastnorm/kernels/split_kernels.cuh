// The split kernels: long rows split over several blocks that meet behind a per-row barrier in
// global memory (cooperative launch). Planned and launched by planner.cuh (plan_rows).
#pragma once
#include "cuda_rows.cuh"

namespace fastnorm {

// Rows whose slices are too many to be resident with a cache: each block reads its slice twice (the
// second time mostly from L2), the row's partial statistics merged by a block reduction.
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kMaxRowThreads, MinBlocksOf<T>::value) split_row_norm_kernel(RowArgs<T, W> a, int g, int slots,
                                                                            SplitWorkspace ws) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  __shared__ Stats<A> red[32];
  __shared__ Affine<A> row_affine;
  const bool rms = a.rms;
  const int slot = blockIdx.x / g, part = blockIdx.x % g;
  if (slot >= slots) return;  // whole block leaves: it takes part in no barrier
  const int64_t nvec = a.n / VEC;
  const int64_t per_block = (nvec + g - 1) / g;
  const int64_t v0 = min(nvec, part * per_block), v1 = min(nvec, v0 + per_block);
  auto* partials = reinterpret_cast<Stats<A>*>(ws.partials);
  // Column offsets in apply() are relative to v0, hence the shifted parameters. Later waves re-read
  // them: keep them in L2 until the last one.
  const W* w = a.w ? a.w + v0 * VEC : a.w;
  const W* b = a.b ? a.b + v0 * VEC : a.b;
  int wave = 0;
  for (int64_t row = slot; row < a.rows; row += slots, ++wave) {
    const V* xv = reinterpret_cast<const V*>(a.x + row * a.x_stride);
    V* yv = reinterpret_cast<V*>(a.y + row * a.n);
    const A shift = rms ? A(0) : A(to_acc(a.x[row * a.x_stride]));  // the same in every block of the row
    RowSlice<A, T, VEC> slice{v0, v1, int(threadIdx.x), int(blockDim.x)};
    const Stats<A> s = group_reduce(slice.stats(xv, rms, shift), blockDim.x, rms, red);
    Stats<A>* mine = partials + (size_t(wave & 1) * slots + slot) * g;
    publish_and_wait(mine + part, s, ws.arrivals + slot, unsigned(g) * unsigned(wave + 1));
    Stats<A> total{A(0), A(0), A(0)};
    for (int i = threadIdx.x; i < g; i += blockDim.x) {
      const Stats<A> q{__ldcg(&mine[i].n), __ldcg(&mine[i].mean), __ldcg(&mine[i].m2)};
      total = merge(total, q, rms);
    }
    total = group_reduce(total, blockDim.x, rms, red);
    if (threadIdx.x == 0) row_affine = finalize(total, a.n, a.eps, rms, shift);
    __syncthreads();
    if (slots < a.rows) slice.template apply<true>(xv, yv, w, b, row_affine);
    else slice.template apply<false>(xv, yv, w, b, row_affine);
  }
  if (slots < a.rows) {
    const int64_t bytes = (v1 - v0) * VEC * int64_t(sizeof(W));
    if (a.w) release_params(a.w + v0 * VEC, bytes);
    if (a.b) release_params(a.b + v0 * VEC, bytes);
  }
}

// Split rows with cached slices (shared memory), their statistics taken as the cluster kernel does:
// plain sums over the block's slice (a rough mean, then the corrected two-pass sums), then every warp
// merges the g slice partials with Chan's formula, without a block barrier. The partials meet in
// global memory behind the slot's arrival counter. Plain loads and stores, and no prefetch of the
// next row into L2 during the barrier: H100, same process, against the previous split kernel (exact
// per-thread statistics merged by block reductions, evict-first x and y, evict-last parameters, the
// L2 prefetch): fp32 256x262144 LN 67 -> 85% of copy, RMS 81.6 -> 88.5; 128x524288 67 -> 81, 80 -> 85;
// bf16 128x524288 55 -> 74, 72 -> 81.6. (The new statistics with the old hints and prefetch: 76 / 80.5;
// hints without the prefetch: 82 / 86.)
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kMaxRowThreads, ClusterBlocksOf<T>::value) split_slice_kernel(RowArgs<T, W> a, int g, int slots,
                                                                                 SplitWorkspace ws) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ A sums[2][64];
  const int slot = blockIdx.x / g, part = blockIdx.x % g;
  if (slot >= slots) return;  // whole block leaves: it takes part in no barrier
  const int64_t nvec = a.n / VEC;
  const int64_t per_block = (nvec + g - 1) / g;
  const int64_t v0 = min(nvec, part * per_block), v1 = min(nvec, v0 + per_block);
  BlockSlice<A, T, W, VEC> slice(a, v0, v1, dyn_smem);
  if (slots >= a.rows) slice.prefetch_params();  // a row a block
  const int t = threadIdx.x, lane = t & 31;
  const bool rms = a.rms;
  auto* partials = reinterpret_cast<Stats<A>*>(ws.partials);
  int buf = 0, wave = 0;
  for (int64_t row = slot; row < a.rows; row += slots, ++wave) {
    const A shift = rms ? A(0) : A(to_acc(a.x[row * a.x_stride]));  // the same in every block of the row
    cache_own_vectors<false>(slice.cache, reinterpret_cast<const V*>(a.x + row * a.x_stride) + v0, t, slice.sh,
                             slice.count);
    const Stats<A> s = slice.stats(a, shift, sums, buf);
    // The partials of a wave are read before any block arrives at the next wave's counter (the
    // block barriers of its statistics come first), so two buffers, by wave parity, suffice.
    Stats<A>* mine = partials + (size_t(wave & 1) * slots + slot) * g;
    publish_and_wait(mine + part, s, ws.arrivals + slot, unsigned(g) * unsigned(wave + 1));
    Stats<A> row_stats{A(0), A(0), A(0)};
    for (int i = lane; i < g; i += 32) {
      row_stats = merge(row_stats, Stats<A>{__ldcg(&mine[i].n), __ldcg(&mine[i].mean), __ldcg(&mine[i].m2)}, rms);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) row_stats = merge(row_stats, shfl_xor(row_stats, off), rms);
    slice.store(a, row, finalize(row_stats, a.n, a.eps, rms, shift));
  }
}

}  // namespace fastnorm
