// The resident kernel: rows of 4-17 MB held on chip by one block per SM, one row after another
// behind a grid barrier, the next rows staged meanwhile; its plan and launcher.
#pragma once
#include <algorithm>

#include "cuda_bulk.cuh"
#include "cuda_launch.cuh"
#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int64_t kStreamRowBytes = 4 << 20;  // rows from 4 MB up, fewer than the SMs: resident or streamed
constexpr int64_t kResidentRowBytes = 8 << 20;  // the resident kernel's rows in one group, at least
// Rows of a call, at least, for two groups of the resident kernel (see resident_groups).
constexpr int64_t kGroupedRows = 2;

// Weight and bias of the K grid-strided vectors a thread of the resident kernel owns (vectors
// first, first + step, ...), as slots: weight vector k is slot k, bias vector k slot kb + k. Slots
// below `count` are copied once into shared memory (slot j of this thread at smem[j * threads +
// tid]); the rest are read from L2 whenever used. Each thread copies, and later reads, only its own
// slots: no block barrier is needed around them.
template <typename W, int VEC, int K>
struct ParamSlots {
  ParamVec<W, VEC>* smem;
  int count, tid, threads;

  __device__ __forceinline__ void copy(const W* w, const W* b, int first, int step, int nvec) const {
    const int kb = w ? K : 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = first + k * step;
      if (i >= nvec) continue;
#pragma unroll
      for (int j = 0; j < int(sizeof(ParamVec<W, VEC>) / 16); ++j) {  // VEC * sizeof(W) is a multiple of 16 here
        if (w && k < count)
          cp_async<16>(reinterpret_cast<uint4*>(smem[k * threads + tid].v) + j, reinterpret_cast<const uint4*>(w + i * VEC) + j);
        if (b && kb + k < count)
          cp_async<16>(reinterpret_cast<uint4*>(smem[(kb + k) * threads + tid].v) + j, reinterpret_cast<const uint4*>(b + i * VEC) + j);
      }
    }
  }

  // The parameters of the thread's vector k (vector i of the row), converted.
  template <typename A>
  __device__ __forceinline__ void values(const W* w, const W* b, int k, int i, A (&wv)[VEC], A (&bv)[VEC]) const {
    const int kb = w ? K : 0;
    if (w) widen((k < count ? smem[k * threads + tid] : load_param_vec<false, W, VEC>(w + int64_t(i) * VEC)).v, wv);
    if (b) widen((kb + k < count ? smem[(kb + k) * threads + tid] : load_param_vec<false, W, VEC>(b + int64_t(i) * VEC)).v, bv);
  }
};

