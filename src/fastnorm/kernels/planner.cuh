// The forward planner: which CUDA kernel takes a LayerNorm / RMSNorm call over an (outer, n, inner)
// view (see norm_params.h). Read launch_rows and dispatch_layout at the bottom: they are the table.
//
//   layout              call                                              kernel (file)
//   inner > 1           up to 16 channels (e.g. the channels of NCHW)     strided_column (channel_kernels.cuh)
//                       more channels                                     strided_tile / strided_norm (same file)
//   inner == 1, rows:   LayerNorm rows of 3-8 MB, a wave of 80 KB chunks  held_rows (held_rows_kernel.cuh)
//                       4-17 MB rows the chip can hold (resident_groups)  resident_row_norm (resident_kernel.cuh)
//                       4 MB+ rows, fewer than SMs, not resident, or      stream_* (streamed_kernels.cuh)
//                       calls of up to 8 MB of 64 KB+ rows, fewer than 32,
//                       whose output launch gives half the SMs a block
//                       96-512 KB rows, enough to fill the chip           cluster_row_norm (cluster_kernel.cuh)
//                       at most 1024 vectors, fewer rows than SMs or      few_rows (few_rows_kernel.cuh)
//                       (inference) one wave of blocks
//                       scalar 2-byte rows (odd n, misaligned) of 2048    granule_rows (granule_rows_kernel.cuh,
//                       (float16 1025) to 24 KB, not latency-bound        the offset-row family)
//                       scalar rows (odd n, misaligned) of 1025-16384     strided_rows (strided_rows_kernel.cuh,
//                       in latency-bound calls, float16 in large ones,    the offset-row family)
//                       shifted float32 ones of 2048-8189 (not float64)
//                       scalar rows of 32-16377 (bfloat16 up to 32761)    offset_rows / warp_rows (offset_rows_kernel.cuh)
//                       contiguous rows of 2-16 bytes that divide 16,     packed_rows (packed_rows_kernel.cuh,
//                       x and y 16-byte aligned                           the offset-row family)
//                       scalar rows of 1-31                              thread_rows (offset_rows_kernel.cuh)
//                       longer rows than a block caches, or few of them   split_slice / split_row_norm (split_kernels.cuh)
//                       everything else (rows of up to 96 KB)             row_norm (row_kernel.cuh)
//   with a residual     last-dim rows of up to 1024 threads x 4 vectors   residual_row (residual_rows.cuh)
//                       (anything else: not fused, the caller adds first)
//
// A build may hold only some families (kernel_set.h): a rule whose family is left out is skipped, and a
// call no family of the build takes answers FASTNORM_NOT_BUILT.
//
// Each kernel file holds the kernel, the rule of when it takes a call where that rule is its own,
// its launch configuration and its launcher. Shared device code: cuda_vec.cuh (types, conversions,
// loads and stores), cuda_stats.cuh (statistics, reductions, the normalize step), cuda_rows.cuh
// (helpers of the last-dim kernels); host helpers: cuda_launch.cuh. The translation units
// forward_<dtype>.cu instantiate the kernels per input and weight dtype (built in parallel);
// forward.cu holds the entry points the binding calls.
//
// Statistics: the row kernel (rows in shared memory) makes passes over the cached row, each ending
// in a plain sum over the row's threads: a rough mean, then the corrected two-pass sums about it.
// So do the blocks of the cluster and split-slice kernels over their slices, whose (count, mean, M2)
// are then merged with Chan's parallel formula, and the channel tiles over their columns (a sum about
// channel 0, then the exact second pass about the mean). The other kernels compute exact (count, mean, M2)
// of the values each thread holds and combine them the same way, all relative to one shift (the
// row's first element), so merged means stay small; the resident kernel sums moments about that
// shift in double. Either way large offsets (x + 1000) cost no precision, and the output is
// (x - center) * rstd + offset with the mean split into center + exact rounding error (Affine).
// Rows (slices) that do not fit a cache are read twice, the second time mostly from L2.
#pragma once
#include "channel_kernels.cuh"
#include "cluster_kernel.cuh"
#include "few_rows_kernel.cuh"
#include "held_rows_kernel.cuh"
#include "kernel_set.h"
#include "resident_kernel.cuh"
#include "row_kernel.cuh"
#include "residual_rows.cuh"
#include "split_kernels.cuh"
#include "streamed_kernels.cuh"
#include "offset_rows_kernel.cuh"
#include "packed_rows_kernel.cuh"
#include "strided_rows_kernel.cuh"
#include "granule_rows_kernel.cuh"

