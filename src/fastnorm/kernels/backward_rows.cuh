// The fused backward of last-dim rows: x and dy read once, dx written once, dweight / dbias summed in
// registers across the rows a block handles (a persistent grid), then one partial per block. A block
// holds rows of up to 1024 threads x 8 elements (4 in fp64; 16 in 2-byte rows without dbias, whose
// registers hold dweight sums only, or whose dbias sums live in shared memory: kDb); rows up to twice
// that are split over a
// thread-block cluster of two blocks (Hopper; FASTNORM_ROW_BWD_SPLIT forces up to 8), which exchange
// their row sums through distributed shared memory: one read of x and dy instead of the long-row
// path's two (H100 backward, fp32 4096x16384: 483 -> 402 us LayerNorm, 478 -> 359 RMSNorm).
// On the H200 short 2-byte rows left it issue-bound (ncu: issue slots 70% busy, twice inductor's
// instructions for the same bytes): every instruction a row counts there (see the copy loop and dx_add below;
// benchmarks/sass_loops.py shows what a change leaves in the loop).
//
// A group of `tpr` threads takes a row (a power of two, blockDim / tpr rows per block; or, from 160
// threads a row on, one row a block of just enough warps); thread t owns vectors t, t + tpr, ... (at
// most K), copied with cp.async into shared memory as the forward
// row kernel does, so all of a thread's loads are in flight and no registers hold them. The copies
// run `stages - 1` rows ahead in a ring of buffers (3 by default: LayerNorm needs the next row on chip,
// see below; 2, 3 and 4 measured alike on the H100, so the depth is not what limits the kernel: ncu
// shows it issue-bound, 0.75 warps issued a cycle per scheduler at 50% occupancy). The row's
// statistics are recomputed from the cached row as the forward row kernel takes them (a rough mean,
// then the corrected two-pass sums), in the same pass as the sums of g and g * (x - c). A thread's
// columns are the same in every row, so its dweight / dbias sums stay in registers. (Sums in each
// thread's own shared-memory slots instead, which would free the registers for 16-32 elements a
// thread, measured slower on the H100: bf16 16384x4096 LN 218 -> 270 us, RMS 172 -> 216, 65536x1024
// LN 198 -> 253, even with conflict-free element-major slots; vector-major slots took 413 us. The
// dbias sums alone there, so that 2-byte rows take 16 elements a thread, win: kDbSmem.)
// (LayerNorm's two reductions, a rough mean then the corrected sums, measured faster than one
// reduction of per-thread exact moments merged with Chan's formula: bf16 16384x4096 218 against 349 us,
// 65536x1024 198 against 390: the divisions in every merge step of the shuffle tree cost more than the
// second reduction's barrier.)
#pragma once
#include <cstdlib>
#include <mutex>

#include "backward_common.cuh"
#include "cuda_cluster.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int kBackwardRowThreads = 1024;    // threads a row, at most
// Elements a thread owns, at most: 8 (4 in float64), whose dweight / dbias sums fit 64 registers
// (16 spilled). 2-byte rows take 16 where the dweight sums alone are in registers (kDb below).
// Where the row backward keeps its dbias sums (kDb): none asked (RMSNorm, LayerNorm without bias),
// registers, or each thread's own shared-memory slots.
constexpr int kDbNone = 0, kDbRegs = 1, kDbSmem = 2;
template <typename T, int kDb = kDbRegs>
constexpr int kBackwardThreadElems = sizeof(T) == 8 ? 4 : sizeof(T) == 2 && kDb != kDbRegs ? 16 : 8;
// Elements a thread owns, at most, where it holds a row's g and xhat in registers (kHold: saved
// statistics, dbias sums in registers or none).
constexpr int kBackwardHoldElems = 8;
constexpr int64_t kBackwardRowSmem = 200 << 10;  // x and dy of a block's rows, all stages (+ kDbSmem's slots), at most
constexpr int kBackwardRowMaxStages = 4;
constexpr int kBackwardMaxCluster = 8;  // blocks a row, at most (the portable cluster size)

// Waits until at most `pending` (0-3) of the thread's copy groups are still in flight.
__device__ __forceinline__ void cp_async_wait_pending(int pending) {
  if (pending >= 3) cp_async_wait_group<3>();
  else if (pending == 2) cp_async_wait_group<2>();
  else if (pending == 1) cp_async_wait_group<1>();
  else cp_async_wait_all();
}

