// Strided rows (strided_rows_kernel): scalar rows (odd n, row starts off a 16-byte boundary, x a shifted
// view such as x[:, 2:]) of 1025-16384 elements, a block of B threads a row (B a multiple of 32). Element j
// of the row sits in thread j % B's registers (slot j / B), so each load instruction of a warp reads 32
// consecutive elements: plain scalar loads coalesce at any offset, with no realignment, and x, weight and
// bias are all in flight before the first use. That is how torch.compile's and Liger's Triton kernels
// take such rows. Nothing is staged in shared memory and no block gathers parameters first, so small
// calls pay no fixed cost.
//
// Statistics: a plain sum gives a rough mean c, then the corrected two-pass sums of d = x - c (as the
// row kernel); the output is (x - center) * rstd + offset (Affine), so rows far from zero stay exact.
#pragma once
#include "cuda_launch.cuh"
#include "cuda_rows.cuh"
#include "offset_rows_kernel.cuh"

namespace fastnorm {

// Rows it takes: 1025 (the warp-row kernel has 32-1024) up to 16 elements a thread of 1024 threads.
constexpr int kStridedRowMinN = 1025;
constexpr int kStridedRowMaxThreads = 1024;
constexpr int kStridedRowMaxK = 16;

// The weight and bias of the thread's slots (those past n unread).
template <int kB, int K, typename W>
__device__ __forceinline__ void strided_params(const W* w, const W* b, W (&wr)[K], W (&br)[K], int n) {
  const int t = threadIdx.x, B = kB > 0 ? kB : int(blockDim.x);
  const W *wt = w + t, *bt = b + t;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (w && B * k < n - t) wr[k] = wt[B * k];
    if (b && B * k < n - t) br[k] = bt[B * k];
  }
}

// y of the thread's slots: x's normalized values times the weight plus the bias; kW / kBias: which
// parameters there are (one loop per case: a test per element compiles to branches). kHeld: the parameters
// are in wr / br (loaded with x), else loaded after the statistics: x, weight and bias of 16 slots at once
// spilled at 64 registers, even loaded in two halves. kP: parameter slots loaded at once before their
// stores; one at a time, nvcc keeps each load behind the previous slot's store (y may alias the
// parameters), K round trips in a row.
template <int kB, bool kHeld, bool kW, bool kBias, int kP, int K, typename A, typename T, typename W>
__device__ __forceinline__ void strided_store(T* yr, const A (&v)[K], const Affine<A>& st, const W (&wr)[K],
                                              const W (&br)[K], const W* w, const W* b, int n) {
  const int t = threadIdx.x, B = kB > 0 ? kB : int(blockDim.x);
  if constexpr (kHeld || kP == 1) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = t + B * k;
      if (B * k < n - t) {
        A o = normalized(v[k], st);
        const A wv = kW ? A(to_acc(kHeld ? wr[k] : w[j])) : A(1), bv = kBias ? A(to_acc(kHeld ? br[k] : b[j])) : A(0);
        if constexpr (kW && kBias) o = fma(o, wv, bv);
        else if constexpr (kW) o *= wv;
        else if constexpr (kBias) o += bv;
        yr[j] = from_acc<T>(o);
      }
    }
  } else {
    static_assert(K % kP == 0, "whole batches of parameter slots");
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += kP) {
      A wv[kP], bv[kP];
#pragma unroll
      for (int i = 0; i < kP; ++i) {
        const int k = k0 + i;
        const bool in = B * k < n - t;
        wv[i] = kW && in ? A(to_acc(w[t + B * k])) : A(1);
        bv[i] = kBias && in ? A(to_acc(b[t + B * k])) : A(0);
      }
#pragma unroll
      for (int i = 0; i < kP; ++i) {
        const int k = k0 + i;
        if (B * k < n - t) {
          A o = normalized(v[k], st);
          if constexpr (kW && kBias) o = fma(o, wv[i], bv[i]);
          else if constexpr (kW) o *= wv[i];
          else if constexpr (kBias) o += bv[i];
          yr[t + B * k] = from_acc<T>(o);
        }
      }
    }
  }
}

template <int kB, bool kHeld, int kP, int K, typename A, typename T, typename W>
__device__ __forceinline__ void strided_output(T* yr, const A (&v)[K], const Affine<A>& st, const W (&wr)[K],
                                               const W (&br)[K], const W* w, const W* b, int n) {
  if (w && b) strided_store<kB, kHeld, true, true, kP>(yr, v, st, wr, br, w, b, n);
  else if (w) strided_store<kB, kHeld, true, false, kP>(yr, v, st, wr, br, w, b, n);
  else if (b) strided_store<kB, kHeld, false, true, kP>(yr, v, st, wr, br, w, b, n);
  else strided_store<kB, kHeld, false, false, kP>(yr, v, st, wr, br, w, b, n);
}

// Whether a thread's parameters are loaded with its x (K <= 8).
template <int K>
constexpr bool kStridedHeld = K <= 8;
// Parameter slots loaded at once by the fixed-block instances of 16 a thread (strided_rows_shape).
constexpr int kStridedParamBatch = 4;

