// The fused backward of last-dim rows that one block can hold (1024 threads x 8 elements, 4 in fp64):
// x and dy read once, dx written once, dweight / dbias summed in registers across the rows a block
// handles (a persistent grid), then one partial per block.
//
// A group of `tpr` threads takes a row (tpr a power of two, blockDim / tpr rows per block); thread t
// owns vectors t, t + tpr, ... (at most K), copied with cp.async into shared memory as the forward
// row kernel does, so all of a thread's loads are in flight and no registers hold them. The copies
// run `stages - 1` rows ahead in a ring of buffers (3 by default: LayerNorm needs the next row on chip,
// see below; 2, 3 and 4 measured alike on the H100, so the depth is not what limits the kernel: ncu
// shows it issue-bound, 0.75 warps issued a cycle per scheduler at 50% occupancy). The row's
// statistics are recomputed from the cached row as the forward row kernel takes them (a rough mean,
// then the corrected two-pass sums), in the same pass as the sums of g and g * (x - c). A thread's
// columns are the same in every row, so its dweight / dbias sums stay in registers. (Sums in each
// thread's own shared-memory slots instead, which would free the registers for 16-32 elements a
// thread, measured slower on the H100: bf16 16384x4096 LN 218 -> 270 us, RMS 172 -> 216, 65536x1024
// LN 198 -> 253, even with conflict-free element-major slots; vector-major slots took 413 us.)
// (LayerNorm's two reductions, a rough mean then the corrected sums, measured faster than one
// reduction of per-thread exact moments merged with Chan's formula: bf16 16384x4096 218 against 349 us,
// 65536x1024 198 against 390: the divisions in every merge step of the shuffle tree cost more than the
// second reduction's barrier.)
#pragma once
#include <cstdlib>

#include "backward_common.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int kBackwardRowThreads = 1024;    // threads a row, at most
// Elements a thread owns, at most: 8 (4 in float64), whose dweight / dbias sums fit 64 registers
// (16 spilled).
template <typename T> constexpr int kBackwardThreadElems = sizeof(T) == 8 ? 4 : 8;
constexpr int64_t kBackwardRowSmem = 200 << 10;  // x and dy of a block's rows, all stages, at most
constexpr int kBackwardRowMaxStages = 4;

template <typename T, typename W, int VEC, int K>
__global__ void __launch_bounds__(kBackwardRowThreads, 1) row_backward_kernel(BackwardArgs<T, W> a, int tpr, int stages) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ A sums[2][5 * 32];
  int buf = 0;
  const int sh = __ffs(tpr) - 1, rows_per_block = blockDim.x >> sh;
  const int group = threadIdx.x >> sh, t = threadIdx.x & (tpr - 1);
  const bool rms = a.rms, has_w = a.w != nullptr;
  const int64_t nvec = a.n / VEC;
  const int count = nvec > t ? int((nvec - 1 - t) >> sh) + 1 : 0;  // at most K
  // `stages` buffers of (x, dy) per row group: the next rows' copies are in flight while this one is
  // processed (each thread copies, and reads back, only its own vectors: no barrier needed).
  V* slots = reinterpret_cast<V*>(dyn_smem) + int64_t(group) * 2 * stages * nvec;
  const A inv_n = A(1) / A(a.n);
  A dw[K][VEC], db[K][VEC];