// group_sums for groups of whole warps (tpr >= 64), with fewer shuffles in the warp step: a
// reduce-scatter. At xor distance 16 a lane keeps half of the first four values (by its bit 4) and
// sends the other half, at distance 8 a quarter (bit 3); the rest of the tree adds one value. Four
// values take 2 + 1 + 3 shuffles instead of 20 (a fifth takes its own 5). Lane l then holds the warp's
// total of value 2 * bit4 + bit3 (N = 2: value bit4), which lanes 0, 8, 16 and 24 (0 and 16) write; the
// step across warps is group_sums'. The sums come out in another order than group_sums' (the same in
// every thread, so a row's coefficients still agree across its threads and blocks).
template <int N, typename A>
__device__ __forceinline__ void warp_scatter_group_sums(A (&v)[N], int tpr, A* smem) {
  static_assert(N == 2 || N == 5, "reduce-scatter of the row backward's 2 or 5 sums");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool hi = lane & 16, mid = lane & 8;
  A mine;  // this lane's share after the scatter
  if constexpr (N == 5) {
    A keep0 = hi ? v[2] : v[0], keep1 = hi ? v[3] : v[1];
    keep0 += __shfl_xor_sync(0xffffffffu, hi ? v[0] : v[2], 16);
    keep1 += __shfl_xor_sync(0xffffffffu, hi ? v[1] : v[3], 16);
    mine = mid ? keep1 : keep0;
    mine += __shfl_xor_sync(0xffffffffu, mid ? keep0 : keep1, 8);
#pragma unroll
    for (int off = 4; off > 0; off >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, off);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v[4] += __shfl_xor_sync(0xffffffffu, v[4], off);
    if ((lane & 7) == 0) smem[((hi ? 2 : 0) + (mid ? 1 : 0)) * 32 + warp] = mine;
    if (lane == 0) smem[4 * 32 + warp] = v[4];
  } else {
    mine = hi ? v[1] : v[0];
    mine += __shfl_xor_sync(0xffffffffu, hi ? v[0] : v[1], 16);
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) mine += __shfl_xor_sync(0xffffffffu, mine, off);
    if ((lane & 15) == 0) smem[(hi ? 1 : 0) * 32 + warp] = mine;
  }
  __syncthreads();
  const int warps_per_group = tpr >> 5;
  const int src = (warp & ~(warps_per_group - 1)) + (lane & (warps_per_group - 1));
#pragma unroll
  for (int k = 0; k < N; ++k) v[k] = smem[k * 32 + src];
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    if (off < warps_per_group) {
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
    }
  }
}

// Sums over a whole row: its group's (tpr: a power of two), then (a row split over a cluster of g blocks) the g blocks'
// totals through distributed shared memory. Lanes 0..g-1 of every warp gather them in rank order and
// an xor tree adds them, so every thread of every block of the cluster ends with the same bits.
// `share` is this block's total, in one of two buffers used in turn: the next write to it comes two
// reductions later, after the next cluster barrier, which no block passes before it has read this one.
template <int N, typename A>
__device__ __forceinline__ void row_sums(A (&v)[N], int tpr, A* smem, int g, A* share) {
  if constexpr (N == 1) {
    group_sums(v, tpr, smem);
  } else {
    if (tpr >= 64) warp_scatter_group_sums(v, tpr, smem);
    else group_sums(v, tpr, smem);
  }
#ifdef FASTNORM_CLUSTERS
  if (g > 1) {
    if (threadIdx.x == 0) {
#pragma unroll
      for (int k = 0; k < N; ++k) share[k] = v[k];
    }
    cluster_sync();
    const int src = threadIdx.x & (kBackwardMaxCluster - 1);
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = src < g ? load_cluster(&share[k], unsigned(src)) : A(0);
#pragma unroll
    for (int off = kBackwardMaxCluster / 2; off > 0; off >>= 1) {
#pragma unroll
      for (int k = 0; k < N; ++k) v[k] += __shfl_xor_sync(0xffffffffu, v[k], off);
    }
  }
#endif
}

// Plain sum of scale * x over a thread's cached vectors t + k * tpr, k < count.
template <typename A, typename T, int VEC>
__device__ __forceinline__ A cached_row_sum(const Vec<T, VEC>* cache, int t, int tpr, int count, A scale) {
  A vals[VEC], s = A(0);
#pragma unroll 2
  for (int k = 0; k < count; ++k) {
    widen(cache[t + k * tpr].v, vals);
#pragma unroll
    for (int e = 0; e < VEC; ++e) s = fma(vals[e], scale, s);
  }
  return s;
}

