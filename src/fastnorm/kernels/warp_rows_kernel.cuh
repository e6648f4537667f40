// The scalar-row kernels: last-dim rows of up to 1024 elements that cannot take 16-byte vectors (odd n,
// row starts off a 16-byte boundary: 100000x257, x[:, 1:]). Rows of 32 or more: a warp per row, the row in registers:
// lane l holds elements l, l + 32, ... (each load instruction of the warp reads consecutive
// elements, so plain scalar loads coalesce), all of its loads in flight before the first use, and
// the statistics meet in warp shuffles, with no shared memory and no block barrier. The row kernel's
// scalar path, one element per shared-memory copy, ran these rows at 36% of copy (H100). Shorter rows
// (1000000x1, 500000x7): a thread per row (thread_rows_kernel below).
#pragma once
#include <cstdlib>

#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int kWarpRowThreads = 256;
constexpr int kWarpRowMaxK = 32;  // elements a lane holds: rows of up to 32 x 32 = 1024 elements

// The sum over the warp, every lane getting it (group_sums of one value, shuffles only).
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
  A sum[1] = {v};
  group_sums(sum, 32, static_cast<A*>(nullptr));
  return sum[0];
}

// K: elements a lane holds (rows of 32 * K / 2 < n <= 32 * K elements). Statistics about the row's
// first element (LayerNorm): sums of x - shift give the mean, then the centered sum of squares.
template <typename T, typename W, int K>
__global__ void __launch_bounds__(kWarpRowThreads) warp_rows_kernel(RowArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  const int lane = threadIdx.x & 31;
  const int warps_per_block = blockDim.x >> 5;
  const int n = int(a.n);
  const A inv_n = A(1) / A(n);
  const bool rms = a.rms;
  for (int64_t row = int64_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5); row < a.rows;
       row += int64_t(gridDim.x) * warps_per_block) {
    const T* xr = a.x + row * a.x_stride;
    A v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = lane + 32 * k;
      v[k] = j < n ? A(to_acc(xr[j])) : A(0);
    }
    const A shift = rms ? A(0) : A(to_acc(xr[0]));
    A s = A(0);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (lane + 32 * k < n) s += rms ? v[k] * v[k] : v[k] - shift;
    }
    s = warp_sum(s);
    Affine<A> st;
    if (rms) {
      st = affine_of(A(0), A(0), s * inv_n, a.eps, true);
    } else {
      const A mean_rel = s * inv_n;
      A q = A(0);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const A d = (v[k] - shift) - mean_rel;
        if (lane + 32 * k < n) q = fma(d, d, q);
      }
      st = affine_of(shift, mean_rel, warp_sum(q) * inv_n, a.eps, false);
    }
    if (a.stats && lane == 0) save_affine(a.stats, row, st);
    T* yr = a.y + row * int64_t(n);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = lane + 32 * k;
      if (j < n) {
        A out = normalized(v[k], st);
        if (a.w) out *= A(to_acc(a.w[j]));
        if (a.b) out += A(to_acc(a.b[j]));
        yr[j] = from_acc<T>(out);
      }
    }
  }
}

// Rows of fewer than 32 elements: a thread per row, the row in registers (K >= n), 128 rows a block.
// Thread t reads its row's elements one after another: the warp's loads of element j fall in the same
// few cache lines as its loads of element j - 1, which L1 keeps. Stores do not stay in L1, so the
// block's outputs meet in shared memory (its rows are contiguous in y) and leave in coalesced stores.
// (These rows took the row kernel before: 1000000x1 bf16 13.0 us against torch.compile's 5.8, H100.)
constexpr int kThreadRowThreads = 128;
// Rows of up to 31 elements (32 and more: the warp-row kernel); float64 up to 16 (31 doubles a thread
// spilled; its rows of 17-31 stay with the row kernel).
constexpr int kThreadRowMaxN(int elem_bytes) { return elem_bytes == 8 ? 16 : 31; }

