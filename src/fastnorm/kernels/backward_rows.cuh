// The fused backward of last-dim rows that one block can hold (1024 threads x 4 vectors): x and dy
// read once, dx written once, dweight / dbias summed over the rows a block handles (a persistent
// grid), then one partial per block.
//
// A group of `tpr` threads takes a row (tpr a power of two, blockDim / tpr rows per block); thread t
// owns vectors t, t + tpr, ... (at most K), copied with cp.async into shared memory as the forward
// row kernel does, so all of a thread's loads are in flight and no registers hold them; with two
// stages the next row's copies are in flight while this one is processed. The row's statistics are
// recomputed from the cached row as the forward row kernel takes them (a rough mean, then the
// corrected two-pass sums), in the same pass as the sums of g and g * (x - c). A thread's columns
// are the same in every row, so it sums its dweight / dbias in its own shared-memory slots (no
// barrier; registers held them before and capped the blocks an SM at 2: H100, bf16 16384x4096 LN
// 218 us).
#pragma once
#include "backward_common.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int kBackwardRowThreads = 1024;        // threads a row, at most
constexpr int kBackwardMaxK = 4;                 // vectors a thread owns, at most
constexpr int64_t kBackwardRowSmem = 200 << 10;  // a block's buffers and sums, at most

// Shared memory of a block: `stages` buffers of (x, dy) per row group, then the groups' dweight
// sums, then their dbias sums (each n accumulator values a group, when asked for).
template <typename T, int VEC>
__host__ __device__ constexpr int64_t row_backward_buffer_bytes(int64_t n, int stages) {
  return int64_t(stages) * 2 * (n / VEC) * int64_t(sizeof(Vec<T, VEC>));
}