// A row is split over the `split` blocks of a cluster (split > 1, one row a block) when it is too long
// for one block: block rank r takes vectors [r * slice_vec, (r + 1) * slice_vec) of every row of its cluster,
// its dweight / dbias sums are those columns of the cluster's partial, and the row sums meet through
// distributed shared memory (row_sums). Otherwise split = 1 and slice_vec is the row's vector count.
// (kSplit: compiled apart, so that the cluster exchange costs the other kernels no registers.)
// kSaved: the forward saved each row's affine map (a.affine): no statistics to take, so a row sums only
// g and g * xhat (RMSNorm: g * x) and needs no early rough mean.
// kDb: where the dbias sums (a.db_part) are kept; outside registers, the registers of the dbias sums hold
// twice the elements (2-byte rows). kDbSmem: slot (k * VEC + e) * blockDim.x + threadIdx.x of a float
// area after the copy ring (consecutive threads, consecutive banks).
template <typename T, typename W, int VEC, int K, bool kSplit, bool kSaved, int kDb>
__global__ void __launch_bounds__(kBackwardRowThreads, 1)
    row_backward_kernel(BackwardArgs<T, W> a, int tpr, int reduce_tpr, int stages, int split_arg, int slice_vec) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  // kHold: a row's g and xhat stay in registers from the sums pass to the dx pass, where dweight and
  // dbias are summed too: about 11 operations an element instead of 19 (x, dy and w loaded and
  // widened once, xhat and g computed once). Float accumulators only (float64 spilled); not in cluster-split
  // rows (H100: fp32 4096x16384 kernel 342 -> 364 us, bf16 LN 2048x12288 backward 85 -> 122).
  constexpr bool kHold = kSaved && !kSplit && kDb != kDbSmem && K * VEC <= kBackwardHoldElems && sizeof(A) == 4;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ A sums[2][5 * 32];
  __shared__ A share[2][8];  // this block's row sums for its cluster
  const int split = kSplit ? split_arg : 1;
  int buf = 0;  // which of the two buffers of sums and share the next row reduction takes
  // tpr: a power of two (rows_per_block rows a block) or the whole block (one row, any warp count).
  // The reductions take the whole block as a group of reduce_tpr (the next power of two) threads
  // whose missing warps add zeros.
  const int rows_per_block = blockDim.x / tpr;
  for (int j = threadIdx.x; j < 2 * 5 * 32; j += blockDim.x) {
    if ((j & 31) >= int(blockDim.x >> 5)) sums[0][j] = A(0);
  }
  const int group = threadIdx.x / tpr;
  const bool rms = a.rms, has_w = a.w != nullptr;
  const int v0 = int(blockIdx.x % split) * slice_vec;  // this block's first vector of a row
  // The thread's vectors of a row are t + k * tpr, k < count (t counted from the row's start: one
  // index serves global and shared memory, which is offset by v0 below; a second one spilled).
  int t, count;
  {
    const int local = threadIdx.x - group * tpr, nvec = min(int(a.n / VEC) - v0, slice_vec);
    count = nvec > local ? (nvec - 1 - local) / tpr + 1 : 0;  // at most K
    t = v0 + local;
  }
  // `stages` buffers of (x, dy) per row group: the next rows' copies are in flight while this one is
  // processed (each thread copies, and reads back, only its own vectors: no barrier needed).
  V* slots = reinterpret_cast<V*>(dyn_smem) + (int64_t(group) * 2 * stages * slice_vec - v0);
  const A inv_n = A(1) / A(a.n);
  A dw[K][VEC], db[K][VEC];
  A* db_slots = reinterpret_cast<A*>(dyn_smem + int64_t(rows_per_block) * 2 * stages * slice_vec * int64_t(sizeof(V)));
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      dw[k][e] = A(0), db[k][e] = A(0);
      if constexpr (kDb == kDbSmem) db_slots[(k * VEC + e) * blockDim.x + threadIdx.x] = A(0);
    }
  }
  const int64_t clusters = gridDim.x / split;
  const int64_t step = clusters * rows_per_block;
  // Issues the copies of `row` (nothing past the last row) into buffer `slot` as one group.
  auto stage = [&](int64_t row, int slot) {
    const int c = row < a.outer ? count : 0;
    const V* xv = reinterpret_cast<const V*>(a.x + (c ? row : 0) * a.x_stride);
    const V* gv = reinterpret_cast<const V*>(a.dy + (c ? row : 0) * a.n);
    V* xs = slots + int64_t(slot) * 2 * slice_vec;
    // c <= K: unrolled, without a remainder loop (split kernels of half rows with float32 weights keep the
    // loop: unrolled, they spilled 4 bytes)
#pragma unroll
    for (int k = 0; k < (kSplit && !std::is_same<T, W>::value ? c : K); ++k) {
      if (k >= c) break;
      const int i = t + k * tpr;
      if constexpr (sizeof(V) >= 4) {
        cp_async<int(sizeof(V)), false>(xs + i, xv + i);
        cp_async<int(sizeof(V)), false>(xs + slice_vec + i, gv + i);
      } else {
        xs[i] = xv[i];
        xs[slice_vec + i] = gv[i];
      }
    }
    cp_async_commit();
  };
  const int64_t first = int64_t(blockIdx.x / split) * rows_per_block;
  for (int s = 0; s + 1 < stages; ++s) stage(first + group + s * step, s);
  // LayerNorm's rough mean c (one plain sum of x / n) of each row is taken one row early, in the
  // same block reduction as the previous row's sums (one barrier a row instead of two); so LayerNorm
  // waits for two rows to have landed and needs three buffers or more. Here: the first row's.
  A center = A(0);
  if (!rms && !kSaved) {
    cp_async_wait_pending(stages - 2);
    A total[1] = {cached_row_sum(slots, t, tpr, first + group < a.outer ? count : 0, inv_n)};
    row_sums(total, reduce_tpr, sums[buf], split, share[buf]);
    buf ^= 1;
    center = total[0];
  }
  // Saved statistics: the next row's affine map is loaded one row ahead (a load from DRAM on every
  // row's critical path took LayerNorm bf16 8192x5120 from 144 to 156 us).
  Affine<A> ahead{};
  if constexpr (kSaved) ahead = load_affine<A>(a.affine, first + group < a.outer ? first + group : 0);
  int slot = 0;
  for (int64_t base = first; base < a.outer; base += step, slot = slot + 1 == stages ? 0 : slot + 1) {
    const int64_t row = base + group;
    const int c = row < a.outer ? count : 0;
    // The slot refilled is the one the previous row used (the same thread's vectors: already read).
    stage(row + (stages - 1) * step, slot == 0 ? stages - 1 : slot - 1);
    GradCoeffs<A> co;
    if constexpr (kSaved) {
      co.st = ahead;
      ahead = load_affine<A>(a.affine, row + step < a.outer ? row + step : 0);
    }
    // This row's group has landed (LayerNorm: the next row's too); the later ones may be in flight.
    cp_async_wait_pending(rms || kSaved ? stages - 1 : stages - 2);
    const V* xc = slots + int64_t(slot) * 2 * slice_vec;
    const V* gc = xc + slice_vec;
    // With saved statistics: the row's c1 and c2 from the thread's sums of g and of g * xhat (RMSNorm: only
    // the second, times rms_scale: 1 where it summed g * xhat, rstd where it summed g * x).
    auto saved_coeffs = [&](A(&m)[2], A rms_scale) {
      if (rms) {
        A one[1] = {m[1]};
        row_sums(one, reduce_tpr, sums[buf], split, share[buf]);
        co.c1 = A(0);
        co.c2 = rms_scale * one[0] * inv_n;
      } else {
        row_sums(m, reduce_tpr, sums[buf], split, share[buf]);
        co.c1 = m[0] * inv_n;
        co.c2 = m[1] * inv_n;
      }
    };
    if constexpr (kHold) {
      // sum g and sum g * xhat (RMSNorm's map has center and offset 0: xhat = x * rstd, the same bits).
      A m[2] = {A(0), A(0)}, gk[K][VEC], xh[K][VEC];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (k >= c) break;
        const int i = t + k * tpr;
        A xs[VEC], gs[VEC], wv[VEC];
        widen(xc[i].v, xs);
        widen(gc[i].v, gs);
        if (has_w) {
          load_params<false, VEC>(a.w + int64_t(i) * VEC, wv);
        } else {
#pragma unroll
          for (int e = 0; e < VEC; ++e) wv[e] = A(1);
        }
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          xh[k][e] = normalized(xs[e], co.st);
          gk[k][e] = gs[e] * wv[e];
          m[0] += gk[k][e];
          m[1] = fma(gk[k][e], xh[k][e], m[1]);
          dw[k][e] = fma(gs[e], xh[k][e], dw[k][e]);
          if constexpr (kDb == kDbRegs) db[k][e] += gs[e];
        }
      }
      saved_coeffs(m, A(1));
      buf ^= 1;
      if (a.dx == nullptr) continue;
      const A k1 = -co.st.rstd * co.c1, k2 = -co.st.rstd * co.c2;
      const int64_t offset = (c ? row : 0) * a.n;
      V* dxv = reinterpret_cast<V*>(a.dx + offset);
      // The fused residual's dx_add in a branch of its own: predicated into the plain store, its loads,
      // widening and adds were issued (and its address computed) on every row of every call.
      auto store_dx = [&](const T* add) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if (k >= c) break;
          const int i = t + k * tpr;
          A out[VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e) out[e] = fma(gk[k][e], co.st.rstd, fma(xh[k][e], k2, k1));
          add_gradient(add, i, out);
          store_vec<false>(dxv + i, pack<T>(out));
        }
      };
      if (__builtin_expect(a.dx_add != nullptr, 0)) store_dx(a.dx_add + offset);
      else store_dx(nullptr);
      continue;
    }
    if constexpr (kSaved) {
      // sum g and sum g * xhat (RMSNorm: sum g * x, and xhat = x * rstd).
      A m[2] = {A(0), A(0)};
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (k >= c) break;
        const int i = t + k * tpr;
        A xs[VEC], gs[VEC], wv[VEC];
        widen(xc[i].v, xs);
        widen(gc[i].v, gs);
        if (has_w) load_params<false, VEC>(a.w + int64_t(i) * VEC, wv);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A g = has_w ? gs[e] * wv[e] : gs[e];
          if (rms) {
            m[1] = fma(g, xs[e], m[1]);
          } else {
            m[0] += g;
            m[1] = fma(g, normalized(xs[e], co.st), m[1]);
          }
        }
      }
      saved_coeffs(m, co.st.rstd);
    } else {
      // One pass for the corrected sums of d = x - c and d^2 (RMSNorm: x^2) and the sums of g and
      // g * d; LayerNorm adds the next row's plain sum of x / n.
      A m[5] = {A(0), A(0), A(0), A(0), A(0)};  // sum d, sum d^2, sum g, sum g * d, next row's sum x / n
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (k >= c) break;
        const int i = t + k * tpr;
        A xs[VEC], gs[VEC], wv[VEC];
        widen(xc[i].v, xs);
        widen(gc[i].v, gs);
        if (has_w) load_params<false, VEC>(a.w + int64_t(i) * VEC, wv);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A d = xs[e] - center, g = has_w ? gs[e] * wv[e] : gs[e];
          m[0] += d;
          m[1] = fma(d, d, m[1]);
          m[2] += g;
          m[3] = fma(g, d, m[3]);
        }
      }
      if (rms) {  // only the sums of x^2 and g * x enter RMSNorm's coefficients
        A two[2] = {m[1], m[3]};
        row_sums(two, reduce_tpr, sums[buf], split, share[buf]);
        m[1] = two[0], m[3] = two[1];
      } else {
        const int next = slot + 1 == stages ? 0 : slot + 1;
        m[4] = cached_row_sum(slots + int64_t(next) * 2 * slice_vec, t, tpr, row + step < a.outer ? count : 0, inv_n);
        row_sums(m, reduce_tpr, sums[buf], split, share[buf]);
      }
      if (rms) {
        co.st = affine_of(A(0), A(0), m[1] * inv_n, a.eps, true);
        co.c1 = A(0);
        co.c2 = co.st.rstd * m[3] * inv_n;
      } else {
        const A mean_d = m[0] * inv_n;
        co.st = affine_of(center, mean_d, corrected_variance(mean_d, m[1] * inv_n), a.eps, false);
        co.c1 = m[2] * inv_n;
        co.c2 = co.st.rstd * (m[3] * inv_n - mean_d * co.c1);
        center = m[4];
      }
    }
    buf ^= 1;
    // dx = rstd * g + (-rstd * c1 - rstd * c2 * xhat): two FMAs an element instead of three operations.
    const A k1 = -co.st.rstd * co.c1, k2 = -co.st.rstd * co.c2;
    V* dxv = reinterpret_cast<V*>(a.dx + (c ? row : 0) * a.n);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (k >= c) break;
      const int i = t + k * tpr;
      A xs[VEC], gs[VEC], wv[VEC], out[VEC];
      widen(xc[i].v, xs);
      widen(gc[i].v, gs);
      if (has_w) load_params<false, VEC>(a.w + int64_t(i) * VEC, wv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A xhat = normalized(xs[e], co.st);
        out[e] = fma(has_w ? gs[e] * wv[e] : gs[e], co.st.rstd, fma(xhat, k2, k1));
        dw[k][e] = fma(gs[e], xhat, dw[k][e]);
        if constexpr (kDb == kDbRegs) db[k][e] += gs[e];
        if constexpr (kDb == kDbSmem) db_slots[(k * VEC + e) * blockDim.x + threadIdx.x] += gs[e];
      }
      if (a.dx) {
        add_gradient(a.dx_add ? a.dx_add + (c ? row : 0) * a.n : nullptr, i, out);
        store_vec<false>(dxv + i, pack<T>(out));
      }
    }
  }
  // The block's partial (its cluster's, for its columns): its groups' sums added in group order
  // (through shared memory, which holds at least rows_per_block * n accumulator values: the buffers
  // are 2 * stages * n elements of T a row).
  cp_async_wait_all();  // the last (empty) stages
  A* red = reinterpret_cast<A*>(dyn_smem);
  for (int which = 0; which < (kDb != kDbNone ? 2 : 1); ++which) {
    A* out = static_cast<A*>(which == 0 ? a.dw_part : a.db_part);
    if (out == nullptr) continue;
    out += int64_t(blockIdx.x / split) * a.n;
    __syncthreads();  // the cache (or the previous round) is no longer read
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (k >= count) break;
      const int64_t col = int64_t(t + k * tpr) * VEC;
      Vec<A, VEC> v;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        v.v[e] = which == 0 ? dw[k][e] : db[k][e];
        if constexpr (kDb == kDbSmem) v.v[e] = which == 0 ? v.v[e] : db_slots[(k * VEC + e) * blockDim.x + threadIdx.x];
      }
      if (rows_per_block == 1) store_acc_vec(out + col, v);
      else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) red[group * a.n + col + e] = v.v[e];
      }
    }
    if (rows_per_block == 1) continue;
    __syncthreads();
    for (int64_t col = threadIdx.x; col < a.n; col += blockDim.x) {
      A s = A(0);
      for (int r = 0; r < rows_per_block; ++r) s += red[r * a.n + col];
      out[col] = s;
    }
  }
