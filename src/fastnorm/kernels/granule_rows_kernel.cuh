// Granule rows (granule_rows_kernel): scalar rows of 2- and 4-byte elements (odd n, row starts off a 16-byte
// boundary, x a shifted view such as x[:, 1:]), a block of B threads a row. Thread t loads the 16-byte granules
// t, t + B, ... of x's 16-byte grid that hold the row, all at once: aligned 16-byte loads at any offset, a
// sector's worth a lane where the strided kernel's scalar loads move 2 or 4 bytes. The statistics come from those
// registers (elements outside the row masked); the output is written in y's 16-byte grid (store_granule_row),
// x's granules read again (L1 or L2: the block has just loaded them) and realigned in registers where x's and
// y's rows start at other offsets, the parameters likewise. No shared memory but the block sums.
//
// Statistics: a plain sum gives a rough mean c, then the corrected two-pass sums of d = x - c (as the
// row kernel); the output is (x - center) * rstd + offset (Affine), so rows far from zero stay exact.
#pragma once
#include "cuda_launch.cuh"
#include "cuda_rows.cuh"
#include "offset_rows_kernel.cuh"
#include "strided_rows_kernel.cuh"

namespace fastnorm {

constexpr int kGranuleRowMaxThreads = 1024;
constexpr int kGranuleRowMaxK = 4;  // granules a thread

// The row's sum over the thread's granules of f(value) (elements outside the row: nothing). The first and last
// granules of the row are partial; the others are summed without a test.
template <int K, typename A, typename T, typename F>
__device__ __forceinline__ A granule_sum(const uint4 (&raw)[K], int off, int n, int chunks, F&& f) {
  constexpr int E = 16 / int(sizeof(T));
  const int t = threadIdx.x, B = blockDim.x;
  A s = A(0);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = t + B * k;
    if (c < chunks) {
      A v[E];
      widen(reinterpret_cast<const Vec<T, E>*>(&raw[k])->v, v);
      const int i0 = c * E - off;
      if (i0 >= 0 && i0 + E <= n) {
#pragma unroll
        for (int e = 0; e < E; ++e) s += f(v[e]);
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) {
          if (i0 + e >= 0 && i0 + e < n) s += f(v[e]);
        }
      }
    }
  }
  return s;
}

// K: granules a thread can hold (B * K covers the row's granules). A block takes rows blockIdx.x, + gridDim.x, ...
template <typename T, typename W, int K>
__global__ void __launch_bounds__(kGranuleRowMaxThreads) granule_rows_kernel(RowArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  constexpr int E = 16 / int(sizeof(T));
  __shared__ A sums[2][2 * 32];  // block_sums' partials: two buffers, one barrier a call
  int buf = 0;
  const int n = int(a.n), t = threadIdx.x, B = blockDim.x;
  const A inv_n = A(1) / A(n);
  const bool rms = a.rms;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const T* xr = a.x + row * a.x_stride;
    const int off = int(reinterpret_cast<uintptr_t>(xr) & 15) / int(sizeof(T));
    const uint4* xg = reinterpret_cast<const uint4*>(xr - off);
    const int chunks = (off + n + E - 1) / E;
    uint4 raw[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (t + B * k < chunks) raw[k] = xg[t + B * k];
    }
    A s[1] = {rms ? granule_sum<K, A, T>(raw, off, n, chunks, [](A v) { return v * v; })
                  : granule_sum<K, A, T>(raw, off, n, chunks, [](A v) { return v; })};
    block_sums(s, sums[buf]);
    buf ^= 1;
    Affine<A> st;
    if (rms) {
      st = affine_of(A(0), A(0), s[0] * inv_n, a.eps, true);
    } else {
      const A c = s[0] * inv_n;
      A q[2] = {granule_sum<K, A, T>(raw, off, n, chunks, [c](A v) { return v - c; }),
                granule_sum<K, A, T>(raw, off, n, chunks, [c](A v) { return (v - c) * (v - c); })};
      block_sums(q, sums[buf]);
      buf ^= 1;
      const A mean_d = q[0] * inv_n;
      st = affine_of(c, mean_d, corrected_variance(mean_d, q[1] * inv_n), a.eps, false);
    }
    if (a.stats && t == 0) save_affine(a.stats, row, st);
    store_granule_row(reinterpret_cast<const Vec<T, 1>*>(xr), a.y + row * int64_t(n), n, a.w, a.b, st, rms, t, B);
  }
}

// (K, B) of a row of n elements: the granules of a row at its worst offset, K a thread on the fewest warps that hold
// them; K == 0: past kGranuleRowMaxK granules on kGranuleRowMaxThreads threads.
struct GranulePlan {
  int k, b;
};

