// The channel-axis kernels (inner > 1, e.g. the channels of NCHW): a thread per column for a few
// channels, tiles in shared memory or in registers for more; their launcher, which picks the widest
// access the addresses allow.
#pragma once
#include <algorithm>

#include "cuda_launch.cuh"
#include "cuda_stats.cuh"

namespace fastnorm {

// Channel vectors the register channel kernel holds per thread: 8 x 16 B for 4-byte types, 4 x 16 B
// for 2- and 8-byte types, which need more registers per element once converted.
template <typename T> constexpr int kCacheOf = sizeof(T) == 4 ? 8 : 4;

template <typename T, typename W>
struct StridedArgs {
  const T* x;
  T* y;
  const W* w;
  const W* b;
  int64_t outer, n, inner, x_outer_stride;
  double eps;
  int tx;  // threads along inner; blockDim.x / tx threads along the reduced axis
  int rms;
  // The column kernel: x's tail as rows of x_row elements x_row + x_pad apart (NormParams::x_row_stride; x_pad 0: a
  // contiguous tail), x_channel apart between channels.
  int64_t x_row, x_pad, x_channel;
};

// Combine per-column statistics across the tyn thread rows of a block (a tree in shared memory,
// red holds tyn x cols entries); every thread gets the totals of its VEC columns.
template <typename A, int VEC>
__device__ __forceinline__ void combine_columns(Stats<A>* red, Stats<A> (&s)[VEC], int ty, int tyn, int lane,
                                                int64_t cols, bool rms) {
  __syncthreads();  // red may still be read from the previous tile
#pragma unroll
  for (int e = 0; e < VEC; ++e) red[ty * cols + lane * VEC + e] = s[e];
  __syncthreads();
  for (int half = tyn / 2; half > 0; half >>= 1) {
    if (ty < half) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int64_t idx = ty * cols + lane * VEC + e;
        red[idx] = merge(red[idx], red[idx + half * cols], rms);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int e = 0; e < VEC; ++e) s[e] = red[lane * VEC + e];
}

// Sums of each column over the tyn thread rows of a block: v holds this thread's partials of its VEC
// columns and gets their totals. red: tyn * tx * VEC partials ([ty][e][lane]: a warp's accesses fall on
// distinct banks), then tx * VEC totals. Plain sums, a few threads (adjacent lanes) a column, replace
// the merge tree of (count, mean, M2) entries, whose 12-byte entries conflicted 8 ways in shared memory
// and took a barrier per level; the smaller buffer also leaves room for wider tiles (H100: fp16 RMS
// 256x88x56x56 152 -> 103 us, bf16 LN 64x96x56x56 57 -> 39, 64x192x28x28 38.5 -> 29).
template <typename A, int VEC>
__device__ __forceinline__ void column_sums(A* red, A (&v)[VEC], int ty, int tyn, int lane, int tx) {
  const int cols = tx * VEC;
  A* totals = red + tyn * cols;
  __syncthreads();  // red may still be read from the previous call
#pragma unroll
  for (int e = 0; e < VEC; ++e) red[(ty * VEC + e) * tx + lane] = v[e];
  __syncthreads();
  const int k = cols >= int(blockDim.x) ? 1 : min(32, int(blockDim.x) / cols);  // threads a column
  for (int base = 0; base < cols * k; base += blockDim.x) {
    const int c = (base + int(threadIdx.x)) / k, part = int(threadIdx.x) % k;
    A s = A(0);
    if (c < cols) {
      for (int t = part; t < tyn; t += k) s += red[t * cols + c];
    }
    for (int off = k / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (c < cols && part == 0) totals[c] = s;
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < VEC; ++e) v[e] = totals[e * tx + lane];
}

// Bytes of one channel row of a tile in shared memory: tx vectors; for 2-byte columns copied as granules
// (strided_tile_kernel), the 16-byte granules that hold tx elements at any offset.
constexpr int64_t tile_row_bytes(int64_t tx, int64_t vec_bytes) {
  return vec_bytes == 2 ? (tx * vec_bytes + 14 + 15) / 16 * 16 : tx * vec_bytes;
}

// The tile kernel keeps weight and bias in shared memory up to this many bytes (channels of float32 up to 1024).
constexpr int64_t kTileParamsBytes = 8 << 10;

// Channel-axis kernel for tiles that fit in shared memory: the whole tile (n x tx vectors) is
// copied with cp.async (all loads in flight, few registers), statistics and output come from
// shared memory. Thread (ty, lane) copies, and later reads back, channels ty, ty + tyn, ...
// 2-byte columns (odd inner or an odd offset; cp.async copies 4 bytes at least) are copied as the 16-byte
// granules that hold each channel's run of the tile, into slots of `pitch` bytes, the run's element 0 at byte
// (address & 15) of its slot; the granules' bytes outside the run lie in x's allocation (allocations are
// 16-byte aligned). Before, 2-byte loads in batches of 8 (H200, same process: bf16 LN 256x616x7x7 at an
// offset 47.3 -> 44.2 us, RMS 36x72x31x33 16.0 -> 13.2, fp16 RMS 25x1024x13x17 32.1 -> 29.0).
// Shared memory: column_sums' buffer (sums_bytes), then with params_bytes > 0 the weight and bias of every
// channel as A (loaded once a block: the output loop's loads of them waited on L1/L2 at each channel), then
// the tile.
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(256) strided_tile_kernel(StridedArgs<T, W> a, int64_t sums_bytes, int64_t params_bytes,
                                                           int pitch) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  constexpr bool kGranules = sizeof(V) == 2;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  A* red = reinterpret_cast<A*>(smem_raw);  // column_sums' partials and totals
  A* w_sh = params_bytes > 0 ? reinterpret_cast<A*>(smem_raw + sums_bytes) : nullptr;  // [n] weights, then [n] biases
  unsigned char* tile_raw = smem_raw + sums_bytes + params_bytes;
  V* tile_buf = reinterpret_cast<V*>(tile_raw);  // [n][tx] (vectors of 4+ bytes)
  const bool rms = a.rms;
  const int tx = a.tx, tyn = blockDim.x / tx;
  const int lane = threadIdx.x % tx, ty = threadIdx.x / tx;
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t tiles_per_outer = (a.inner + cols - 1) / cols;
  const int64_t tiles = a.outer * tiles_per_outer;
  if (w_sh) {  // read by the output loop after column_sums' barriers
    for (int64_t j = threadIdx.x; j < a.n; j += blockDim.x) {
      w_sh[j] = a.w ? A(to_acc(a.w[j])) : A(1);
      w_sh[a.n + j] = a.b ? A(to_acc(a.b[j])) : A(0);
    }
  }
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer;
    const int64_t col0 = (tile % tiles_per_outer) * cols, col = col0 + int64_t(lane) * VEC;
    const bool active = col < a.inner;
    const T* xt = a.x + o * a.x_outer_stride + col0;  // the tile's run of channel 0
    const T* xo = a.x + o * a.x_outer_stride + (active ? col : 0);
    T* yo = a.y + o * a.n * a.inner + (active ? col : 0);
    // Where thread (ty, lane) finds its vector of channel j in the cached tile.
    const auto cached = [&](int64_t j) -> V {
      if constexpr (kGranules) {
        const int off = int((reinterpret_cast<uintptr_t>(xt) + uintptr_t(j) * uintptr_t(a.inner) * sizeof(T)) & 15);
        return *reinterpret_cast<const V*>(tile_raw + j * pitch + off + lane * int(sizeof(T)));
      }
      return tile_buf[j * tx + lane];
    };
    if constexpr (kGranules) {
      __syncthreads();  // the previous tile's granules may still be read by other threads
      const uintptr_t run = uintptr_t(min(cols, a.inner - col0)) * sizeof(T);  // bytes of each channel's run
      const int per_row = pitch / 16, total = int(a.n) * per_row;
      for (int g = threadIdx.x; g < total; g += blockDim.x) {
        const int j = g / per_row, k = g - j * per_row;
        const uintptr_t start = reinterpret_cast<uintptr_t>(xt + int64_t(j) * a.inner);
        const uintptr_t src = (start & ~uintptr_t(15)) + uintptr_t(16) * k;
        if (src < start + run) cp_async<16, false>(tile_raw + int64_t(j) * pitch + 16 * k, reinterpret_cast<const void*>(src));
      }
    } else if (active) {
      for (int64_t j = ty; j < a.n; j += tyn) {
        cp_async<int(sizeof(V)), false>(tile_buf + j * tx + lane, reinterpret_cast<const V*>(xo + j * a.inner));
      }
    }
    A shift[VEC];  // channel 0 of each column, shared by all threads of the column
    V first;
    if (active && !rms) first = *reinterpret_cast<const V*>(xo);
    cp_async_wait_all();
    if constexpr (kGranules) __syncthreads();  // every thread's granules landed
    A sum[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      shift[e] = (active && !rms) ? A(to_acc(first.v[e])) : A(0);
      sum[e] = A(0);
    }
    if (active) {
      for (int64_t j = ty; j < a.n; j += tyn) {
        const V r = cached(j);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A v = to_acc(r.v[e]) - shift[e];
          sum[e] = rms ? fma(v, v, sum[e]) : sum[e] + v;
        }
      }
    }
    column_sums(red, sum, ty, tyn, lane, tx);
    const A inv_n = A(1) / A(a.n);
    Affine<A> st[VEC];
    if (rms) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) st[e] = affine_of(A(0), A(0), sum[e] * inv_n, a.eps, true);
    } else {
      // The exact second pass about each column's mean (shift + mean_d), over the cached tile.
      A mean_d[VEC], m2[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) mean_d[e] = sum[e] * inv_n, m2[e] = A(0);
      if (active) {
        for (int64_t j = ty; j < a.n; j += tyn) {
          const V r = cached(j);
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            const A d = (to_acc(r.v[e]) - shift[e]) - mean_d[e];
            m2[e] = fma(d, d, m2[e]);
          }
        }
      }
      column_sums(red, m2, ty, tyn, lane, tx);