#ifdef FASTNORM_CLUSTERS
  if (split > 1) cluster_sync();  // no block may exit while another can still read its row sums
#endif
}

// How the row backward runs a call (tpr == 0: it does not take it). split > 1: a cluster of `split`
// blocks a row, `grid` / split clusters; parts: the dweight / dbias partials it writes (one a
// block, or a cluster).
struct RowBackwardPlan {
  int tpr, threads, k, grid, stages, split;
  int slice_vec;
  int64_t parts;
  size_t smem;
  bool saved;  // the kernel reads the forward's saved affine maps
  int db;      // where the kernel keeps its dbias sums (kDb)
};

// FASTNORM_ROW_BWD_STAGES (read at each call, for A/B runs): the row backward's buffers, 2-4 (LayerNorm
// takes at least 3).
static inline int row_backward_max_stages() {
  const int64_t v = env_int("FASTNORM_ROW_BWD_STAGES", 0);
  return v >= 2 && v <= kBackwardRowMaxStages ? int(v) : 3;
}

// FASTNORM_ROW_BWD_CLUSTER (read at each call, for A/B runs): the most blocks a row takes (2-8) before the
// long-row path takes it. H100, backward alone, 8 against 2 (session 32, float32 split kernels then holding
// g and xhat): RMS fp32 1024x65536 482 -> 467 us, bf16 257 -> 236, LN fp32 2048x32768 (4 blocks) 491 -> 465;
// but LN 1024x65536 fp32 496 -> 658, bf16 276 -> 567.
static inline int row_backward_most_blocks() {
  const int64_t v = env_int("FASTNORM_ROW_BWD_CLUSTER", 0);
  return v >= 2 && v <= kBackwardMaxCluster ? int(v) : 2;
}