// Resident rows, rows of megabytes: one cooperative wave of blocks (one per SM) holds a
// whole row on chip, K vectors of x per thread in registers, and keeps weight and bias in shared
// memory, copied once for all rows (the vectors that do not fit come from L2 every row). Rows go
// one after the other: the blocks' partial statistics meet behind a grid-wide barrier, then every
// block normalizes its part from registers. x is read once, y written once, parameters read once.
// From the moment a block arrives at a row's barrier, its vectors of the next rows are staged
// (`prefetch`), so DRAM keeps streaming through the barrier: the next row is copied into a
// shared-memory buffer where there is room beside the parameters, else prefetched into L2, where its
// loads find it (float32 LayerNorm of 16 MB rows, whose 32 MB of parameters leave no room: 289 ->
// 260 us on 16x4194304, H100; DRAM reads rose from 302 to 324 MB, L2 losing a few of the lines).
// With a buffer, the row after the next one can go to L2 as well, so that the buffer's copies come
// from there: rows of 8 MB gain (bf16 16x4194304 LN 158 -> 148 us, fp32 32x2097152 LN 278 -> 256),
// rows of 16 MB lose (fp32 RMS 16x4194304: 220 -> 235 us: L2 does not keep two rows).
// With kGroups = 2 the blocks form two groups that take alternate rows, each behind its own barrier:
// a group's blocks hold twice the vectors a thread (for rows of 4-8 MB, whose critical path per row
// would otherwise cost as much as their traffic), and two rows are in flight.
// Thread t of the group's block b holds vectors g, g + G, ... of the row (g = b * blockDim + t, G
// the group's threads): the block's k-th vectors are one contiguous run of blockDim vectors.
// Statistics are plain sums of moments about the row's first element (shift), in double: the grid
// total is one sum of the blocks' parts, the variance S2 / n - (S1 / n)^2. Since the shift is one
// of the row's values, (mean - shift)^2 <= n var, so the cancellation costs at most a factor n of
// double's precision (n <= 2**24: 4e-9 relative). Each thread's part comes from its exact
// (count, mean, M2) over its registers (two passes). Chan merges (a division per step) cost
// 1.8 us a row per reduction, and DRAM idles while they run (H100).
// A block's part of a row: the sums of x - shift and (x - shift)^2 over its elements.
struct RowMoments {
  double sum, sum_sq;
};
// Bits of the resident kernel's `prefetch`, what it stages while a row waits at its barrier:
// kStageShared, the next row into a shared-memory buffer (TMA copies); kStageL2, a row into L2 (TMA
// prefetches): the next one when there is no buffer, else the one after it.
constexpr int kStageShared = 1, kStageL2 = 2;
constexpr int kResidentThreads = 1024;  // at least the number of SMs: thread j gathers block j's partial
// Row groups of the resident kernel, at most; their arrival counters lie 128 bytes apart.
constexpr int kMaxResidentGroups = 2, kArrivalStride = 32;

template <typename T, typename W, int VEC, int K, int kGroups>
__global__ void __launch_bounds__(kResidentThreads, 1) resident_row_norm_kernel(RowArgs<T, W> a, int smem_slots,
                                                                                int prefetch, SplitWorkspace ws) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  using P = ParamVec<W, VEC>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ A sums[32];
  __shared__ double dsums[2][64];  // consecutive block reductions alternate buffers (see group_sums)
  // The row's first element, copied: 4 bytes (two elements) for 2-byte types, cp.async's smallest.
  constexpr int kShiftBytes = sizeof(T) < 4 ? 4 : int(sizeof(T));
  __shared__ __align__(16) T shift_src[16 / sizeof(T)];
#ifdef FASTNORM_BULK
  __shared__ __align__(8) uint64_t staged_bar;  // completes when the next row's copies have landed
#endif
  const int tid = threadIdx.x, threads = blockDim.x;
  P* slots = reinterpret_cast<P*>(dyn_smem);  // slot j of this thread: slots[j * threads + tid]
  V* next = reinterpret_cast<V*>(slots + smem_slots * threads);  // next row: next[k * threads + tid]
  const bool rms = a.rms, has_w = a.w != nullptr, has_b = a.b != nullptr;
  const int nvec = int(a.n / VEC);  // at most 8 vectors per thread of the group
  // Block b is block b / kGroups of group b % kGroups; group j takes rows j, j + kGroups, ...
  const int group = int(blockIdx.x) % kGroups, gblock = int(blockIdx.x) / kGroups, gblocks = int(gridDim.x) / kGroups;
  const int step = gblocks * threads, first = gblock * threads + tid;
  // Vectors in the block's k-th run, and in all its runs.
  auto run = [&](int k) {
    const int left = nvec - (k * step + gblock * threads);
    return left < 0 ? 0 : left < threads ? left : threads;
  };
  int block_vecs = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) block_vecs += run(k);
  const ParamSlots<W, VEC, K> params{slots, smem_slots, tid, threads};
  params.copy(a.w, a.b, first, step, nvec);
#ifdef FASTNORM_BULK
  if ((prefetch & kStageShared) && tid == 0) mbarrier_init(&staged_bar);
  __syncthreads();