namespace fastnorm {

// Vector width of the last-dim kernels: 16 bytes when every pointer and row start allows it.
static inline int row_vec(const NormParams& p) {
  const int vec = 16 / elem_size(p.dtype);
  const bool ok = aligned16(p.x) && aligned16(p.y) && aligned16(p.weight) && aligned16(p.bias) &&
                  p.n % vec == 0 && p.x_outer_stride % vec == 0;
  return ok ? vec : 1;
}

// Tuning overrides are hints: round to a power of two the kernels support.
static inline int threads_hint(const NormParams& p, int lo) {
  if (p.threads <= 0) return 0;
  int t = lo;
  while (t * 2 <= p.threads && t * 2 <= kMaxRowThreads) t *= 2;
  return t;
}

static inline int split_threads(const NormParams& p) {
  const int t = threads_hint(p, 32);
  return t > 0 ? t : kMaxRowThreads;
}

// Blocks per row wanted for a last-dim call (1: row kernel). Rows whose cache would not fit a block
// are split; so are the rows of a few-row call, to spread them over the whole chip.
static inline int64_t wanted_blocks_per_row(const NormParams& p, int sms) {
  if (p.blocks_per_row > 0) return p.blocks_per_row;
  const int64_t row_bytes = p.n * elem_size(p.dtype);
  const bool few_rows = p.outer < sms;
  if (row_bytes <= kRowCacheBytes && !(few_rows && row_bytes >= (64 << 10))) return 1;
  int64_t g = (row_bytes + kSliceBytes - 1) / kSliceBytes;
  if (few_rows) {
    const int64_t spread = (int64_t(sms) * 2) / p.outer, min_slice = row_bytes / (16 << 10);
    const int64_t want = spread < min_slice ? spread : min_slice;
    if (want > g) g = want;
  }
  return g;
}

// Rows too short for the resident kernel, at least this many: the split kernel instead (H100, same
// process: fp32 64x1048576 LN 60 -> 63% of copy, RMS 61 -> 75; 100x1048576 62 -> 66, 63 -> 75.5;
// bf16 32x2097152 56 -> 58.5, 58.5 -> 68). With 1-8 rows the streamed kernels, which spread a row
// over the whole chip, stay ahead (fp32 4x1800000 LN 47 against 30%).
constexpr int64_t kSplitRows = 32;

// Few rows, outside a tuning override: the streamed kernels (two or three plain launches) take rows of
// 4 MB+ that the resident kernel does not, and calls of at most kStreamL2Bytes (their second read of x
// hits L2) of rows of kStreamLeastBytes+ whose apply launch gives at least half the SMs a block. These
// took the split kernel, whose cooperative launch and zeroed counters cost 4-6 us. H100, against it
// (torch.compile in brackets): RMS fp32 1x238830 13.3 -> 10.0 us (11.4), bf16 1x366452 16.0 -> 10.6
// (10.4), bf16 11x40001 LN 18.1 -> 14.1 (13.2), RMS 15.3 -> 10.4 (13.1); fp32 16x65536 LN 15.3 -> 15.8
// (14.8) the one loss (results/h100-few-rows.txt). At 16 MB, fp32 23x126001 (11.6 MB) RMS lost 21.1 ->
// 24.8 us: its second read no longer came from L2 alone.
// FASTNORM_STREAMED (read at each call, for tests and A/B runs): 0 leaves the calls of the second kind
// to the split kernel, 1 streams every call of fewer rows than SMs.
constexpr int64_t kStreamL2Bytes = 8 << 20;
constexpr int64_t kStreamLeastBytes = 64 << 10;

static inline bool streamed_rows(const NormParams& p, int sms) {
  if (p.blocks_per_row > 0 || p.outer >= sms) return false;
  const int64_t forced = env_int("FASTNORM_STREAMED", -1);
  if (forced == 1) return true;
  const int64_t row_bytes = p.n * elem_size(p.dtype);
  if (row_bytes >= kStreamRowBytes) return !(p.outer >= kSplitRows && row_bytes < kResidentRowBytes);
  const int vec = row_vec(p);
  const int64_t apply_blocks = (stream_by_row(p, vec, sms) ? p.outer : 1) * stream_column_blocks(p, vec);
  return forced != 0 && row_bytes >= kStreamLeastBytes && p.outer < kSplitRows &&
         p.outer * row_bytes <= kStreamL2Bytes && apply_blocks >= sms / 2;
}

// Rows of at most this many vectors (256 bytes) take 2 vectors a thread in the row kernel (plan_rows).
constexpr int64_t kShortRowVectors = 16;

// How a last-dim call is run. g == 1: row kernel, else split kernel with `slots` rows in flight.
struct RowPlan {
  int tpr, threads, g, slots, grid;
  int64_t cache_vec;  // shared-memory vectors per row (row kernel) or per slice (split); 0: none
  size_t smem;
  bool more_blocks;   // row kernel: the 4-blocks-an-SM budget (kCachedRowBlocks)
};

// The plan of a call no family of the build takes: g == 0.
template <typename T, typename W, int VEC>
static inline RowPlan plan_rows(const NormParams& p) {
  using V = Vec<T, VEC>;
  const Device dev = device_info();
  const int64_t nvec = p.n / VEC;
#if defined(FASTNORM_WANT_SPLIT) || defined(FASTNORM_WANT_SPLIT_UNCACHED)
  int64_t g = wanted_blocks_per_row(p, dev.sms);
  if (g > 1 && dev.coop) {
    const int threads = split_threads(p);
    int64_t slice = (nvec + g - 1) / g;
    size_t smem = size_t(slice) * sizeof(V);
    if (int64_t(smem) > kMaxSmem) smem = 0;
    int per_sm = 0;
#ifdef FASTNORM_WANT_SPLIT
    static bool smem_allowed = false;
    if (!smem_allowed) allow_smem(split_slice_kernel<T, W, VEC>), smem_allowed = true;
    if (smem) cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_slice_kernel<T, W, VEC>, threads, smem);
#endif
    if (int64_t(per_sm) * dev.sms < g) {  // too many slices to be resident: no cache, read x twice
      smem = 0;
      per_sm = 0;
#ifdef FASTNORM_WANT_SPLIT_UNCACHED
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, split_row_norm_kernel<T, W, VEC>, threads, 0);
#endif
    }
    const int64_t resident = int64_t(per_sm) * dev.sms;
    if (resident >= 1) {
      if (g > resident) g = resident;
      int64_t slots = resident / g;
      if (slots > p.outer) slots = p.outer;
      return RowPlan{threads, threads, int(g), int(slots), int(slots * g), smem ? slice : 0, smem, false};
    }
  }