// FASTNORM_ROW_BWD_SPLIT (read at each call, for A/B runs): blocks a row, at least the fewest that
// hold it and at most kBackwardMaxCluster.
static inline int row_backward_split(int least) {
  const int64_t v = env_int("FASTNORM_ROW_BWD_SPLIT", 0);
  return v > least && v <= kBackwardMaxCluster ? int(v) : least;
}

template <typename T, typename W, int VEC, int K, bool kSplit, bool kSaved, int kDb>
static inline const void* row_backward_kernel_ptr() {
  return reinterpret_cast<const void*>(row_backward_kernel<T, W, VEC, K, kSplit, kSaved, kDb>);
}

// Vectors a thread owns, at most (K in {1, 2, 4}, at most kBackwardThreadElems elements).
template <typename T, int VEC, int kDb = kDbRegs>
constexpr int row_backward_max_k() {
  constexpr int elems = kBackwardThreadElems<T, kDb>;
  return elems / VEC >= 4 ? 4 : elems / VEC >= 2 ? 2 : 1;
}

// Whether dbias outside registers gets kernels of its own: only where these own more vectors a thread
// (2-byte vector rows: 2 vectors of 8 instead of 1).
template <typename T, int VEC>
constexpr bool kWideKernels = row_backward_max_k<T, VEC, kDbNone>() != row_backward_max_k<T, VEC, kDbRegs>();