#endif
  // Stages the next rows while row `row` waits at its barrier (see kStage*); thread 0 issues the
  // bulk copies and prefetches.
  auto stage_next = [&](int64_t row) {
    if (row + kGroups >= a.rows) return;
    const T* nx = a.x + (row + kGroups) * a.x_stride;
    if (prefetch & kStageShared) {
      if (!rms && tid == 0) cp_async<kShiftBytes>(shift_src, nx);
#ifdef FASTNORM_BULK
      if (tid == 0) {
        const V* nxv = reinterpret_cast<const V*>(nx) + gblock * threads;
        mbarrier_expect_bytes(&staged_bar, unsigned(block_vecs) * unsigned(sizeof(V)));
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if (run(k) > 0) bulk_copy(&next[k * threads], nxv + k * step, unsigned(run(k)) * unsigned(sizeof(V)), &staged_bar);
        }
      }
#else
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = first + k * step;
        if (i < nvec) cp_async<16>(&next[k * threads + tid], reinterpret_cast<const V*>(nx) + i);
      }
#endif
    }
#ifdef FASTNORM_BULK
    const int64_t l2_row = row + ((prefetch & kStageShared) ? 2 : 1) * kGroups;
    if ((prefetch & kStageL2) && tid == 0 && l2_row < a.rows) {
      const V* lv = reinterpret_cast<const V*>(a.x + l2_row * a.x_stride) + gblock * threads;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (run(k) > 0) bulk_prefetch_l2(lv + k * step, unsigned(run(k)) * unsigned(sizeof(V)));
      }
    }
#endif
  };
  const int iters = int((a.rows - group + kGroups - 1) / kGroups);  // the group's rows
  for (int iter = 0; iter < iters; ++iter) {
    const int64_t row = group + int64_t(iter) * kGroups;
    const V* xv = reinterpret_cast<const V*>(a.x + row * a.x_stride);
    V r[K];
    // LayerNorm's shift (the row's first element) comes through shared memory: one read per block,
    // where a read by every warp of the grid would queue on one L2 slice like the partials below.
    const bool staged = (prefetch & kStageShared) && iter > 0;  // this row's vectors and shift are already copied
    if (!staged) {
      if (!rms && tid == 0) cp_async<kShiftBytes>(shift_src, a.x + row * a.x_stride);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int i = first + k * step;
        if (i < nvec) r[k] = load_vec<true>(xv + i);
      }
    }
    cp_async_wait_all();  // the parameters (first row), the shift, the staged row (without bulk copies)
    if (!rms) __syncthreads();
    if (staged) {
#ifdef FASTNORM_BULK
      mbarrier_wait(&staged_bar, unsigned(iter - 1) & 1u);
#endif
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (first + k * step < nvec) r[k] = next[k * threads + tid];
      }
    }
    const A shift = rms ? A(0) : A(to_acc(shift_src[0]));
    // The block's part, as moments about the shift: RMSNorm the sum of squares (float); LayerNorm
    // each thread's exact (count, mean, M2) over its registers, turned into the sums of x - shift
    // and (x - shift)^2 in double, one block reduction. Invalid vectors of r are never read.
    // Partials are double-buffered by the parity of the group's rows: a block rewrites this row's
    // buffer two of its rows later, after the next barrier, which no block of the group passes
    // before all have read this one.
    RowMoments* row_parts = reinterpret_cast<RowMoments*>(ws.partials) + (2 * group + (iter & 1)) * gblocks;
    if (rms) {
      A total[1] = {A(0)};
      A vals[VEC];
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (first + k * step >= nvec) continue;
        widen(r[k].v, vals);
#pragma unroll
        for (int e = 0; e < VEC; ++e) total[0] = fma(vals[e], vals[e], total[0]);
      }
      group_sums(total, threads, sums);
      if (tid == 0) row_parts[gblock] = RowMoments{0.0, double(total[0])};
    } else {
      A vals[VEC], sum = A(0), m2 = A(0);
      int count = 0;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (first + k * step >= nvec) continue;
        widen(r[k].v, vals);
        ++count;
#pragma unroll
        for (int e = 0; e < VEC; ++e) sum += vals[e] - shift;  // about the shift: 32 x 3e37 would overflow
      }
      const A mean = shift + (count > 0 ? sum / A(count * VEC) : A(0));
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (first + k * step >= nvec) continue;
        widen(r[k].v, vals);
