// The row kernel: last-dim rows of up to 96 KB, a group of 1-512 threads per row.
#pragma once
#include "cuda_rows.cuh"

namespace fastnorm {

// The uncached kernel over scalar 2-byte rows (a fallback: such rows are cached, or split where they
// do not fit) is one block an SM: at two, ptxas spilled it at 64 registers (4 bytes) on any change to
// the other kernels of its translation unit.
template <typename T, int VEC>
constexpr int kUncachedRowBlocks = VEC == 1 && sizeof(T) == 2 ? 1 : MinBlocksOf<T>::value;

// One row per group of `tpr` threads, blockDim / tpr rows per block; `cache_vec` vectors of shared
// memory per row (0: no cache, x is read twice; scalar rows cache the 16-byte granules that hold
// them: cache_row_granules). With a.stats (training) each row's affine map is saved for the backward.
// Cached rows take their statistics in passes over shared memory, each ending in one plain sum
// over the group: a rough mean c, then the corrected two-pass sums of d = x - c and d * d give the
// variance and the exact mean (c plus a small correction), however far the mean is from zero.
// Cheaper than merging (count, mean, M2) triples, whose divisions made up a tenth of the bf16
// kernel's instructions, and as accurate. The rough mean c is that of each thread's first vector only
// (scalar rows: of the whole row; the subset spilled there): a pass over a quarter of the row at 4
// vectors a thread. A subset of a fraction f of the row has (mean_f - mean)^2 <= var (1 - f) / f, so the
// sum of d * d is at most n var / f and the corrected sums cancel little (1 / f: the vectors a thread,
// at most 4 but under a tuning override of the threads).
// kK > 0: a thread holds at most kK vectors of its row, so the copy and the statistics' passes unroll
// whole, with no loop counters or remainders (the output's loop unrolled too spilled at 32 registers);
// kExact: exactly kK (n == kK * tpr * VEC; a group past the last row reads row 0 and stores nothing), so
// no thread tests its count either (the tests cost 3.4 us of 74 on bf16 16384x4096 LayerNorm). The row
// kernel's instructions were the 2-byte rows' limit on the H200 (ncu: issue slots 79% busy on bf16
// 65536x1024 LayerNorm). H200, LayerNorm (results/h200-row-count-bound.txt): bf16 16384x4096 78.8 -> 70.8
// us, 65536x1024 73.7 -> 70.8, fp32 122227x36 18.6 -> 16.9, fp16 300000x48 27.3 -> 24.0. (Holding the
// vectors in registers instead, plain loads and the output unrolled: level or up to 15% slower.)
template <typename T, typename W, int VEC, bool kCached, bool kMore = false, int kK = 0, bool kExact = false>
__global__ void __launch_bounds__(kMaxRowThreads, kCached ? kCachedRowBlocks<T, W, kMore> : kUncachedRowBlocks<T, VEC>) row_norm_kernel(RowArgs<T, W> a, int64_t cache_vec, int grid_store) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  static_assert(kK == 0 || (kCached && VEC > 1), "count bounds are for cached vector rows");
  static_assert(!kExact || kK > 0, "exact counts need a bound");
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ Stats<A> red[32];
  __shared__ A sums[2][64];
  int buf = 0;
  const int tpr = a.tpr, sh = __ffs(tpr) - 1;  // tpr is a power of two: shifts, not divisions
  const int rows_per_block = blockDim.x >> sh;
  const int group = threadIdx.x >> sh, t = threadIdx.x & (tpr - 1);
  const bool rms = a.rms;
  const int64_t nvec = a.n / VEC;
  const A inv_n = A(1) / A(a.n);
  // 1 / the elements of the rough mean's subset: the first vector of each thread that has one
  const A inv_first = VEC > 1 ? A(1) / A((nvec < tpr ? nvec : tpr) * VEC) : A(0);
  V* group_cache = kCached ? reinterpret_cast<V*>(dyn_smem) + group * cache_vec : nullptr;
  for (int64_t base = int64_t(blockIdx.x) * rows_per_block; base < a.rows;
       base += int64_t(gridDim.x) * rows_per_block) {
    const int64_t row = base + group;
    const bool active = row < a.rows;
    const V* xv = reinterpret_cast<const V*>(a.x + (active ? row : 0) * a.x_stride);
    V* yv = reinterpret_cast<V*>(a.y + (active ? row : 0) * a.n);
    if constexpr (kCached) {
      // This thread's vectors: t + (k << sh) for k < count (a cached row holds at most kRowCacheBytes).
      const int m = kExact || active ? int(nvec) : 0;
      const int count = kExact ? kK : m > t ? ((m - 1 - t) >> sh) + 1 : 0;
      V* cache = group_cache;
      if constexpr (VEC == 1) {
        cache = cache_row_granules(group_cache, reinterpret_cast<const T*>(xv), m, t, tpr);
      } else {
        cache_own_vectors<false, kK, kExact>(cache, xv, t, sh, count);
      }
      A total[1];
      if (rms) total[0] = cached_square_sum<A, kK, kExact>(cache, t, sh, count);
      else if constexpr (VEC == 1) total[0] = cached_scaled_sum(cache, t, sh, count, inv_n);  // (the subset spilled)
      else total[0] = cached_scaled_sum<1, kExact>(cache, t, sh, count, inv_first);
      group_sums(total, tpr, sums[buf]);
      buf ^= 1;
      Affine<A> st;
      if (rms) {
        st = affine_of(A(0), A(0), total[0] * inv_n, a.eps, true);
      } else {
        const A c = total[0];
        A dev[2];
        cached_deviation_sums<kK, kExact>(cache, t, sh, count, c, dev);
        group_sums(dev, tpr, sums[buf]);
        buf ^= 1;
        const A mean_d = dev[0] * inv_n;  // the small correction of c, exact enough in a plain sum
        st = affine_of(c, mean_d, corrected_variance(mean_d, dev[1] * inv_n), a.eps, false);
      }
      if (a.stats && active && t == 0) save_affine(a.stats, row, st);
      if constexpr (VEC == 1 && !kMore) {  // (at the 32 registers of kMore it spilled)
        if (grid_store) {
          store_granule_row(cache, reinterpret_cast<T*>(yv), m, a.w, a.b, st, rms, t, tpr);
          continue;
        }
      }
      if (!kExact || active) store_own_vectors<false, kExact ? kK : 0>(cache, yv, a.w, a.b, st, t, sh, count, rms);
    } else {
      const A shift = (active && !rms) ? A(to_acc(a.x[row * a.x_stride])) : A(0);
      RowSlice<A, T, VEC, false> slice{0, active ? nvec : 0, t, tpr};
      const Stats<A> s = group_reduce(slice.stats(xv, rms, shift), tpr, rms, red);
      const Affine<A> st = finalize(s, a.n, a.eps, rms, shift);
      if (a.stats && active && t == 0) save_affine(a.stats, row, st);
      if (active) slice.template apply<false>(xv, yv, a.w, a.b, st);
    }
  }
}

}  // namespace fastnorm