// The kernel for k vectors a thread; a split row always takes the one of K (the most).
template <typename T, typename W, int VEC, int K, bool kSaved, int kDb>
static inline const void* row_backward_kernel_for(int k, bool split) {
  if (split) return k == K ? row_backward_kernel_ptr<T, W, VEC, K, true, kSaved, kDb>() : nullptr;
  if constexpr (kDb == kDbSmem) {  // two vectors a thread only (one: the sums fit registers)
    return k == K ? row_backward_kernel_ptr<T, W, VEC, K, false, kSaved, kDb>() : nullptr;
  } else {
    if constexpr (K >= 4) {
      if (k == 4) return row_backward_kernel_ptr<T, W, VEC, 4, false, kSaved, kDb>();
    }
    if constexpr (K >= 2) {
      if (k == 2) return row_backward_kernel_ptr<T, W, VEC, 2, false, kSaved, kDb>();
    }
    return k == 1 ? row_backward_kernel_ptr<T, W, VEC, 1, false, kSaved, kDb>() : nullptr;
  }
}

// Saved statistics are read by the vector kernels only: the scalar ones (odd or misaligned rows)
// recompute them, which costs them no extra read (they are not compiled twice for so rare a case).
// FASTNORM_ROW_BWD_SAVED=0 (read at each call, for A/B runs) recomputes them anyway.
static inline bool row_backward_reads_saved() {
  return env_int("FASTNORM_ROW_BWD_SAVED", 1) != 0;
}

// FASTNORM_ROW_BWD_BIAS_FREE=0 (read at each call, for A/B runs): calls without dbias take the kernels
// that sum it (and discard the sums).
static inline bool row_backward_bias_free() {
  return env_int("FASTNORM_ROW_BWD_BIAS_FREE", 1) != 0;
}

// FASTNORM_ROW_BWD_DBIAS_SMEM=0 (read at each call, for A/B runs) keeps the dbias sums of 2-byte rows in
// registers, 8 elements a thread.
static inline bool row_backward_dbias_smem() {
  return env_int("FASTNORM_ROW_BWD_DBIAS_SMEM", 1) != 0;
}

template <typename T, typename W, int VEC, int kDb>
static inline const void* row_backward_kernel_of(int k, bool split, bool saved) {
  constexpr int K = row_backward_max_k<T, VEC, kDb>();
  if constexpr (VEC > 1) {
    if (saved) return row_backward_kernel_for<T, W, VEC, K, true, kDb>(k, split);
  }
  return row_backward_kernel_for<T, W, VEC, K, false, kDb>(k, split);
}