#pragma unroll
  for (int k = 0; k < K; ++k) {
#pragma unroll
    for (int e = 0; e < VEC; ++e) dw[k][e] = A(0), db[k][e] = A(0);
  }
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
  const int64_t first = int64_t(blockIdx.x) * rows_per_block;
  for (int s = 0; s + 1 < stages; ++s) stage(first + group + s * step, s);
  // LayerNorm's rough mean c (one plain sum of x / n) of each row is taken one row early, in the
  // same block reduction as the previous row's sums (one barrier a row instead of two); so LayerNorm
  // waits for two rows to have landed and needs three buffers or more. Here: the first row's.
  A center = A(0);
  if (!rms) {
    if (stages >= 4) cp_async_wait_group<2>();
    else cp_async_wait_group<1>();
    A total[1] = {cached_scaled_sum(slots, t, sh, first + group < a.outer ? count : 0, inv_n)};
    group_sums(total, tpr, sums[buf]);
    buf ^= 1;
    center = total[0];
  }
  int slot = 0;
  for (int64_t base = first; base < a.outer; base += step, slot = slot + 1 == stages ? 0 : slot + 1) {
    const int64_t row = base + group;
    const int c = row < a.outer ? count : 0;
    // The slot refilled is the one the previous row used (the same thread's vectors: already read).
    stage(row + (stages - 1) * step, slot == 0 ? stages - 1 : slot - 1);
    // This row's group has landed (LayerNorm: the next row's too); the later ones may be in flight.
    const int pending = rms ? stages - 1 : stages - 2;
    if (pending >= 3) cp_async_wait_group<3>();
    else if (pending == 2) cp_async_wait_group<2>();
    else cp_async_wait_group<1>();
    const V* xc = slots + int64_t(slot) * 2 * nvec;
    const V* gc = xc + nvec;
    // One pass for the corrected sums of d = x - c and d^2 (RMSNorm: x^2) and the sums of g and
    // g * d; LayerNorm adds the next row's plain sum of x / n.
    A m[5] = {A(0), A(0), A(0), A(0), A(0)};  // sum d, sum d^2, sum g, sum g * d, next row's sum x / n
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
    if (rms) {  // only the sums of x^2 and g * x enter RMSNorm's coefficients
      A two[2] = {m[1], m[3]};
      group_sums(two, tpr, sums[buf]);
      m[1] = two[0], m[3] = two[1];
    } else {
      const int next = slot + 1 == stages ? 0 : slot + 1;
      m[4] = cached_scaled_sum(slots + int64_t(next) * 2 * nvec, t, sh, row + step < a.outer ? count : 0, inv_n);
      group_sums(m, tpr, sums[buf]);
    }
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
      center = m[4];
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
        dw[k][e] = fma(gs[e], xhat, dw[k][e]);
        db[k][e] += gs[e];
      }
      if (a.dx) {
        add_gradient(a.dx_add ? a.dx_add + (c ? row : 0) * a.n : nullptr, i, out);
        store_vec<false>(dxv + i, pack<T>(out));
      }
    }
  }
  // The block's partial: its groups' sums added in group order (through shared memory, which holds
  // at least rows_per_block * n accumulator values: the buffers are 2 * stages * n elements of T a row).
  cp_async_wait_all();  // the last (empty) stages
  A* red = reinterpret_cast<A*>(dyn_smem);
  for (int which = 0; which < 2; ++which) {
    A* out = static_cast<A*>(which == 0 ? a.dw_part : a.db_part);
    if (out == nullptr) continue;
    out += int64_t(blockIdx.x) * a.n;
    __syncthreads();  // the cache (or the previous round) is no longer read
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (k >= count) break;
      const int64_t col = int64_t(t + (k << sh)) * VEC;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const A v = which == 0 ? dw[k][e] : db[k][e];
        if (rows_per_block == 1) out[col + e] = v;
        else red[group * a.n + col + e] = v;
      }
    }
    if (rows_per_block == 1) continue;
    __syncthreads();
    for (int64_t col = threadIdx.x; col < a.n; col += blockDim.x) {
      A s = A(0);
      for (int g = 0; g < rows_per_block; ++g) s += red[g * a.n + col];
      out[col] = s;
    }
  }
}

// How the row backward runs a call (tpr == 0: it does not take it).
struct RowBackwardPlan {
  int tpr, threads, k, grid, stages;
  size_t smem;
};

// FASTNORM_ROW_BWD_STAGES (read at each call, for A/B runs): the row backward's buffers, 2-4 (LayerNorm
// takes at least 3).
static inline int row_backward_max_stages() {
  const char* env = std::getenv("FASTNORM_ROW_BWD_STAGES");
  const int v = env ? std::atoi(env) : 0;
  return v >= 2 && v <= kBackwardRowMaxStages ? v : 3;
}

template <typename T, typename W, int VEC, int K>
static inline const void* row_backward_kernel_ptr() {
  return reinterpret_cast<const void*>(row_backward_kernel<T, W, VEC, K>);
}