// K: elements a thread can hold (slots past n idle); kB: threads a row, 0 for blockDim.x (a multiple of 32,
// at most kMaxB); kMinBlocks: blocks of kMaxB an SM the register budget is sized for. A block takes rows
// blockIdx.x, + gridDim.x, ... kP: parameter slots loaded at once (strided_store). Instances
// (strided_rows_shape): 8 a thread on up to 512 threads (40 registers for 2-byte x, 64 for float32: at 40 it
// spilled) and on up to 1024 (64 registers, latency-bound calls); 16 on a fixed 256 (46 registers, 5 blocks an
// SM), 512 (48) and 1024 threads.
template <typename T, typename W, int K, int kB, int kMaxB = kStridedRowMaxThreads, int kMinBlocks = 1, int kP = 1>
__global__ void __launch_bounds__(kMaxB, kMinBlocks) strided_rows_kernel(RowArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  __shared__ A sums[2][2 * 32];  // block_sums' partials: two buffers, one barrier a call
  int buf = 0;
  const int n = int(a.n), t = threadIdx.x, B = kB > 0 ? kB : int(blockDim.x);
  const A inv_n = A(1) / A(n);
  const bool rms = a.rms;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* xr = a.x + row * a.x_stride;
    T raw[K];
#pragma unroll
    for (int k = 0; k < K; ++k) raw[k] = B * k < n - t ? xr[t + B * k] : from_acc<T>(A(0));
    W wr[K], br[K];
    if constexpr (kStridedHeld<K>) strided_params<kB>(a.w, a.b, wr, br, n);
    A v[K];
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = A(to_acc(raw[k]));  // zeros past n
    A s[1] = {A(0)};
#pragma unroll
    for (int k = 0; k < K; ++k) s[0] = rms ? fma(v[k], v[k], s[0]) : s[0] + v[k];
    block_sums(s, sums[buf]);
    buf ^= 1;
    Affine<A> st;
    if (rms) {
      st = affine_of(A(0), A(0), s[0] * inv_n, a.eps, true);
    } else {
      const A c = s[0] * inv_n;
      A q[2] = {A(0), A(0)};
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (B * k < n - t) {
          const A d = v[k] - c;
          q[0] += d;
          q[1] = fma(d, d, q[1]);
        }
      }
      block_sums(q, sums[buf]);
      buf ^= 1;
      const A mean_d = q[0] * inv_n;
      st = affine_of(c, mean_d, corrected_variance(mean_d, q[1] * inv_n), a.eps, false);
    }
    if (a.stats && t == 0) save_affine(a.stats, row, st);
    T* yr = a.y + row * int64_t(n);
    strided_output<kB, kStridedHeld<K>, kP>(yr, v, st, wr, br, a.w, a.b, n);
  }
}

// Calls of fewer than kStridedSmallRows rows an SM are latency-bound: each thread's loads are one round trip
// with no gathering before them. Rows of more than 4096 only where fewer than SMs (H200: fp16 421x4097 RMS
// 9.8 -> 10.4 us; 7x4097 6.9 -> 5.4).
constexpr int64_t kStridedSmallRows = 8;

static inline bool strided_small_call(int64_t n, int64_t rows, int sms) {
  return rows < kStridedSmallRows * sms && (n <= 4096 || (rows < sms && n <= 8 * int64_t(kStridedRowMaxThreads)));
}

// The strided-row kernel's plan of a call: K elements a thread on B threads; small, a latency-bound call
// (strided_small_call: the 1024-thread instance); k == 0, a call it does not take.
struct StridedPlan {
  int k, b;
  bool small;
};

// (K, B) of a row of n elements: in a latency-bound call (small), 8 elements a thread on up to 1024 threads
// (rows up to 8192); in the others 16 a thread on a fixed block of 256 threads (rows up to 4096), 512 (up to
// 8192) or 1024. H200, rows of up to 4096 at 8 a thread -> 16 (results/h200-strided-rows.txt): fp16
// 100000x1535 LN 427 -> 347 us, RMS 317 -> 278: twice the bytes in flight a thread (one loss: RMS fp16
// 8000x1100 at an offset, 23.6 -> 25.9). The block size a template constant, not the fewest warps that hold the
// row: the slots' offsets are immediates, 46-48 registers instead of 64, and 5 blocks of 256 an SM instead
// of 4. H200, us, the fewest warps against the fixed block, a call apart (results/h200-strided-fixed-blocks.txt):
// fp32 28532x3938 at an offset RMS 277 -> 224, LN 314 -> 222, 4000x6000 at an offset LN 83 -> 65, bf16
// 20000x8191 at an offset LN 432 -> 276, 30000x2049 RMS 143 -> 111, fp16 16384x4096 at an offset RMS 137 -> 79.
// FASTNORM_STRIDED_ROW_K (read at each call, for A/B runs): =8, 8 a thread on rows up to 4096 in every call (as
// before); =16, 16 in every call.
static inline StridedPlan strided_rows_shape(int64_t n, bool small) {
  if (n > 8192) return {kStridedRowMaxK, kStridedRowMaxThreads, small};
  const int64_t forced = env_int("FASTNORM_STRIDED_ROW_K", 0);
  const int k = forced != 16 && (small || (forced == 8 && n <= 4096)) ? 8 : kStridedRowMaxK;
  if (k == kStridedRowMaxK) return {k, n <= 4096 ? 256 : 512, small};
  return {k, int(((n + k - 1) / k + 31) / 32 * 32), small};
}