#endif
#ifdef FASTNORM_WANT_ROW
  // Vectors per thread: 4 (H100: best of 2, 4, 8 on rows of 2-32 KB, fp32 and bf16); 2 on rows of at
  // most kShortRowVectors (qk-norm's 64-128 elements: bf16 1000000x64 RMS 103 -> 90 us, 83 -> 95% of
  // copy; fp16 179484x64 LN 30.8 -> 22.2; 2-byte rows of 128 and fp32 of 64 1-4% faster, fp32 of 128
  // level); a call with fewer rows than SMs is latency-bound: one vector per thread (up to 512
  // threads), so each thread waits for one round of loads, not several.
  // A call that would give the SMs fewer than kRowFillBlocks blocks each is latency-bound too: it
  // takes half the vectors a thread (more threads a row, fewer rows a block) until it gives them that
  // many or a thread has one (FASTNORM_ROW_FILL=0 keeps 4, for measurements). H100: 3-18% faster on 16
  // of 18 calls of 200-1071 rows (fp32 246x1024 LN 6.62 -> 5.95 us), 2% slower on bf16 1071x768
  // (results/h100-row-fill.txt).
  // Scalar rows (VEC 1) take about 16 elements a thread in LayerNorm, 8 in RMSNorm (the power of two of
  // threads nearest n / that; FASTNORM_ROW_SCALAR_ELEMS, read at each call, for A/B runs). At 4 (rounded
  // up), rows of 1025-4096 fp32 took 256-512 threads of 2-8 elements, a block reduction over 8-16 warps
  // for each. H100, shifted fp32 rows, us at 4 / 8 / 16 (rounded up): LN 16654x1029 134 / 85 / 64,
  // 30000x2001 292 / 206 / 187, 28532x3938 386 / 386 / 349; RMS 16654x1029 100 / 64 / 53, 30000x2001
  // 224 / 172 / 187, 28532x3938 325 / 325 / 338 (results/h100-scalar-rows.txt).
  int64_t per_thread = p.outer < dev.sms ? 1 : nvec <= kShortRowVectors ? 2 : 4;
  const bool scalar_rows = VEC == 1 && p.outer >= dev.sms;
  if (scalar_rows) per_thread = std::max<int64_t>(env_int("FASTNORM_ROW_SCALAR_ELEMS", p.rms ? 8 : 16), 1);
  int tpr = 0, threads = 0;
  int64_t rows_per_block = 0;
  const bool fill = p.threads <= 0 && env_int("FASTNORM_ROW_FILL", 1) != 0;
  for (;; per_thread /= 2) {
    tpr = p.threads > 0 ? threads_hint(p, 1) : pow2_at_least((nvec + per_thread - 1) / per_thread);
    if (scalar_rows && p.threads <= 0 && tpr > 1 && nvec * 4 < int64_t(tpr) * per_thread * 3) tpr /= 2;  // nearest
    if (tpr > kMaxRowThreads) tpr = kMaxRowThreads;
    threads = tpr >= 256 ? tpr : 256;
    rows_per_block = threads / tpr;
    if (!fill || per_thread == 1 || (p.outer + rows_per_block - 1) / rows_per_block >= kRowFillBlocks * dev.sms) break;
  }
  // Scalar rows cache the 16-byte granules that hold them (cache_row_granules): up to 30 bytes more,
  // each row's cache 16-byte aligned.
  constexpr int64_t kGranule = 16 / int64_t(sizeof(V));
  const int64_t row_cache = VEC == 1 ? (nvec + 3 * kGranule - 1) / kGranule * kGranule : nvec;
  const int64_t cache_bytes = rows_per_block * row_cache * int64_t(sizeof(V));
  const int64_t cache_vec = cache_bytes <= kRowCacheBytes ? row_cache : 0;
  const bool whole_block_row = threads == kMaxRowThreads && tpr == threads && nvec == per_thread * tpr;
  const bool more_blocks = kCachedRowHasMore<T, W> && !whole_block_row;
  const int64_t blocks = (p.outer + rows_per_block - 1) / rows_per_block;
  // Blocks beyond what is resident queue up, but smaller blocks leave a shorter tail: a cap of 32
  // blocks per SM (two row batches per block at 65536x1024) measured 1-2 points slower than 256.
  const int64_t cap = int64_t(dev.sms) * 256;
  return RowPlan{tpr, threads, 1, 0, int(blocks < cap ? blocks : cap), cache_vec,
                 size_t(cache_vec ? cache_bytes : 0), more_blocks};