// Vectors a thread owns, at most (K in {1, 2, 4}, at most kBackwardThreadElems elements).
template <typename T, int VEC>
constexpr int row_backward_max_k() {
  return kBackwardThreadElems<T> / VEC >= 4 ? 4 : kBackwardThreadElems<T> / VEC >= 2 ? 2 : 1;
}

template <typename T, typename W, int VEC, int K>
static inline const void* row_backward_kernel_of(int k) {
  if constexpr (K >= 4) {
    if (k == 4) return row_backward_kernel_ptr<T, W, VEC, 4>();
  }
  if constexpr (K >= 2) {
    if (k == 2) return row_backward_kernel_ptr<T, W, VEC, 2>();
  }
  return k == 1 ? row_backward_kernel_ptr<T, W, VEC, 1>() : nullptr;
}

template <typename T, typename W, int VEC>
static inline RowBackwardPlan plan_row_backward(const NormBackwardParams& p) {
  using V = Vec<T, VEC>;
  const RowBackwardPlan none{0, 0, 0, 0, 0, 0};
  constexpr int kMaxK = row_backward_max_k<T, VEC>();
  const int64_t nvec = p.n / VEC;
  const int tpr = pow2_at_least((nvec + kMaxK - 1) / kMaxK);
  if (tpr > kBackwardRowThreads) return none;
  const int k = pow2_at_least((nvec + tpr - 1) / tpr);
  const int threads = tpr > 256 ? tpr : 256;
  const int64_t rows_per_block = threads / tpr;
  const int64_t stage_bytes = rows_per_block * 2 * nvec * int64_t(sizeof(V));  // x and dy of the block's rows
  if (2 * stage_bytes > kBackwardRowSmem) return none;
  const void* kernel = row_backward_kernel_of<T, W, VEC, kMaxK>(k);
  if (kernel == nullptr) return none;
  static bool smem_allowed[3] = {false, false, false};
  const int which = k == 1 ? 0 : k == 2 ? 1 : 2;
  if (!smem_allowed[which]) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(kMaxSmem));
    smem_allowed[which] = true;
  }
  const int per_sm = blocks_per_sm(kernel, threads, size_t(2 * stage_bytes));
  if (per_sm < 1) return none;
  // As many stages as fit without costing a resident block (registers limit the blocks first), at
  // least the 3 that LayerNorm's early rough mean needs (3 x 64 KB fit at most).
  const int least = p.rms ? 2 : 3;
  int stages = std::max(row_backward_max_stages(), least);
  while (stages > least && (stages * stage_bytes > kBackwardRowSmem ||
                            blocks_per_sm(kernel, threads, size_t(stages * stage_bytes)) < per_sm)) --stages;
  if (stages * stage_bytes > kBackwardRowSmem) return none;
  const Device dev = device_info();
  const int64_t blocks = (p.outer + rows_per_block - 1) / rows_per_block;
  const int64_t resident = int64_t(per_sm) * dev.sms;
  return RowBackwardPlan{tpr, threads, k, int(blocks < resident ? blocks : resident), stages,
                         size_t(stages * stage_bytes)};
}

template <typename T, typename W, int VEC>
static inline const char* launch_row_backward(const NormBackwardParams& p, const RowBackwardPlan& plan, void* dw_part,
                                       void* db_part, cudaStream_t stream) {
  BackwardArgs<T, W> a{static_cast<const T*>(p.x), static_cast<const T*>(p.dy), static_cast<const W*>(p.weight),
                       static_cast<T*>(p.dx), static_cast<const T*>(p.dx_add), p.outer, p.n, 1, p.x_outer_stride, p.eps, p.rms, dw_part, db_part};
  const void* kernel = row_backward_kernel_of<T, W, VEC, row_backward_max_k<T, VEC>()>(plan.k);
  int tpr = plan.tpr, stages = plan.stages;
  void* args[] = {&a, &tpr, &stages};
  const cudaError_t err = cudaLaunchKernel(kernel, dim3(plan.grid), dim3(plan.threads), args, plan.smem, stream);
  return launch_result(err);
}

}  // namespace fastnorm