// Float32 rows of kStridedF32MinN up to what the offset-row kernels cover (8189: the family the solver plans
// stays the same) that do not start at y's offsets in their 16 bytes (x a view: never a fresh contiguous x), in
// calls that are not latency-bound: the fixed blocks, not the granule kernel (rows up to 24 KB) or the row
// kernel's scalar path (longer). H200, same process, us (results/h200-strided-fixed-blocks.txt): 28532x3938 at
// an offset RMS 249.7 -> 224.4 (torch.compile 253.1, Liger 219 in the sweep), LN 309.8 -> 221.8 (322.4),
// 30000x2049 at an offset LN 184.0 -> 158.6, 4000x6000 at an offset LN 66.5 -> 65.0, 3000x8000 at an offset RMS
// 54.7 -> 50.8. 2-byte rows stay with the granule kernel (bf16 30000x2049 at an offset RMS 89 against 111, fp16
// 100000x1535 LN 340 against 352: a warp's scalar 2-byte loads move half of what 4-byte ones do).
constexpr int64_t kStridedF32MinN = 2048;

static inline bool strided_takes_f32_rows(const NormParams& p, bool small) {
  return elem_size(p.dtype) == 4 && !small && p.n >= kStridedF32MinN &&
         offset_row_chunks(p.n, 4) <= int64_t(kOffsetRowMaxThreads) * kOffsetRowMaxK && offset_rows_shifted(p);
}

// Whether the strided-row kernel takes a last-dim call of VEC-wide accesses (the caller leaves float64 out):
// scalar rows of kStridedRowMinN-16384, no launch override; latency-bound calls (strided_small_call), float16
// calls of kStridedSmallRows rows an SM and more, whose offset-row kernels keep one block an SM (they spilled),
// and the float32 rows of strided_takes_f32_rows. H200, us, the offset-row kernels or the row kernel's scalar
// path -> strided (results/h200-strided-rows.txt): fp32 36x3378 at an offset 6.9 -> 5.2, 834x1429 9.5 -> 8.4,
// bf16 323x1532 padded 6.7 -> 5.9, fp16 730x2250 RMS 10.0 -> 7.5, 15209x12001 RMS 434 -> 371, 58404x8713 padded
// LN 1743 -> 1550. The rest stay: larger bfloat16 calls (100000x1025 LN 248 against 330: 16-byte loads keep more
// bytes in flight than scalar ones) and the float16 calls between (421x4097 RMS 9.8 against 11.6).
// FASTNORM_STRIDED_ROWS=0 / 1 (read at each call, for tests and A/B runs): never / every call it can take.
static inline StridedPlan strided_rows_plan(const NormParams& p, int vec) {
  const StridedPlan none{0, 0, false};
  if (vec != 1 || p.n < kStridedRowMinN || p.n > int64_t(kStridedRowMaxThreads) * kStridedRowMaxK) return none;
  if (p.threads > 0 || p.blocks_per_row > 0) return none;
  const int sms = device_info().sms;
  const bool small = strided_small_call(p.n, p.outer, sms);
  const int64_t forced = env_int("FASTNORM_STRIDED_ROWS", -1);
  const bool take = forced == 0 || forced == 1 ? forced == 1
                                               : small || (p.dtype == FN_F16 && p.outer >= kStridedSmallRows * sms) ||
                                                     strided_takes_f32_rows(p, small);
  return take ? strided_rows_shape(p.n, small) : none;
}

template <typename T>
constexpr int kStridedMinBlocks8 = sizeof(T) == 2 ? 3 : 2;  // K = 8 on up to 512 threads: 40 or 64 registers

template <typename T, typename W>
static inline const char* launch_strided_rows(const NormParams& p, const StridedPlan& s, cudaStream_t stream) {
  constexpr int K16 = kStridedRowMaxK, P = kStridedParamBatch;
  const void* kernel =
      s.k == K16 && s.b == 256 ? reinterpret_cast<const void*>(strided_rows_kernel<T, W, K16, 256, 256, 5, P>)
      : s.k == K16 && s.b == 512 ? reinterpret_cast<const void*>(strided_rows_kernel<T, W, K16, 512, 512, 2, P>)
      : s.k == K16 ? reinterpret_cast<const void*>(strided_rows_kernel<T, W, K16, kStridedRowMaxThreads>)
      : s.small                ? reinterpret_cast<const void*>(strided_rows_kernel<T, W, 8, 0, 1024, 1>)
                               : reinterpret_cast<const void*>(strided_rows_kernel<T, W, 8, 0, 512, kStridedMinBlocks8<T>>);
  return launch_row_grid<T, W>(kernel, p, s.b, s.b, p.outer, stream);
}

}  // namespace fastnorm