template <typename T, typename W, int VEC, int K>
__global__ void __launch_bounds__(kBackwardRowThreads, 1) row_backward_kernel(BackwardArgs<T, W> a, int tpr, int stages) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  using VA = Vec<A, VEC>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ A sums[2][4 * 32];
  int buf = 0;
  const int sh = __ffs(tpr) - 1, rows_per_block = blockDim.x >> sh;
  const int group = threadIdx.x >> sh, t = threadIdx.x & (tpr - 1);
  const bool rms = a.rms, has_w = a.w != nullptr;
  const int64_t nvec = a.n / VEC;
  const int count = nvec > t ? int((nvec - 1 - t) >> sh) + 1 : 0;  // at most K
  V* slots = reinterpret_cast<V*>(dyn_smem) + int64_t(group) * stages * 2 * nvec;
  VA* sums_base = reinterpret_cast<VA*>(dyn_smem + rows_per_block * row_backward_buffer_bytes<T, VEC>(a.n, stages));
  VA* dw_sum = a.dw_part ? sums_base + int64_t(group) * nvec : nullptr;
  VA* db_sum = a.db_part ? sums_base + (int64_t(a.dw_part ? rows_per_block : 0) + group) * nvec : nullptr;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (k >= count) break;
    const int i = t + (k << sh);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      if (dw_sum) dw_sum[i].v[e] = A(0);
      if (db_sum) db_sum[i].v[e] = A(0);
    }
  }
  const A inv_n = A(1) / A(a.n);
  const int64_t step = int64_t(gridDim.x) * rows_per_block;
  // Issues the copies of `row` (nothing past the last row) into buffer `slot` as one group.
  auto stage = [&](int64_t row, int slot) {
    const int c = row < a.outer ? count : 0;
    const V* xv = reinterpret_cast<const V*>(a.x + (c ? row : 0) * a.x_stride);
    const V* gv = reinterpret_cast<const V*>(a.dy + (c ? row : 0) * a.n);
    V* xs = slots + int64_t(slot) * 2 * nvec;
    for (int k = 0; k < c; ++k) {
      const int i = t + (k << sh);
      if constexpr (sizeof(V) >= 4) {
        cp_async<int(sizeof(V)), false>(xs + i, xv + i);
        cp_async<int(sizeof(V)), false>(xs + nvec + i, gv + i);
      } else {
        xs[i] = xv[i];
        xs[nvec + i] = gv[i];
      }
    }
    cp_async_commit();
  };
  int slot = 0;
  const int64_t first = int64_t(blockIdx.x) * rows_per_block + group;
  if (stages == 2) stage(first, 0);
  for (int64_t base = int64_t(blockIdx.x) * rows_per_block; base < a.outer; base += step) {
    const int64_t row = base + group;
    const int c = row < a.outer ? count : 0;
    if (stages == 2) {
      stage(row + step, slot ^ 1);
      cp_async_wait_group<1>();  // this row's group has landed; the next one may still be in flight
    } else {
      stage(row, 0);
      cp_async_wait_group<0>();
    }
    const V* xc = slots + int64_t(slot) * 2 * nvec;
    const V* gc = xc + nvec;
    slot ^= stages - 1;
    // LayerNorm's rough mean c (one plain sum of x / n), then one pass for the corrected sums of
    // d = x - c and d^2 (RMSNorm: x^2) and the sums of g and g * d.
    A center = A(0);
    if (!rms) {
      A total[1] = {cached_scaled_sum(xc, t, sh, c, inv_n)};
      group_sums(total, tpr, sums[buf]);
      buf ^= 1;
      center = total[0];
    }
    A m[4] = {A(0), A(0), A(0), A(0)};  // sum d, sum d^2, sum g, sum g * d
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (k >= c) break;
      const int i = t + (k << sh);
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
    group_sums(m, tpr, sums[buf]);
    buf ^= 1;
    GradCoeffs<A> co;
    if (rms) {
      co.st = affine_of(A(0), A(0), m[1] * inv_n, a.eps, true);
      co.c1 = A(0);
      co.c2 = co.st.rstd * m[3] * inv_n;
    } else {
      const A mean_d = m[0] * inv_n;
      co.st = affine_of(center, mean_d, corrected_variance(mean_d, m[1] * inv_n), a.eps, false);
      co.c1 = m[2] * inv_n;
      co.c2 = co.st.rstd * (m[3] * inv_n - mean_d * co.c1);
    }
    V* dxv = reinterpret_cast<V*>(a.dx + (c ? row : 0) * a.n);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (k >= c) break;
      const int i = t + (k << sh);
      A xs[VEC], gs[VEC], wv[VEC], out[VEC];
      widen(xc[i].v, xs);
      widen(gc[i].v, gs);
      if (has_w) load_params<false, VEC>(a.w + int64_t(i) * VEC, wv);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        A xhat;
        out[e] = grad_input(xs[e], has_w ? gs[e] * wv[e] : gs[e], co, xhat);
        if (dw_sum) dw_sum[i].v[e] = fma(gs[e], xhat, dw_sum[i].v[e]);
        if (db_sum) db_sum[i].v[e] += gs[e];
      }
      if (a.dx) {
        add_gradient(a.dx_add ? a.dx_add + (c ? row : 0) * a.n : nullptr, i, out);
        store_vec<false>(dxv + i, pack<T>(out));
      }
    }
  }
  // The block's partial: its groups' sums added in group order.
  cp_async_wait_all();  // the last (empty) stage
  __syncthreads();
  for (int which = 0; which < 2; ++which) {
    A* out = static_cast<A*>(which == 0 ? a.dw_part : a.db_part);
    if (out == nullptr) continue;
    const A* s = reinterpret_cast<const A*>(sums_base) + (which == 1 && a.dw_part ? rows_per_block * a.n : 0);
    out += int64_t(blockIdx.x) * a.n;
    for (int64_t col = threadIdx.x; col < a.n; col += blockDim.x) {
      A total = A(0);
      for (int g = 0; g < rows_per_block; ++g) total += s[g * a.n + col];
      out[col] = total;
    }
  }
}