template <typename T, typename W, int K>
__global__ void __launch_bounds__(kThreadRowThreads) thread_rows_kernel(RowArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  __shared__ T tile[kThreadRowThreads * K];
  const int n = int(a.n);
  const A inv_n = A(1) / A(n);
  const bool rms = a.rms;
  for (int64_t first = int64_t(blockIdx.x) * kThreadRowThreads; first < a.rows;
       first += int64_t(gridDim.x) * kThreadRowThreads) {
    const int64_t row = first + threadIdx.x;
    const int rows = int(a.rows - first < kThreadRowThreads ? a.rows - first : kThreadRowThreads);
    if (row < a.rows) {
      const T* xr = a.x + row * a.x_stride;
      A v[K];
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = k < n ? A(to_acc(xr[k])) : A(0);
      Affine<A> st;
      if (rms) {
        A s = A(0);
#pragma unroll
        for (int k = 0; k < K; ++k) s = fma(v[k], v[k], s);  // zeros past n add nothing
        st = affine_of(A(0), A(0), s * inv_n, a.eps, true);
      } else {  // about the row's first element, as the warp-row kernel
        A s = A(0);
#pragma unroll
        for (int k = 0; k < K; ++k) s += k < n ? v[k] - v[0] : A(0);
        const A mean_rel = s * inv_n;
        A q = A(0);
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const A d = (v[k] - v[0]) - mean_rel;
          q = k < n ? fma(d, d, q) : q;
        }
        st = affine_of(v[0], mean_rel, q * inv_n, a.eps, false);
      }
      if (a.stats) save_affine(a.stats, row, st);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (k < n) {
          A out = normalized(v[k], st);
          if (a.w) out *= A(to_acc(a.w[k]));
          if (a.b) out += A(to_acc(a.b[k]));
          tile[threadIdx.x * n + k] = from_acc<T>(out);
        }
      }
    }
    __syncthreads();
    T* y = a.y + first * int64_t(n);
    for (int i = threadIdx.x; i < rows * n; i += kThreadRowThreads) y[i] = tile[i];
    __syncthreads();  // the tile is rewritten by the next rows
  }
}

static inline bool thread_rows_take(const NormParams& p, int vec) {
  const char* env = std::getenv("FASTNORM_WARP_ROWS");
  if (env && env[0] == '0') return false;
  return vec == 1 && p.n <= kThreadRowMaxN(elem_size(p.dtype)) && p.threads <= 0 && p.blocks_per_row <= 0;
}

template <typename T, typename W, int K>
static inline const void* thread_rows_kernel_of(int64_t n) {
  if constexpr (K / 2 >= kThreadRowMaxN(int(sizeof(T)))) {  // K / 2 already holds every row it takes
    return nullptr;
  } else {
    if (n <= K) return reinterpret_cast<const void*>(thread_rows_kernel<T, W, K>);
    return thread_rows_kernel_of<T, W, K * 2>(n);
  }
}

template <typename T, typename W>
static inline const char* launch_thread_rows(const NormParams& p, cudaStream_t stream) {
  RowArgs<T, W> a{static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
                  static_cast<const W*>(p.bias), p.outer, p.n, p.x_outer_stride, p.eps, 1, p.rms, p.stats};
  const int64_t blocks = (p.outer + kThreadRowThreads - 1) / kThreadRowThreads;
  const int64_t cap = int64_t(device_info().sms) * 64;  // a few waves of resident blocks, then grid-stride
  const void* kernel = thread_rows_kernel_of<T, W, 1>(p.n);
  void* args[] = {&a};
  return launch_result(cudaLaunchKernel(kernel, dim3(unsigned(blocks < cap ? blocks : cap)), dim3(kThreadRowThreads),
                                        args, 0, stream));
}

// Whether the warp-row kernel takes a last-dim call of VEC-wide accesses: scalar rows (VEC 1) of 32
// to 1024 elements, no launch override. Shorter rows would leave lanes idle: 1000000x1 bf16 ran 93 us
// here against the row kernel's 13 (H100); several rows a warp with the lane count a kernel argument
// slowed every other row 1.1-2.4x (index math), so they take the thread-row kernel. FASTNORM_WARP_ROWS=0
// (read at each call, for A/B runs) leaves both to the row kernel.
static inline bool warp_rows_take(const NormParams& p, int vec) {
  const char* env = std::getenv("FASTNORM_WARP_ROWS");
  if (env && env[0] == '0') return false;
  return vec == 1 && p.n >= 32 && p.n <= 32 * kWarpRowMaxK && p.threads <= 0 && p.blocks_per_row <= 0;
}

template <typename T, typename W, int K>
static inline const void* warp_rows_kernel_of(int64_t n) {
  if constexpr (K > kWarpRowMaxK) {
    return nullptr;
  } else {
    if (n <= 32 * K) return reinterpret_cast<const void*>(warp_rows_kernel<T, W, K>);
    return warp_rows_kernel_of<T, W, K * 2>(n);
  }
}

template <typename T, typename W>
static inline const char* launch_warp_rows(const NormParams& p, cudaStream_t stream) {
  RowArgs<T, W> a{static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
                  static_cast<const W*>(p.bias), p.outer, p.n, p.x_outer_stride, p.eps, 32, p.rms, p.stats};
  const int warps_per_block = kWarpRowThreads / 32;
  const int64_t blocks = (p.outer + warps_per_block - 1) / warps_per_block;
  const int64_t cap = int64_t(device_info().sms) * 32;  // a few waves of resident blocks, then grid-stride
  const void* kernel = warp_rows_kernel_of<T, W, 1>(p.n);
  void* args[] = {&a};
  return launch_result(cudaLaunchKernel(kernel, dim3(unsigned(blocks < cap ? blocks : cap)), dim3(kWarpRowThreads),
                                        args, 0, stream));
}

}  // namespace fastnorm