#pragma unroll
      for (int e = 0; e < VEC; ++e) st[e] = affine_of(shift[e], mean_d[e], m2[e] * inv_n, a.eps, false);
    }
    if (!active) continue;
    for (int64_t j = ty; j < a.n; j += tyn) {
      const V r = cached(j);
      const A wj = w_sh ? w_sh[j] : a.w ? A(to_acc(a.w[j])) : A(1);
      const A bj = w_sh ? w_sh[a.n + j] : a.b ? A(to_acc(a.b[j])) : A(0);
      A out[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) out[e] = normalized(A(to_acc(r.v[e])), st[e]) * wj + bj;
      store_vec<false>(reinterpret_cast<V*>(yo + j * a.inner), pack<T>(out));
    }
  }
}

// Channel-axis kernel for tiles too large for shared memory: registers hold kCache channels per
// thread at a time; when n exceeds one chunk, x is read twice.
// One tile = all n reduced elements of tx*VEC consecutive inner positions of one outer index.
// Thread (ty, lane) holds channels ty, ty + tyn, ... (kCache of them per chunk).
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(256, 1) strided_norm_kernel(StridedArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  constexpr int kCache = kCacheOf<T>;
  extern __shared__ unsigned char smem_raw[];
  auto* red = reinterpret_cast<Stats<A>*>(smem_raw);  // [tyn][tx * VEC]
  const bool rms = a.rms;
  const int tx = a.tx, tyn = blockDim.x / tx;
  const int lane = threadIdx.x % tx, ty = threadIdx.x / tx;
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t tiles_per_outer = (a.inner + cols - 1) / cols;
  const int64_t tiles = a.outer * tiles_per_outer;
  const int64_t chunk = int64_t(kCache) * tyn;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer;
    const int64_t col = (tile % tiles_per_outer) * cols + int64_t(lane) * VEC;
    const bool active = col < a.inner;
    const T* xo = a.x + o * a.x_outer_stride + (active ? col : 0);
    T* yo = a.y + o * a.n * a.inner + (active ? col : 0);
    V cache[kCache];
    Stats<A> s[VEC];
    A shift[VEC];  // channel 0 of each column, shared by all threads of the column
    V first;
    if (active && !rms) first = *reinterpret_cast<const V*>(xo);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      s[e] = {A(0), A(0), A(0)};
      shift[e] = (active && !rms) ? A(to_acc(first.v[e])) : A(0);
    }
    const bool once = a.n <= chunk;
    for (int64_t c = 0; c < a.n; c += chunk) {
#pragma unroll
      for (int k = 0; k < kCache; ++k) {
        const int64_t j = c + int64_t(k) * tyn + ty;
        if (active && j < a.n) {
          const V* p = reinterpret_cast<const V*>(xo + j * a.inner);
          cache[k] = once ? load_vec<true>(p) : load_vec<false>(p);
        }
      }
      // Exact per-column statistics of this chunk, merged into the running ones.
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A cnt = A(0), sum = A(0);
#pragma unroll
        for (int k = 0; k < kCache; ++k) {
          if (active && c + int64_t(k) * tyn + ty < a.n) {
            const A v = to_acc(cache[k].v[e]) - shift[e];
            sum += rms ? v * v : v;
            cnt += A(1);
          }
        }
        Stats<A> cs{cnt, A(0), sum};
        if (!rms && cnt > A(0)) {
          const A mean = sum / cnt;
          A m2 = A(0);
#pragma unroll
          for (int k = 0; k < kCache; ++k) {
            if (active && c + int64_t(k) * tyn + ty < a.n) {
              const A d = (to_acc(cache[k].v[e]) - shift[e]) - mean;
              m2 += d * d;
            }
          }
          cs = {cnt, mean, m2};
        }
        s[e] = merge(s[e], cs, rms);
      }
    }
    combine_columns(red, s, ty, tyn, lane, cols, rms);
    Affine<A> st[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) st[e] = finalize(s[e], a.n, a.eps, rms, shift[e]);
    if (!active) continue;
    for (int64_t c = 0; c < a.n; c += chunk) {
      if (!once) {
#pragma unroll
        for (int k = 0; k < kCache; ++k) {
          const int64_t j = c + int64_t(k) * tyn + ty;
          if (j < a.n) cache[k] = load_vec<true>(reinterpret_cast<const V*>(xo + j * a.inner));
        }
      }
#pragma unroll
      for (int k = 0; k < kCache; ++k) {
        const int64_t j = c + int64_t(k) * tyn + ty;
        if (j < a.n) {
          const A wj = a.w ? A(to_acc(a.w[j])) : A(1);
          const A bj = a.b ? A(to_acc(a.b[j])) : A(0);
          A out[VEC];
#pragma unroll
          for (int e = 0; e < VEC; ++e) {
            out[e] = normalized(A(to_acc(cache[k].v[e])), st[e]) * wj + bj;
          }
          store_vec(reinterpret_cast<V*>(yo + j * a.inner), pack<T>(out));
        }
      }
    }
  }
}

