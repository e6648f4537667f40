// The packed-row kernel: rows whose bytes divide 16 (2-byte rows of 1, 2, 4 or 8 elements, 4-byte rows of 1, 2
// or 4, float64 rows of 1 or 2), x contiguous, x and y at 16-byte boundaries. A 16-byte vector holds whole
// rows, so a thread loads its vectors at once, normalizes the rows they hold in registers and stores them
// back: no shared memory, no barrier, as an elementwise kernel. Rows under 16 bytes took the thread-row
// kernel (a thread a row, an element load at a time, outputs through shared memory: 2-8 bytes a thread in
// flight), rows of 16 bytes the row kernel (a vector a thread through shared memory). H200, us, before ->
// after (torch.compile): RMS bf16 1000000x1 9.15 -> 5.01 (4.75), 20000000x1 88.0 -> 23.3 (23.0), bf16
// 1000000x2 9.54 -> 5.28 (6.14), fp32 1000000x2 9.54 -> 6.98 (7.33), LN fp32 1000000x1 9.86 -> 5.98 (5.89);
// 16-byte rows: LN fp16 14529x8 4.83 -> 4.10 (4.10), RMS bf16 1000000x8 13.9 -> 12.1 (11.9), LN bf16
// 200000x8 6.66 -> 5.62 (5.54), LN fp32 1000000x4 14.8 -> 11.1 (20.4) (results/h200-packed-rows.txt).
// Part of the offset-row family (FASTNORM_WANT_OFFSET_ROWS; the solver's planner_rules.py mirrors the rule).
#pragma once
#include "cuda_launch.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int kPackedRowThreads = 256;

// N: elements a row (a divisor of the vector's VEC); kVectors: vectors a thread.
template <typename T, typename W, int N, int kVectors>
__global__ void __launch_bounds__(kPackedRowThreads) packed_rows_kernel(RowArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  constexpr int VEC = 16 / sizeof(T), R = VEC / N;  // elements and rows a vector
  using V = Vec<T, VEC>;
  const int64_t whole = a.rows / R;  // vectors of R rows each; the rows after them: the tail below
  const int64_t first = int64_t(blockIdx.x) * (kVectors * kPackedRowThreads) + threadIdx.x;
  const V* xv = reinterpret_cast<const V*>(a.x);
  V* yv = reinterpret_cast<V*>(a.y);
  V r[kVectors];
#pragma unroll
  for (int u = 0; u < kVectors; ++u) {
    const int64_t i = first + u * kPackedRowThreads;
    if (i < whole) r[u] = load_vec<false>(xv + i);
  }
  A wv[N], bv[N];  // a row's parameters serve every row
#pragma unroll
  for (int k = 0; k < N; ++k) {
    wv[k] = a.w ? A(to_acc(a.w[k])) : A(1);
    bv[k] = a.b ? A(to_acc(a.b[k])) : A(0);
  }
  const A inv_n = A(1) / A(N);
  const bool rms = a.rms;
#pragma unroll
  for (int u = 0; u < kVectors; ++u) {
    const int64_t i = first + u * kPackedRowThreads;
    if (i < whole) {
      A vals[VEC];
      widen(r[u].v, vals);
#pragma unroll
      for (int q = 0; q < R; ++q) {
        A row[N];
#pragma unroll
        for (int k = 0; k < N; ++k) row[k] = vals[q * N + k];
        const Affine<A> st = thread_row_affine(row, N, inv_n, a.eps, rms);
#pragma unroll
        for (int k = 0; k < N; ++k) vals[q * N + k] = fma(normalized(row[k], st), wv[k], bv[k]);
      }
      store_vec<false>(yv + i, pack<T, VEC>(vals));
    }
  }
  const int64_t tail = whole - int64_t(blockIdx.x) * (kVectors * kPackedRowThreads);  // its slot in this block
  if (tail >= 0 && tail < kVectors * kPackedRowThreads && int(tail % kPackedRowThreads) == int(threadIdx.x)) {
    // the last rows, fewer than a vector's, element by element
    for (int64_t q = whole * R; q < a.rows; ++q) {
      A row[N];
#pragma unroll
      for (int k = 0; k < N; ++k) row[k] = A(to_acc(a.x[q * N + k]));
      const Affine<A> st = thread_row_affine(row, N, inv_n, a.eps, rms);
#pragma unroll
      for (int k = 0; k < N; ++k) a.y[q * N + k] = from_acc<T>(fma(normalized(row[k], st), wv[k], bv[k]));
    }
  }
}

// Whether the packed-row kernel takes a last-dim call: contiguous rows of at most 16 bytes that divide 16, x
// and y 16-byte aligned, no tuning override, no training statistics to save. (It saved them once: 12 bytes
// a row from R rows a thread, written 12R bytes apart across a warp, made the training step of RMS bf16
// 1000000x2 59.8 us against the thread-row kernel's 34.2.) FASTNORM_PACKED_ROWS=0 (read at each call, for
// tests and A/B runs) leaves them to the thread-row kernel (under 16 bytes) and the row kernel (16).
static inline bool packed_rows_take(const NormParams& p) {
  const int64_t bytes = p.n * elem_size(p.dtype);
  if (bytes <= 0 || 16 % bytes != 0 || p.stats || p.threads > 0 || p.blocks_per_row > 0) return false;
  if (env_int("FASTNORM_PACKED_ROWS", 1) == 0) return false;
  return (p.x_outer_stride == p.n || p.outer == 1) && aligned16(p.x) && aligned16(p.y);
}

template <typename T, typename W, int N>
static inline const void* packed_rows_kernel_of(int64_t n, int vectors) {
  if constexpr (N > 16 / int(sizeof(T))) {
    return nullptr;
  } else {
    if (n != N) return packed_rows_kernel_of<T, W, N * 2>(n, vectors);
    return vectors == 2 ? reinterpret_cast<const void*>(packed_rows_kernel<T, W, N, 2>)
                        : reinterpret_cast<const void*>(packed_rows_kernel<T, W, N, 1>);
  }
}

// Vectors a thread: 1, or 2 for rows of 16 bytes (one row a vector). H200, 2 against 1: LN bf16 200000x8
// 5.95 -> 5.62 us, other 16-byte rows level; rows under 16 bytes level or up to 3% slower (bf16 20000000x1
// 23.3 -> 24.0). FASTNORM_PACKED_ROW_VECTORS=1 or 2 (read at each call, for A/B runs) sets it.
template <typename T, typename W>
static inline const char* launch_packed_rows(const NormParams& p, cudaStream_t stream) {
  RowArgs<T, W> a{static_cast<const T*>(p.x), static_cast<T*>(p.y), static_cast<const W*>(p.weight),
                  static_cast<const W*>(p.bias), p.outer, p.n, p.n, p.eps, 1, p.rms, nullptr};
  const int64_t rows_a_vector = 16 / (p.n * elem_size(p.dtype));
  const int vectors = int(env_int("FASTNORM_PACKED_ROW_VECTORS", rows_a_vector == 1 ? 2 : 1)) == 2 ? 2 : 1;
  const int64_t vecs = p.outer / rows_a_vector + 1;  // + 1: the thread of the tail rows (or none)
  const int64_t per_block = int64_t(vectors) * kPackedRowThreads;
  const void* kernel = packed_rows_kernel_of<T, W, 1>(p.n, vectors);
  void* args[] = {&a};
  return launch_result(cudaLaunchKernel(kernel, dim3(unsigned((vecs + per_block - 1) / per_block)),
                                        dim3(kPackedRowThreads), args, 0, stream));
}

}  // namespace fastnorm