template <typename T, typename W, int VEC>
static inline const void* row_backward_kernel_of(int k, bool split, bool saved, int db) {
  if constexpr (kWideKernels<T, VEC>) {
    if (db == kDbNone) return row_backward_kernel_of<T, W, VEC, kDbNone>(k, split, saved);
    if (db == kDbSmem) return row_backward_kernel_of<T, W, VEC, kDbSmem>(k, split, saved);
  }
  return row_backward_kernel_of<T, W, VEC, kDbRegs>(k, split, saved);
}

static inline cudaLaunchConfig_t row_backward_config(const RowBackwardPlan& plan, cudaStream_t stream,
                                                     cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(plan.grid));
  cfg.blockDim = dim3(unsigned(plan.threads));
  cfg.dynamicSmemBytes = plan.smem;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = unsigned(plan.split);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = plan.split > 1 ? 1 : 0;
  return cfg;
}

// Clusters of the plan's shape the device holds at once (0: none fits), asked of the driver once
// per (kernel, shape).
static inline int row_backward_clusters(const void* kernel, const RowBackwardPlan& plan) {
  struct Entry { const void* kernel; int dev, threads, split; size_t smem; int clusters; };
  static Entry cache[32];
  static int used = 0;
  static std::mutex mutex;
  const std::lock_guard<std::mutex> lock(mutex);
  int dev = 0;
  cudaGetDevice(&dev);
  for (int i = 0; i < used; ++i) {
    const Entry& e = cache[i];
    if (e.kernel == kernel && e.dev == dev && e.threads == plan.threads && e.split == plan.split && e.smem == plan.smem)
      return e.clusters;
  }
  cudaLaunchAttribute attr;
  RowBackwardPlan one = plan;
  one.grid = plan.split;
  const cudaLaunchConfig_t cfg = row_backward_config(one, nullptr, &attr);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg) != cudaSuccess) {
    cudaGetLastError();  // no cluster support is not an error of the call: the long-row path takes it
    clusters = 0;
  }
  cache[used % 32] = Entry{kernel, dev, plan.threads, plan.split, plan.smem, clusters};
  used = used < 32 ? used + 1 : used;
  return clusters;
}

// Rows of up to 256 thread vectors take a power of two threads each, several rows a block; longer
// ones a block of just enough warps (640 for bf16 rows of 5120, where a power of two would leave 384
// threads idle), split over a cluster of blocks past kBackwardRowThreads x K vectors (Hopper).
template <typename T, typename W, int VEC>
static inline RowBackwardPlan plan_row_backward_db(const NormBackwardParams& p, int db, int max_k = 4) {
  using V = Vec<T, VEC>;
  using A = typename AccOf<T>::type;
  const RowBackwardPlan none{0, 0, 0, 0, 0, 0, 0, 0, 0, false, kDbRegs};
  const int kMaxK = std::min(max_k, db == kDbNone   ? row_backward_max_k<T, VEC, kDbNone>()
                                    : db == kDbSmem ? row_backward_max_k<T, VEC, kDbSmem>()
                                                    : row_backward_max_k<T, VEC, kDbRegs>());
  const int64_t nvec = p.n / VEC;
  const Device dev = device_info();
  const int64_t least = (nvec + int64_t(kBackwardRowThreads) * kMaxK - 1) / (int64_t(kBackwardRowThreads) * kMaxK);
  // Clusters are Hopper's. Rows of more than two blocks take the long-row path: split over 8 (fp32
  // 1024x65536) the row backward took 662 us against that path's 475 (H100; see FASTNORM_ROW_BWD_CLUSTER).
  if (least > row_backward_most_blocks() || (least > 1 && dev.major < 9)) return none;
  const int split = dev.major >= 9 ? row_backward_split(int(least)) : 1;
  const int64_t slice_vec = (nvec + split - 1) / split;
  int tpr = pow2_at_least((slice_vec + kMaxK - 1) / kMaxK), threads = 256;
  if (tpr > 128 || split > 1) threads = tpr = int(((slice_vec + kMaxK - 1) / kMaxK + 31) / 32 * 32);
  const int k = split > 1 ? kMaxK : pow2_at_least((slice_vec + tpr - 1) / tpr);
  const int64_t rows_per_block = threads / tpr;
  const int64_t stage_bytes = rows_per_block * 2 * slice_vec * int64_t(sizeof(V));  // x and dy of the block's rows
  const int64_t db_bytes = db == kDbSmem ? int64_t(threads) * k * VEC * int64_t(sizeof(A)) : 0;
  if (2 * stage_bytes + db_bytes > kBackwardRowSmem) return none;
  const bool saved = VEC > 1 && p.affine != nullptr && row_backward_reads_saved();
  const void* kernel = row_backward_kernel_of<T, W, VEC>(k, split > 1, saved, db);
  if (kernel == nullptr) return none;
  static bool smem_allowed[24] = {};
  const int which = (split > 1 ? 3 : k == 1 ? 0 : k == 2 ? 1 : 2) + (saved ? 4 : 0) + 8 * db;
  if (!smem_allowed[which]) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem));
    smem_allowed[which] = true;
  }
  const int per_sm = blocks_per_sm(kernel, threads, size_t(2 * stage_bytes + db_bytes));
  if (per_sm < 1) return none;
  // As many stages as fit without costing a resident block (registers limit the blocks first), at
  // least the 3 that LayerNorm's early rough mean needs (3 x 64 KB fit at most).
  const int fewest = p.rms || saved ? 2 : 3;
  int stages = std::max(row_backward_max_stages(), fewest);
  while (stages > fewest && (stages * stage_bytes + db_bytes > kBackwardRowSmem ||
                            blocks_per_sm(kernel, threads, size_t(stages * stage_bytes + db_bytes)) < per_sm)) --stages;
  if (stages * stage_bytes + db_bytes > kBackwardRowSmem) return none;
  RowBackwardPlan plan{tpr,   threads, k, 0, stages, split, int(slice_vec), 0, size_t(stages * stage_bytes + db_bytes),
                       saved, db};
  if (split > 1) {
    const int resident = row_backward_clusters(kernel, plan);
    if (resident < 1) return none;
    const int64_t clusters = std::min<int64_t>(p.outer, resident);
    plan.grid = int(clusters * split);
    plan.parts = clusters;
    return plan;
  }
  const int64_t blocks = (p.outer + rows_per_block - 1) / rows_per_block;
  const int64_t resident = int64_t(per_sm) * dev.sms;
  plan.grid = int(blocks < resident ? blocks : resident);
  plan.parts = plan.grid;
  return plan;
}