// Few channels (n <= kColumnChannels): one thread per VEC adjacent columns of one outer index holds
// all n of their channels in registers, so it needs no other thread: no shared memory, no barrier,
// all of its loads in flight at once. The tile kernel spent such calls on its per-tile barriers and
// reduction tree, most of its thread rows idle (H100: LN fp32 256x3x56x56 at 22% of copy).
// Statistics are exact two-pass sums over the registers, relative to channel 0 (the shift). Two
// register budgets: up to 4 channels at 64 registers (n = 3 at 128 registers left 2 blocks an SM and
// a third of the bandwidth idle), up to kColumnChannels with as many as the thread needs.
constexpr int kColumnChannels = 16;
constexpr int kFewColumnChannels = 4;

template <typename T, typename W, int VEC, int kN>
__global__ void __launch_bounds__(256, kN <= kFewColumnChannels ? 4 : 1) strided_column_kernel(StridedArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  const bool rms = a.rms;
  const int n = int(a.n);
  const int64_t inner_vec = a.inner / VEC;  // VEC divides inner (channel_vec)
  const int64_t columns = a.outer * inner_vec;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < columns; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = c / inner_vec, col = (c - o * inner_vec) * VEC;
    // Padded rows: column col lies in row col / x_row of x's tail (VEC divides x_row: a vector stays in its row).
    const T* xo = a.x + o * a.x_outer_stride + col + (a.x_pad ? col / a.x_row * a.x_pad : 0);
    T* yo = a.y + o * a.n * a.inner + col;
    V r[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if (j < n) r[j] = load_vec<true>(reinterpret_cast<const V*>(xo + j * a.x_channel));
    }
    A shift[VEC], sum[VEC];
    widen(r[0].v, shift);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      if (rms) shift[e] = A(0);
      sum[e] = A(0);
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if (j < n) {
        A v[VEC];
        widen(r[j].v, v);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A d = v[e] - shift[e];
          sum[e] = rms ? fma(d, d, sum[e]) : sum[e] + d;
        }
      }
    }
    const A inv_n = A(1) / A(n);
    Affine<A> st[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      A mean = A(0), m2 = sum[e];
      if (!rms) {
        mean = sum[e] * inv_n;
        m2 = A(0);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          if (j < n) {
            const A d = (A(to_acc(r[j].v[e])) - shift[e]) - mean;
            m2 = fma(d, d, m2);
          }
        }
      }
      st[e] = affine_of(shift[e], mean, m2 * inv_n, a.eps, rms);
    }
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if (j < n) {
        const A wj = a.w ? A(to_acc(a.w[j])) : A(1);
        const A bj = a.b ? A(to_acc(a.b[j])) : A(0);
        A out[VEC];
        widen(r[j].v, out);
#pragma unroll
        for (int e = 0; e < VEC; ++e) out[e] = fma(normalized(out[e], st[e]), wj, bj);
        store_vec<false>(reinterpret_cast<V*>(yo + j * a.inner), pack<T>(out));
      }
    }
  }
}