#else
  return RowPlan{};
#endif
}

// Training: the calls whose forward saves each row's affine map for the backward (NormParams::stats):
// those that the row, offset-row or thread-row kernel takes for sure, aligned or not. Rows of at most
// 64 KB (no cluster, resident or streamed kernel), at least as many as SMs (no few-rows kernel), no
// tuning override. The binding asks before the forward, and again before the backward, whose tensors
// may sit at other addresses (a view, a copy under torch.compile): so the answer depends on the
// call's shape and device only, never on alignment.
constexpr int64_t kSavedStatsRowBytes = 64 << 10;

static inline bool row_stats_saved(const NormParams& p) {
#ifdef FASTNORM_WANT_ROW
  return p.inner == 1 && p.residual == nullptr && p.threads <= 0 && p.blocks_per_row <= 0 &&
         p.n * elem_size(p.dtype) <= kSavedStatsRowBytes && p.outer >= device_info().sms;
#else
  return false;
#endif
}

// What a forward asked to save statistics answers when its kernel would not save them.
#define FASTNORM_STATS_NOT_SAVED "statistics asked of a call the row kernel does not take (fastnorm_cuda_saves_stats)"

#ifdef FASTNORM_WANT_ROW
// One cached row kernel: its shared memory opt-in (over 48 KB) asked at its first launch, then the launch.
template <auto Kernel, typename Args>
static inline void launch_cached_instance(const RowPlan& plan, const Args& a, int grid_store, cudaStream_t stream) {
  static const bool allowed = (allow_smem(Kernel), true);
  (void)allowed;
  Kernel<<<plan.grid, plan.threads, plan.smem, stream>>>(a, plan.cache_vec, grid_store);
}