#pragma unroll
        for (int e = 0; e < VEC; ++e) m2 = fma(vals[e] - mean, vals[e] - mean, m2);
      }
      const double tn = double(count * VEC), d = double(mean) - double(shift);
      double moments[2] = {tn * d, double(m2) + tn * d * d};
      group_sums(moments, threads, dsums[0]);
      if (tid == 0) row_parts[gblock] = RowMoments{moments[0], moments[1]};
    }
    // The group's barrier.
    if (tid == 0) {
      __threadfence();
      atomicAdd(ws.arrivals + group * kArrivalStride, 1u);
    }
    // The next row's copies start after the arrival (a fence issued after them would wait for them),
    // once every thread has read the staged row and the shift (group_sums synchronized).
    stage_next(row);
    if (tid == 0) {
      const unsigned int target = unsigned(gblocks) * unsigned(iter + 1);
      while (load_acquire(ws.arrivals + group * kArrivalStride) < target) __nanosleep(20);
    }
    __syncthreads();
    // Thread j < gblocks loads block j's partial: a few requests per block (every warp of the grid
    // reading all partials queues on one L2 slice: 25-30 us a row), all in flight at once. The
    // moments about the shift: sum of n (mean - shift), sum of M2 + n (mean - shift)^2.
    double moments[2] = {0.0, 0.0};
    if (tid < gblocks) moments[0] = __ldcg(&row_parts[tid].sum), moments[1] = __ldcg(&row_parts[tid].sum_sq);
    group_sums(moments, threads, dsums[1]);
    const double inv_n = __drcp_rn(double(a.n));  // (a double division here spilled registers at K = 8)
    const double mean_rel = moments[0] * inv_n, mean_sq = moments[1] * inv_n;
    const Affine<A> st = affine_of(shift, A(mean_rel), A(rms ? mean_sq : corrected_variance(mean_rel, mean_sq)), a.eps, rms);
    V* yv = reinterpret_cast<V*>(a.y + row * a.n);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int i = first + k * step;
      if (i >= nvec) continue;
      A wv[VEC], bv[VEC];
      params.values(a.w, a.b, k, i, wv, bv);
      store_vec(yv + i, normalize_with(r[k], st, has_w, wv, has_b, bv));
    }
  }
}

// Workspace of the resident kernel: an arrival counter per row group (kResidentHeader bytes), then
// the partial moments of every block, double-buffered.
constexpr int64_t kResidentHeader = int64_t(kMaxResidentGroups) * kArrivalStride * 4;
static inline int64_t grid_rows_workspace(int sms) { return kResidentHeader + 2 * int64_t(sms) * int64_t(sizeof(RowMoments)); }

// Resident rows: vectors per thread (1..8; 0 when the call does not suit the kernel), parameter
// slots in shared memory, how the next row is staged (kStage*), and row groups. A next-row buffer
// takes room from the parameters; it is kept when the parameters this pushes out (re-read from L2
// every row) stay within kResidentL2Params, else the next row is prefetched into L2 (Hopper's bulk
// prefetch); with a buffer, rows of up to kResidentL2AheadBytes (counting both groups' rows) also
// have the row after next prefetched. Measured on H100 (benchmarks/NOTES.md "resident2"), the
// kernel in one group beats the streamed one from rows of 8 MB on (16x4194304 fp32: LN 307 -> 290
// us, RMS 251 -> 219; bf16 166 -> 157, 156 -> 134), and loses on 4 MB rows (fp32 64x1048576: 300
// -> 372 us): each row's statistics, block reductions and grid barrier sit on one critical path, a
// fixed cost per row that long rows amortize, and which two groups overlap (resident_groups).
struct ResidentPlan {
  int k, smem_slots, prefetch, groups;
  size_t smem;
};
constexpr int64_t kResidentL2Params = 8 << 20;
constexpr int64_t kResidentL2AheadBytes = 12 << 20;