// How the row backward runs a call (tpr == 0: it does not take it).
struct RowBackwardPlan {
  int tpr, threads, k, grid, stages;
  size_t smem;
};

template <typename T, typename W, int VEC, int K>
static inline const void* row_backward_kernel_ptr() {
  return reinterpret_cast<const void*>(row_backward_kernel<T, W, VEC, K>);
}

template <typename T, typename W, int VEC>
static inline const void* row_backward_kernel_of(int k) {
  if (k == 4) return row_backward_kernel_ptr<T, W, VEC, 4>();
  if (k == 2) return row_backward_kernel_ptr<T, W, VEC, 2>();
  return k == 1 ? row_backward_kernel_ptr<T, W, VEC, 1>() : nullptr;
}

// Two stages where they fit the shared-memory budget, else one; none: the call goes elsewhere.
template <typename T, typename W, int VEC>
static inline RowBackwardPlan plan_row_backward(const NormBackwardParams& p) {
  using A = typename AccOf<T>::type;
  const RowBackwardPlan none{0, 0, 0, 0, 0, 0};
  // Threads a row: one vector each up to 512 (short rows share a block), then up to 4 vectors each
  // at 512 threads (none idle), then 1024 threads.
  const int64_t nvec = p.n / VEC;
  const int tpr = nvec <= 512 ? pow2_at_least(nvec) : nvec <= 512 * kBackwardMaxK ? 512 : kBackwardRowThreads;
  const int k = pow2_at_least((nvec + tpr - 1) / tpr);
  if (k > kBackwardMaxK) return none;
  const int threads = tpr > 256 ? tpr : 256;
  const int64_t rows_per_block = threads / tpr;
  const int64_t sum_bytes = rows_per_block * p.n * int64_t(sizeof(A)) * ((p.dweight ? 1 : 0) + (p.dbias ? 1 : 0));
  int stages = 2;
  while (stages > 0 && rows_per_block * row_backward_buffer_bytes<T, VEC>(p.n, stages) + sum_bytes > kBackwardRowSmem) --stages;
  if (stages == 0) return none;
  const int64_t smem = rows_per_block * row_backward_buffer_bytes<T, VEC>(p.n, stages) + sum_bytes;
  const void* kernel = row_backward_kernel_of<T, W, VEC>(k);
  if (kernel == nullptr) return none;
  static bool smem_allowed[3] = {false, false, false};
  const int which = k == 1 ? 0 : k == 2 ? 1 : 2;
  if (!smem_allowed[which]) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem));
    smem_allowed[which] = true;
  }
  const int per_sm = blocks_per_sm(kernel, threads, size_t(smem));
  if (per_sm < 1) return none;
  const Device dev = device_info();
  const int64_t blocks = (p.outer + rows_per_block - 1) / rows_per_block;
  const int64_t resident = int64_t(per_sm) * dev.sms;
  return RowBackwardPlan{tpr, threads, k, int(blocks < resident ? blocks : resident), stages, size_t(smem)};
}

template <typename T, typename W, int VEC>
static inline const char* launch_row_backward(const NormBackwardParams& p, const RowBackwardPlan& plan, void* dw_part,
                                       void* db_part, cudaStream_t stream) {
  BackwardArgs<T, W> a{static_cast<const T*>(p.x), static_cast<const T*>(p.dy), static_cast<const W*>(p.weight),
                       static_cast<T*>(p.dx), static_cast<const T*>(p.dx_add), p.outer, p.n, 1, p.x_outer_stride, p.eps, p.rms, dw_part, db_part};
  const void* kernel = row_backward_kernel_of<T, W, VEC>(plan.k);
  int tpr = plan.tpr, stages = plan.stages;
  void* args[] = {&a, &tpr, &stages};
  const cudaError_t err = cudaLaunchKernel(kernel, dim3(plan.grid), dim3(plan.threads), args, plan.smem, stream);
  return launch_result(err);
}

}  // namespace fastnorm