// The cached row kernel of a plan: the 4-blocks budget or not (kMore); a bound of 2 or 4 on a thread's
// vectors or none (kK, `bound`); exactly 4 (kExact, `exact`).
template <typename T, typename W, int VEC>
static inline void launch_cached_rows(bool more, int bound, bool exact, const RowPlan& plan, const RowArgs<T, W>& a,
                                      int grid_store, cudaStream_t stream) {
  constexpr bool kHasMore = kCachedRowHasMore<T, W>;
  const bool m = more && kHasMore;
  if constexpr (VEC > 1) {
    if (exact && m) {
      launch_cached_instance<row_norm_kernel<T, W, VEC, true, kHasMore, 4, true>>(plan, a, 0, stream);
    } else if (exact) {
      launch_cached_instance<row_norm_kernel<T, W, VEC, true, false, 4, true>>(plan, a, 0, stream);
    } else if (bound == 4 && m) {
      launch_cached_instance<row_norm_kernel<T, W, VEC, true, kHasMore, 4>>(plan, a, 0, stream);
    } else if (bound == 4) {
      launch_cached_instance<row_norm_kernel<T, W, VEC, true, false, 4>>(plan, a, 0, stream);
    } else if (bound == 2 && m) {
      launch_cached_instance<row_norm_kernel<T, W, VEC, true, kHasMore, 2>>(plan, a, 0, stream);
    } else if (bound == 2) {
      launch_cached_instance<row_norm_kernel<T, W, VEC, true, false, 2>>(plan, a, 0, stream);
    }
    if (bound) return;
  }
  if (m) {
    launch_cached_instance<row_norm_kernel<T, W, VEC, true, kHasMore>>(plan, a, grid_store, stream);
  } else {
    launch_cached_instance<row_norm_kernel<T, W, VEC, true>>(plan, a, grid_store, stream);
  }
}
#endif