static inline GranulePlan granule_rows_shape(int64_t n, int elem, int k) {
  const int64_t chunks = (n * elem + 15 + 15) / 16;
  if (k < 1 || k > kGranuleRowMaxK || chunks > int64_t(kGranuleRowMaxThreads) * k) return {0, 0};
  return {k, int(((chunks + k - 1) / k + 31) / 32 * 32)};
}

// Rows it takes: scalar 2- and 4-byte rows of kGranuleRowMinN (float16: kGranuleRowMinNF16) up to kGranuleRowMaxBytes
// (inside what the offset-row kernels cover, so the solver's family of such a call is unchanged), in calls that are not
// latency-bound (strided_small_call: the strided kernel's), 4 granules a thread. Since session 45 the float32 rows go
// to the strided kernel's fixed blocks (strided_takes_f32_rows): it plans 2-byte rows only. H200, us, same process,
// against the kernels planned before (strided for float16, chunked offset-row for bfloat16, the row kernel's scalar
// path for shifted float32 rows; results/h200-strided-rows.txt): RMS fp16 16384x4096 off1 127.4 -> 80.9 (torch.compile
// 81.5), LN fp16 15209x12001 453 -> 304, 8000x1100 off3 RMS 25.9 -> 20.7, RMS bf16 16384x4097 119.8 -> 86.1, 30000x2049
// off1 116.7 -> 88.9, 1762x4744 off3 19.8 -> 14.7, LN 20000x8191 381.5 -> 288.2, RMS fp32 28532x3938 off2 286.4 ->
// 249.3 (252.6), LN fp32 4000x6000 off1 70.3 -> 66.9; LN fp16 100000x1535 level. Left to the others: bf16 rows under
// 2048 (100000x1025 LN 248 against 305, 11231x1997 41 against 48: fewer bytes in flight a thread on small blocks),
// float32 rows of 32 KB (3000x8000 off1 RMS 54.8 against 59.5), float32 rows whose x starts at y's offsets, which the
// chunked offset-row kernel reads in y's grid with no realignment (18120x5818 padded LN 259.7 against 284.9, session
// 42's sweeps), rows of 256-1024 (a block a row: fp32 100000x257 RMS 58 against 76 on the warp-row kernel).
// FASTNORM_GRANULE_ROWS=0 / 1 (read at each call, for tests and A/B runs): never / every call of 256+ elements it can
// hold, at FASTNORM_GRANULE_ROW_K granules a thread (1, 2 or 4; default 4); set, FASTNORM_STRIDED_ROWS or
// FASTNORM_OFFSET_ROWS leave the call to the kernel they force.
constexpr int64_t kGranuleRowMinN = 2048;
constexpr int64_t kGranuleRowMinNF16 = 1025;
constexpr int64_t kGranuleRowMaxBytes = 24 << 10;

static inline GranulePlan granule_rows_plan(const NormParams& p, int vec) {
  const int elem = elem_size(p.dtype);
  if (vec != 1 || (elem != 2 && elem != 4) || p.threads > 0 || p.blocks_per_row > 0) return {0, 0};
  const int64_t forced = env_int("FASTNORM_GRANULE_ROWS", -1);
  const int k = int(env_int("FASTNORM_GRANULE_ROW_K", kGranuleRowMaxK));
  if (forced == 0 || forced == 1) return forced == 1 && p.n >= 256 ? granule_rows_shape(p.n, elem, k) : GranulePlan{0, 0};
  // A test or A/B run that forces another kernel of the family (FASTNORM_STRIDED_ROWS, FASTNORM_OFFSET_ROWS) gets it.
  if (std::getenv("FASTNORM_STRIDED_ROWS") || std::getenv("FASTNORM_OFFSET_ROWS")) return {0, 0};
  const int64_t min_n = p.dtype == FN_F16 ? kGranuleRowMinNF16 : kGranuleRowMinN;
  if (p.n < min_n || p.n * elem > kGranuleRowMaxBytes || strided_small_call(p.n, p.outer, device_info().sms)) return {0, 0};
  if (elem == 4 && !offset_rows_shifted(p)) return {0, 0};  // (the chunked offset-row kernel: see above)
  if (strided_takes_f32_rows(p, false)) return {0, 0};       // (the strided kernel's fixed blocks)
  return granule_rows_shape(p.n, elem, k);
}

template <typename T, typename W>
static inline const char* launch_granule_rows(const NormParams& p, const GranulePlan& g, cudaStream_t stream) {
  const void* kernel = g.k == 1   ? reinterpret_cast<const void*>(granule_rows_kernel<T, W, 1>)
                       : g.k == 2 ? reinterpret_cast<const void*>(granule_rows_kernel<T, W, 2>)
                                  : reinterpret_cast<const void*>(granule_rows_kernel<T, W, 4>);
  return launch_row_grid<T, W>(kernel, p, g.b, g.b, p.outer, stream);
}

}  // namespace fastnorm