// Where the dbias sums go in 2-byte rows: nowhere without a dbias, else in shared memory, so that a
// thread owns 16 elements either way: one block, not a cluster of two, holds rows of 8193-16384 elements
// (and a 2-block cluster rows of up to 32768). H100, LayerNorm training step, shared memory against
// registers in one call: fp16 4096x14336 327.1 -> 277.0 us (backward kernel 231.5 -> 180.4), bf16
// 65536x1024 278.7 -> 265.1 (169.8 -> 160.1), 16384x4096 284.5 -> 282.0 (178.2 -> 173.6), 8192x5120
// 193.1 -> 196.1 (119.4 -> 119.3). Rows whose thread would own one vector keep the sums in registers.
//
// With saved statistics, 2-byte rows of up to 8192 elements take 8 elements a thread instead, whose g
// and xhat stay in registers (kHold). H100, backward alone, same process (both with the partials in
// 16-byte stores): bf16 LN 16384x4096 170.6 -> 164.8 us, 4096x2048 41.2 -> 33.0, 1024x8192 44.8 -> 36.7,
// 2048x5120 44.9 -> 38.9, RMS 4096x2048 38.1 -> 30.7. FASTNORM_ROW_BWD_HOLD=0 (read at each call, for A/B
// runs) keeps the 16-element kernels.
static inline bool row_backward_hold() {
  return env_int("FASTNORM_ROW_BWD_HOLD", 1) != 0;
}

template <typename T, typename W, int VEC>
static inline RowBackwardPlan plan_row_backward(const NormBackwardParams& p) {
  if constexpr (kWideKernels<T, VEC>) {
    if (p.affine != nullptr && row_backward_reads_saved() && row_backward_hold()) {
      const int db = p.dbias == nullptr && row_backward_bias_free() ? kDbNone : kDbRegs;
      const RowBackwardPlan plan = plan_row_backward_db<T, W, VEC>(p, db, std::max(1, kBackwardHoldElems / VEC));
      if (plan.tpr > 0 && plan.split == 1) return plan;
    }
    if (p.dbias == nullptr && row_backward_bias_free()) return plan_row_backward_db<T, W, VEC>(p, kDbNone);
    if (p.dbias != nullptr && row_backward_dbias_smem()) {
      const RowBackwardPlan plan = plan_row_backward_db<T, W, VEC>(p, kDbSmem);
      if (plan.tpr > 0) return plan;
    }
  }
  return plan_row_backward_db<T, W, VEC>(p, kDbRegs);
}

template <typename T, typename W, int VEC>
static inline const char* launch_row_backward(const NormBackwardParams& p, const RowBackwardPlan& plan, void* dw_part,
                                       void* db_part, cudaStream_t stream) {
  BackwardArgs<T, W> a{static_cast<const T*>(p.x), static_cast<const T*>(p.dy), static_cast<const W*>(p.weight),
                       static_cast<T*>(p.dx), static_cast<const T*>(p.dx_add), p.outer, p.n, 1, p.x_outer_stride, p.eps, p.rms, dw_part, db_part,
                       plan.saved ? p.affine : nullptr};
  const void* kernel = row_backward_kernel_of<T, W, VEC>(plan.k, plan.split > 1, plan.saved, plan.db);
  int tpr = plan.tpr, reduce_tpr = pow2_at_least(plan.tpr), stages = plan.stages, split = plan.split;
  int slice_vec = plan.slice_vec;
  void* args[] = {&a, &tpr, &reduce_tpr, &stages, &split, &slice_vec};
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = row_backward_config(plan, stream, &attr);
  const cudaError_t err = cudaLaunchKernelExC(&cfg, kernel, args);
  return launch_result(err);
}

}  // namespace fastnorm
