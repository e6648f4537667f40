// The channel-axis kernels (inner > 1, e.g. the channels of NCHW): tiles in shared memory or in
// registers; their launcher.
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

// Channel-axis kernel for tiles that fit in shared memory: the whole tile (n x tx vectors) is
// copied with cp.async (all loads in flight, few registers), statistics and output come from
// shared memory. Thread (ty, lane) copies, and later reads back, channels ty, ty + tyn, ...
template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(256) strided_tile_kernel(StridedArgs<T, W> a, int64_t red_bytes) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  auto* red = reinterpret_cast<Stats<A>*>(smem_raw);  // [tyn][tx * VEC]
  V* tile_buf = reinterpret_cast<V*>(smem_raw + red_bytes);  // [n][tx]
  const bool rms = a.rms;
  const int tx = a.tx, tyn = blockDim.x / tx;
  const int lane = threadIdx.x % tx, ty = threadIdx.x / tx;
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t tiles_per_outer = (a.inner + cols - 1) / cols;
  const int64_t tiles = a.outer * tiles_per_outer;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t o = tile / tiles_per_outer;
    const int64_t col = (tile % tiles_per_outer) * cols + int64_t(lane) * VEC;
    const bool active = col < a.inner;
    const T* xo = a.x + o * a.x_outer_stride + (active ? col : 0);
    T* yo = a.y + o * a.n * a.inner + (active ? col : 0);
    if (active) {
      for (int64_t j = ty; j < a.n; j += tyn) {
        const V* src = reinterpret_cast<const V*>(xo + j * a.inner);
        if constexpr (sizeof(V) >= 4) cp_async<int(sizeof(V)), false>(tile_buf + j * tx + lane, src);
        else tile_buf[j * tx + lane] = load_vec<true>(src);
      }
    }
    A shift[VEC];  // channel 0 of each column, shared by all threads of the column
    V first;
    if (active && !rms) first = *reinterpret_cast<const V*>(xo);
    cp_async_wait_all();
    A sum[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      shift[e] = (active && !rms) ? A(to_acc(first.v[e])) : A(0);
      sum[e] = A(0);
    }
    A cnt = A(0);
    if (active) {
      for (int64_t j = ty; j < a.n; j += tyn) {
        const V r = tile_buf[j * tx + lane];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A v = to_acc(r.v[e]) - shift[e];
          sum[e] += rms ? v * v : v;
        }
        cnt += A(1);
      }
    }
    Stats<A> s[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) s[e] = {cnt, A(0), sum[e]};
    if (!rms && cnt > A(0)) {
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        s[e].mean = sum[e] / cnt;
        s[e].m2 = A(0);
      }
      for (int64_t j = ty; j < a.n; j += tyn) {
        const V r = tile_buf[j * tx + lane];
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const A d = (to_acc(r.v[e]) - shift[e]) - s[e].mean;
          s[e].m2 += d * d;
        }
      }
    }
    combine_columns(red, s, ty, tyn, lane, cols, rms);
    if (!active) continue;
    Affine<A> st[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) st[e] = finalize(s[e], a.n, a.eps, rms, shift[e]);
    for (int64_t j = ty; j < a.n; j += tyn) {
      const V r = tile_buf[j * tx + lane];
      const A wj = a.w ? A(to_acc(a.w[j])) : A(1);
      const A bj = a.b ? A(to_acc(a.b[j])) : A(0);
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

template <typename T, typename W, int VEC>
static inline const char* launch_strided(const NormParams& p, cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  const Device dev = device_info();
  const int64_t inner_vec = (p.inner + VEC - 1) / VEC;
  const int threads = 256;
  const int64_t lanes = pow2_at_least(inner_vec);
  int tx = int(std::min<int64_t>(lanes, 32));
  const int64_t red_bytes = int64_t(threads) * VEC * sizeof(Stats<A>);  // tyn * tx * VEC entries
  // Widest tile (up to kTileLanes lanes of 16 bytes) whose n x tx vectors fit the shared-memory budget.
  const int64_t budget = p.n <= kWideTileChannels ? kWideTileBytes : kTileBytes;
  int tile_tx = int(std::min<int64_t>(lanes, kTileLanes));
  while (tile_tx > 4 && red_bytes + p.n * tile_tx * int64_t(sizeof(V)) > budget) tile_tx /= 2;
  const bool tiled = red_bytes + p.n * tile_tx * int64_t(sizeof(V)) <= budget;
  if (tiled) {
    tx = tile_tx;
  } else {
    // Narrower tiles, more threads along the reduced axis, until it fits the register cache.
    while (tx > 4 && int64_t(threads / tx) * kCacheOf<T> < p.n) tx /= 2;
  }
  StridedArgs<T, W> a{static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
                      static_cast<const W*>(p.bias), p.outer, p.n, p.inner, p.x_outer_stride, p.eps, tx, p.rms};
  const int64_t cols = int64_t(tx) * VEC;
  const int64_t tiles = p.outer * ((p.inner + cols - 1) / cols);
  const int64_t cap = int64_t(dev.sms) * 64;
  const int grid = int(tiles < cap ? tiles : cap);
  if (tiled) {
    static bool smem_allowed = false;
    if (!smem_allowed) allow_smem(strided_tile_kernel<T, W, VEC>), smem_allowed = true;
    const size_t smem = size_t(red_bytes + p.n * tx * int64_t(sizeof(V)));
    strided_tile_kernel<T, W, VEC><<<grid, threads, smem, stream>>>(a, red_bytes);
  } else {
    strided_norm_kernel<T, W, VEC><<<grid, threads, size_t(red_bytes), stream>>>(a);
  }
  const cudaError_t err = cudaGetLastError();
  return launch_result(err);
}

}  // namespace fastnorm