// Vectors of x a thread holds, at most: 8 (32 registers) for 4-byte types; 2-byte types (which
// widen 8 elements a vector) and float64 spill at 8 under the 64-register cap.
constexpr int resident_max_k(int elem_bytes) { return elem_bytes == 4 ? 8 : 4; }

// Row groups of the resident kernel for a last-dim call (0: the kernel does not take it): two groups
// of half the SMs for rows of 4 MB up that fit them, in any call of 2+ rows; one group for longer
// rows of 8 MB up that fit the chip, however many (calls of as many rows as SMs went to the split
// kernel: fp32 200x4194304 LN 19 -> 74% of copy, RMS 30 -> 88; 140x3000000 34 -> 70, 47 -> 89;
// bf16 200x4194304 39.5 -> 66, 57 -> 78; H100, same process). One group for 2-byte rows of 5-8 MB
// measured mixed (bf16 16x3000000 RMS 54 -> 63.6, 64x2500000 67 -> 59.5): they stay on the split
// and streamed kernels. Two groups against what took these rows before (H100,
// benchmarks/results/h100-row-groups.txt, % of copy LN / RMS): fp32 64x1048576 split slices 62.5 /
// 74 -> 75 / 81; 160x2097152 split 39 / 55 -> 77 / 90; 16x1048576 streamed 51 / 54 -> 67 / 74;
// 32x2097152 one group 73 / 80 -> 75 / 86.5; bf16 32x2097152 split 57.5 / 67 -> 66 / 74-79. Rows of
// 2 MB (2 vectors a thread in two groups) measured slower than the split kernel (fp32 128x524288 LN
// 80 -> 57%, bf16 64x1048576 71 -> 48).
static inline int resident_groups(const NormParams& p, const Device& dev, int vec) {
  if (!dev.coop || dev.sms > kResidentThreads || vec == 1 || p.blocks_per_row > 0) return 0;
  const int64_t row_bytes = p.n * elem_size(p.dtype);
  const int64_t per_sm = int64_t(kResidentThreads) * resident_max_k(elem_size(p.dtype)) * vec;  // elements an SM holds
  if (row_bytes >= kStreamRowBytes && p.outer >= kGroupedRows && p.n <= (dev.sms / 2) * per_sm) return 2;
  return row_bytes >= kResidentRowBytes && p.n <= dev.sms * per_sm ? 1 : 0;
}

// The kernel for K vectors a thread and G groups; two groups hold rows of 4 MB up, at least 4
// vectors a thread, so only those are built.
template <typename T, typename W, int VEC, int G>
static inline const void* resident_kernel_of(int k) {
  if (k == 8) {
    if constexpr (resident_max_k(sizeof(T)) >= 8) return reinterpret_cast<const void*>(resident_row_norm_kernel<T, W, VEC, 8, G>);
    return nullptr;
  }
  if (k == 4) return reinterpret_cast<const void*>(resident_row_norm_kernel<T, W, VEC, 4, G>);
  if constexpr (G == 1) {
    if (k == 2) return reinterpret_cast<const void*>(resident_row_norm_kernel<T, W, VEC, 2, G>);
    if (k == 1) return reinterpret_cast<const void*>(resident_row_norm_kernel<T, W, VEC, 1, G>);
  }
  return nullptr;
}