template <typename T, typename W, int VEC>
static inline const char* launch_rows(const NormParams& p, cudaStream_t stream) {
  [[maybe_unused]] const Device dev = device_info();  // unread in a build without the families whose rules read it
#ifdef FASTNORM_WANT_HELD_ROWS
  if constexpr (VEC > 1 && sizeof(T) < 8) {
    const int64_t held_chunks = held_rows_chunks(p, dev, VEC);
    if (held_chunks > 0) return p.stats ? FASTNORM_STATS_NOT_SAVED : launch_held_rows<T, W, VEC>(p, held_chunks, stream);
  }
#endif
#ifdef FASTNORM_WANT_RESIDENT
  if constexpr (VEC > 1) {
    const ResidentPlan resident = resident_plan<T, W, VEC>(p, dev);
    if (resident.k > 0) return p.stats ? FASTNORM_STATS_NOT_SAVED : launch_resident<T, W, VEC>(p, resident, stream);
  }
#endif
#ifdef FASTNORM_WANT_STREAMED
  if (streamed_rows(p, dev.sms)) return p.stats ? FASTNORM_STATS_NOT_SAVED : launch_streamed<T, W, VEC>(p, dev.sms, stream);
#endif
#ifdef FASTNORM_WANT_CLUSTER
  const int g = cluster_plan(p, dev, VEC);
  if (g > 0) return p.stats ? FASTNORM_STATS_NOT_SAVED : launch_cluster<T, W, VEC>(p, g, stream);
#endif
#ifdef FASTNORM_WANT_FEW_ROWS
  if (few_rows_take(p, VEC, dev.sms)) {
    return p.stats ? FASTNORM_STATS_NOT_SAVED : launch_few_rows<T, W, VEC>(p, stream);
  }
#endif
#ifdef FASTNORM_WANT_OFFSET_ROWS
  if (packed_rows_take(p)) return launch_packed_rows<T, W>(p, stream);
  if constexpr (sizeof(T) < 8) {
    const GranulePlan granule = granule_rows_plan(p, VEC);
    if (granule.k > 0) return launch_granule_rows<T, W>(p, granule, stream);
    const StridedPlan strided = strided_rows_plan(p, VEC);
    if (strided.k > 0) return launch_strided_rows<T, W>(p, strided, stream);
  }
  if (offset_rows_take(p, VEC)) return offset_rows_chunked(p) ? launch_offset_rows<T, W>(p, stream) : launch_warp_rows<T, W>(p, stream);
  if (thread_rows_take(p, VEC)) return launch_thread_rows<T, W>(p, stream);
#endif
#if defined(FASTNORM_WANT_ROW) || defined(FASTNORM_WANT_SPLIT) || defined(FASTNORM_WANT_SPLIT_UNCACHED)
  const RowPlan plan = plan_rows<T, W, VEC>(p);
  if (plan.g == 0) return FASTNORM_NOT_BUILT;
  if (p.stats && plan.g != 1) return FASTNORM_STATS_NOT_SAVED;
  RowArgs<T, W> a = row_args<T, W>(p, plan.tpr);
  if (plan.grid == 0) return nullptr;
  if (plan.g == 1) {
#ifdef FASTNORM_WANT_ROW
    // Scalar 2-byte rows store in y's 16-byte grid (store_granule_row), with the 40-register kernel (3
    // blocks of 512 an SM, not 4: at 32 registers it spilled). H100, against the element store: fp16
    // 15209x35356 LN 1295 -> 964 us, RMS 1005 -> 790, bf16 1024x40001 RMS 98.6 -> 75.8; shifted fp32 rows
    // were level or up to 17% slower (realigning x and the parameters costs more than 4 elements a store
    // save), so 4- and 8-byte rows keep the element store. FASTNORM_ROW_GRID_STORE=0 / 1 (read at each
    // call, for A/B runs) turns it off / on for every type.
    const int grid_store = VEC == 1 && env_int("FASTNORM_ROW_GRID_STORE", sizeof(T) == 2) != 0;
    if (plan.cache_vec) {
      // Vector rows that give each thread at most 2 or 4 vectors take the kernel with that bound built in,
      // rows of exactly 4 the kernel with that count (row_norm_kernel's kK, kExact). FASTNORM_ROW_COUNT_BOUND=0
      // leaves them to the general kernel, FASTNORM_ROW_EXACT=0 the rows of exactly 4 to the bound (both read
      // at each call, for A/B runs).
      int bound = 0;
      bool exact = false;
      if constexpr (VEC > 1) {
        const int64_t per = (p.n / VEC + plan.tpr - 1) / plan.tpr;
        if (per <= 4 && env_int("FASTNORM_ROW_COUNT_BOUND", 1) != 0) bound = per <= 2 ? 2 : 4;
        exact = bound == 4 && 4 * plan.tpr * VEC == p.n && env_int("FASTNORM_ROW_EXACT", 1) != 0;  // per == 4
      }
      launch_cached_rows<T, W, VEC>(plan.more_blocks && !grid_store, bound, exact, plan, a, grid_store, stream);
    } else {
      row_norm_kernel<T, W, VEC, false><<<plan.grid, plan.threads, 0, stream>>>(a, 0, 0);
    }
#endif
  } else {
#if defined(FASTNORM_WANT_SPLIT) || defined(FASTNORM_WANT_SPLIT_UNCACHED)
    using A = typename AccOf<T>::type;
    const int64_t need = int64_t(plan.slots) * 16 + int64_t(2) * plan.slots * plan.g * sizeof(Stats<A>);
    if (p.workspace == nullptr || p.workspace_bytes < need) return "split-row workspace missing or too small";
    SplitWorkspace ws{static_cast<unsigned int*>(p.workspace),
                      static_cast<unsigned char*>(p.workspace) + int64_t(plan.slots) * 16};
    int g = plan.g, slots = plan.slots;
    void* args[] = {&a, &g, &slots, &ws};
    const void* kernel = nullptr;  // the plan only names a kernel of this build
#ifdef FASTNORM_WANT_SPLIT
    if (plan.cache_vec) kernel = reinterpret_cast<const void*>(split_slice_kernel<T, W, VEC>);
#endif
#ifdef FASTNORM_WANT_SPLIT_UNCACHED
    if (!plan.cache_vec) kernel = reinterpret_cast<const void*>(split_row_norm_kernel<T, W, VEC>);
#endif
    cudaError_t err = cudaLaunchCooperativeKernel(kernel, dim3(plan.grid), dim3(plan.threads), args, plan.smem, stream);
    if (err != cudaSuccess) return launch_result(err);
#endif
  }
  const cudaError_t err = cudaGetLastError();
  return launch_result(err);
#else
  return FASTNORM_NOT_BUILT;
#endif
}