// Channel tiles (H100, same-process A/B against 32 lanes in 64 KB): up to 64 lanes of 16 bytes, so a
// tile reads 1 KB runs of each channel row and reduces over 4 thread rows instead of 8, in up to
// 96 KB of shared memory when there are at most 64 channels (bf16 LayerNorm 112x64x512x512: 75.7 ->
// 88.2% of copy, 8x32x224x224 36 -> 53%; fp32 RMSNorm seed 94.4 -> 95.1%; fp32 32x64x128x128 LN
// -1.5 points). More channels keep 64 KB: wider tiles in 96 KB cost them 1-15 points (fewer blocks
// an SM: 16x256x64x64 fp32 LN 80 -> 65%).
constexpr int64_t kTileBytes = 64 << 10;
constexpr int64_t kWideTileBytes = 96 << 10;
constexpr int64_t kWideTileChannels = 64;
constexpr int kTileLanes = 64;

static inline bool uses_columns(const NormParams& p) {
  return p.n <= kColumnChannels && p.n <= env_int("FASTNORM_CHANNEL_COLUMN_MAX", kColumnChannels);
}

template <typename T, typename W, int VEC>
static inline const char* launch_strided(const NormParams& p, cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  const Device dev = device_info();
  const int threads = 256;
  StridedArgs<T, W> a{static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
                      static_cast<const W*>(p.bias), p.outer, p.n, p.inner, p.x_outer_stride, p.eps, 1, p.rms,
                      p.x_row, p.x_row_stride > 0 ? p.x_row_stride - p.x_row : 0,
                      p.x_row_stride > 0 ? p.inner / p.x_row * p.x_row_stride : p.inner};
  if (uses_columns(p)) {
    const int64_t columns = p.outer * (p.inner / VEC);
    const int64_t blocks = (columns + threads - 1) / threads, cap = int64_t(dev.sms) * 64;
    const int grid = int(blocks < cap ? blocks : cap);
    if (p.n <= kFewColumnChannels) strided_column_kernel<T, W, VEC, kFewColumnChannels><<<grid, threads, 0, stream>>>(a);
    else strided_column_kernel<T, W, VEC, kColumnChannels><<<grid, threads, 0, stream>>>(a);
    return launch_result(cudaGetLastError());
  }
  const int64_t inner_vec = (p.inner + VEC - 1) / VEC;
  const int64_t lanes = pow2_at_least(inner_vec);
  int tx = int(std::min<int64_t>(lanes, 32));
  const int64_t red_bytes = int64_t(threads) * VEC * sizeof(Stats<A>);  // register kernel: tyn * tx * VEC entries
  // Tile kernel: column_sums' partials and totals, then the tile. The widest tile (up to kTileLanes
  // lanes of 16 bytes) whose n x tx vectors fit the shared-memory budget.
  const int64_t sums_bytes = (int64_t(threads + kTileLanes) * VEC * sizeof(A) + 15) / 16 * 16;
  const int64_t budget = p.n <= kWideTileChannels ? kWideTileBytes : kTileBytes;
  int tile_tx = int(std::min<int64_t>(lanes, kTileLanes));
  const auto row_bytes = [&](int t) { return tile_row_bytes(t, sizeof(V)); };
  // Weight and bias in shared memory where they fit kTileParamsBytes; FASTNORM_CHANNEL_PARAMS_SMEM=0 (read at each
  // call, for A/B runs): loaded from global memory at each output.
  const int64_t params_want = (2 * p.n * int64_t(sizeof(A)) + 15) / 16 * 16;
  const int64_t params_bytes =
      params_want <= kTileParamsBytes && env_int("FASTNORM_CHANNEL_PARAMS_SMEM", 1) != 0 ? params_want : 0;
  const int64_t fixed_bytes = sums_bytes + params_bytes;
  while (tile_tx > 4 && fixed_bytes + p.n * row_bytes(tile_tx) > budget) tile_tx /= 2;
  const bool tiled = fixed_bytes + p.n * row_bytes(tile_tx) <= budget;
  const auto tiles_of = [&](int t) { return p.outer * ((p.inner + int64_t(t) * VEC - 1) / (int64_t(t) * VEC)); };
  if (tiled) {
    // Fewer tiles than two an SM (few outer indices, small planes, many channels): narrower tiles, down
    // to one lane, so that the call spreads over the chip (H100: fp16 LN 2x701x14x14 ran 8 tiles, 58.7
    // -> 8.7 us; two an SM rather than one: bf16 LN 64x768x7x7 29.3 -> 22.3 us, RMS 8x113x31x33 10.3
    // -> 9.1; four: mixed).
    tx = tile_tx;
    const int64_t want = int64_t(dev.sms) * env_int("FASTNORM_CHANNEL_FILL", 2);
    while (tx > 1 && tiles_of(tx) < want) tx /= 2;
  } else {
    // Narrower tiles, more threads along the reduced axis, until it fits the register cache.
    while (tx > 4 && int64_t(threads / tx) * kCacheOf<T> < p.n) tx /= 2;
  }
  a.tx = tx;
  const int64_t tiles = tiles_of(tx);
  const int64_t cap = int64_t(dev.sms) * 64;
  const int grid = int(tiles < cap ? tiles : cap);
  if (tiled) {
    static bool smem_allowed = false;
    if (!smem_allowed) allow_smem(strided_tile_kernel<T, W, VEC>), smem_allowed = true;
    const size_t smem = size_t(fixed_bytes + p.n * row_bytes(tx));
    strided_tile_kernel<T, W, VEC><<<grid, threads, smem, stream>>>(a, sums_bytes, params_bytes, int(row_bytes(tx)));
  } else {
    strided_norm_kernel<T, W, VEC><<<grid, threads, size_t(red_bytes), stream>>>(a);
  }
  const cudaError_t err = cudaGetLastError();
  return launch_result(err);
}