template <typename T, typename W, int VEC>
static inline const void* resident_kernel(int k, int groups) {
  return groups == 2 ? resident_kernel_of<T, W, VEC, 2>(k) : resident_kernel_of<T, W, VEC, 1>(k);
}

template <typename T, typename W, int VEC>
static inline ResidentPlan resident_plan(const NormParams& p, const Device& dev) {
  const ResidentPlan none{0, 0, 0, 0, 0};
  const int groups = resident_groups(p, dev, VEC);
  if (groups == 0) return none;
  const int64_t threads = int64_t(dev.sms / groups) * kResidentThreads;
  const int k = pow2_at_least((p.n / VEC + threads - 1) / threads);
  const int64_t slot_bytes = int64_t(kResidentThreads) * int64_t(sizeof(ParamVec<W, VEC>));
  const int64_t buffer_bytes = int64_t(k) * kResidentThreads * int64_t(sizeof(Vec<T, VEC>));
  const int64_t budget = int64_t(dev.smem_optin) - (2 << 10);  // room for the kernel's static arrays
  const int64_t wanted = int64_t(k) * ((p.weight ? 1 : 0) + (p.bias ? 1 : 0));
  auto slots_within = [&](int64_t bytes) { return bytes > 0 ? std::min(wanted, bytes / slot_bytes) : int64_t(0); };
  const int64_t spilled = (wanted - slots_within(budget - buffer_bytes)) * slot_bytes * (dev.sms / groups);
  // Two groups stage two rows at once: with 8 MB rows, the next rows in L2 and no buffer (fp32
  // 32x2097152 RMS 82 -> 87%, against a buffer and the rows after them in L2).
  const bool l2_ahead = p.n * elem_size(p.dtype) * groups <= kResidentL2AheadBytes;
  const bool buffer = p.outer > groups && budget >= buffer_bytes && spilled <= kResidentL2Params && (groups == 1 || l2_ahead);
  const bool l2 = dev.major >= 9 && p.outer > groups && (!buffer || l2_ahead);
  const int prefetch = (buffer ? kStageShared : 0) | (l2 ? kStageL2 : 0);
  const int64_t slots = slots_within(buffer ? budget - buffer_bytes : budget);
  const size_t smem = size_t(slots * slot_bytes + (buffer ? buffer_bytes : 0));
  const void* kernel = resident_kernel<T, W, VEC>(k, groups);
  if (kernel == nullptr) return none;
  static bool smem_allowed[8] = {false, false, false, false, false, false, false, false};
  const int which = (k == 1 ? 0 : k == 2 ? 1 : k == 4 ? 2 : 3) + 4 * (groups - 1);
  if (!smem_allowed[which]) {
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(budget));
    smem_allowed[which] = true;
  }
  if (blocks_per_sm(kernel, kResidentThreads, smem) < 1) return none;
  return ResidentPlan{k, int(slots), prefetch, groups, smem};
}

template <typename T, typename W, int VEC>
static inline const char* launch_resident(const NormParams& p, const ResidentPlan& plan, cudaStream_t stream) {
  const Device dev = device_info();
  if (p.workspace == nullptr || p.workspace_bytes < grid_rows_workspace(dev.sms)) return "resident-rows workspace missing or too small";
  SplitWorkspace ws{static_cast<unsigned int*>(p.workspace), static_cast<unsigned char*>(p.workspace) + kResidentHeader};
  RowArgs<T, W> a = row_args<T, W>(p, kResidentThreads);
  int slots = plan.smem_slots, prefetch = plan.prefetch;
  void* args[] = {&a, &slots, &prefetch, &ws};
  const unsigned grid = unsigned(dev.sms / plan.groups * plan.groups);
  const cudaError_t err = cudaLaunchCooperativeKernel(resident_kernel<T, W, VEC>(plan.k, plan.groups), dim3(grid),
                                                      dim3(kResidentThreads), args, plan.smem, stream);
  return launch_result(err);
}

}  // namespace fastnorm