#ifdef FASTNORM_WANT_RESIDUAL
// Fused residual add: h of x's dtype or float32.
template <typename T, typename W, int VEC>
static inline const char* dispatch_residual(const NormParams& p, cudaStream_t stream) {
  if (p.hdtype == p.dtype) return launch_residual<T, T, W, VEC>(p, stream);
  if constexpr (!std::is_same<T, float>::value && !std::is_same<T, double>::value) {
    if (p.hdtype == FN_F32) return launch_residual<T, float, W, VEC>(p, stream);
  }
  return FASTNORM_RESIDUAL_NOT_FUSED;
}
#endif

template <typename T, typename W>
static inline const char* dispatch_layout(const NormParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(T);
  if (p.stats && !row_stats_saved(p)) return FASTNORM_STATS_NOT_SAVED;
#ifdef FASTNORM_WANT_RESIDUAL
  if (p.residual) return row_vec(p) > 1 ? dispatch_residual<T, W, kVec>(p, stream) : dispatch_residual<T, W, 1>(p, stream);
#else
  if (p.residual) return FASTNORM_RESIDUAL_NOT_FUSED;  // the caller adds first
#endif
  if (p.inner == 1) return row_vec(p) > 1 ? launch_rows<T, W, kVec>(p, stream) : launch_rows<T, W, 1>(p, stream);
#ifdef FASTNORM_WANT_CHANNEL
  return launch_channels<T, W>(p, stream);
#else
  return FASTNORM_NOT_BUILT;
#endif
}

}  // namespace fastnorm

// One translation unit per (input, parameter) dtype pair defines its entry with this (forward_*.cu),
// so that ninja compiles the pairs in parallel.
#define FASTNORM_FORWARD_INSTANCE(name, T, W)                                      \
  const char* fastnorm::name(const NormParams& p, cudaStream_t stream) {           \
    return dispatch_layout<T, W>(p, stream);                                       \
  }