// The widest access (16 bytes down to one element) that x's and y's addresses, inner and x's outer
// stride all allow: columns of 14x14 planes move in 8 bytes, not one 2-byte element at a time.
template <typename T>
static inline int channel_vec(const NormParams& p) {
  const auto aligned = [](const void* q, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(q) & (bytes - 1)) == 0; };
  for (int vec = 16 / int(sizeof(T)); vec > 1; vec /= 2) {
    if (aligned(p.x, uintptr_t(vec) * sizeof(T)) && aligned(p.y, uintptr_t(vec) * sizeof(T)) && p.inner % vec == 0 &&
        p.x_outer_stride % vec == 0 && (p.x_row_stride == 0 || (p.x_row % vec == 0 && p.x_row_stride % vec == 0))) {
      return vec;
    }
  }
  return 1;
}

// The column kernel's thread works through n vectors alone: on a small call, narrower vectors give more
// threads and a shorter chain each, down to a block's worth an SM (H100: fp16 LN 5x16x32x32 ran 640
// threads of 16 x 8 values for 9 us).
template <typename T, typename W, int VEC = 16 / sizeof(T)>
static inline const char* launch_channels(const NormParams& p, cudaStream_t stream, int vec = 0) {
  if (vec == 0) {
    // Padded rows (NormParams::x_row_stride): the column kernel reads them in place (H200, same process, against
    // the copy: bf16 LN 76x16x512x512 padded to 528 1182 -> 486 us, fp16 LN 256x11x224x224 padded to 229 486 ->
    // 407, 256x4x7x7 to 12 7.65 -> 4.29); the tile kernels take a contiguous copy. FASTNORM_PADDED_ROWS=0 (read at
    // each call, for tests and A/B runs): the copy for all.
    if (p.x_row_stride > 0 && (!uses_columns(p) || env_int("FASTNORM_PADDED_ROWS", 1) == 0)) {
      return FASTNORM_PADDED_ROWS_NOT_TAKEN;
    }
    vec = channel_vec<T>(p);
    const int64_t enough = int64_t(device_info().sms) * 256;
    if (uses_columns(p)) {
      while (vec > 1 && p.outer * (p.inner / vec) < enough) vec /= 2;
      // bfloat16 on the 16-channel instance: 8-byte vectors (its 16-byte one holds 255 registers, one block an SM;
      // float16's 124). H200, same process: LN 76x16x512x512 469.7 -> 420.8 us, padded to 528 485.8 -> 438.8.
      if (std::is_same<T, __nv_bfloat16>::value && p.n > kFewColumnChannels) vec = std::min(vec, 4);
    }
  }
  if constexpr (VEC > 1) {
    if (vec < VEC) return launch_channels<T, W, VEC / 2>(p, stream, vec);
  }
  return launch_strided<T, W, VEC>(p, stream);
}

}  // namespace fastnorm
