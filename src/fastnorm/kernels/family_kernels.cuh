// CUDA kernels of the normalization family (family_params.h): statistics of sets of contiguous runs
// (partial statistics per piece of a set, merged per set in double), per-row coefficients with the
// affine parameters folded in, and the elementwise output y = (x - center) * scale + offset.
//
// Two reads of x and one write: the floor for BatchNorm and whole-tensor norms larger than the chip,
// 2/3 of it for sets that would fit on chip (GroupNorm, rows), where fusing the statistics into the
// output pass (as the LayerNorm kernels do) is future work.
#pragma once
#include "cuda_launch.cuh"
#include "cuda_stats.cuh"
#include "family_params.h"
#include "kernel_set.h"

namespace fastnorm {
namespace family {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;

// Partial statistics of one piece: n values whose mean is shift + mean and whose squared deviations
// from it sum to m2 (the p-norms: m2 holds the sum of |x| or x^2).
template <typename A>
struct Partial {
  A n, shift, mean, m2;
};

// How the sets are cut into pieces (one block each): a long run into chunks of `chunk` elements,
// runs of at most chunk / 2 grouped, up to `chunk` elements a piece. Pieces of a set merge in order.
struct Plan {
  int64_t chunk = 0, per_run = 0, runs_per_piece = 1, per_set = 0, partials = 0;
};

static inline Plan plan_of(const FamilyParams& p) {
  Plan pl;
  const int64_t target = int64_t(device_info().sms) * 8;  // pieces enough to fill the machine
  int64_t chunk = p.numel / (target > 0 ? target : 1);
  chunk = chunk < 4096 ? 4096 : chunk > 65536 ? 65536 : chunk;
  pl.chunk = (chunk + 1023) / 1024 * 1024;
  if (2 * p.run_len > pl.chunk) {  // pieces of one run each (a run up to `chunk` long is one piece)
    pl.per_run = (p.run_len + pl.chunk - 1) / pl.chunk;
    pl.per_set = p.runs * pl.per_run;
  } else {
    pl.runs_per_piece = pl.chunk / p.run_len > 1 ? pl.chunk / p.run_len : 1;
    pl.per_set = (p.runs + pl.runs_per_piece - 1) / pl.runs_per_piece;
  }
  pl.partials = p.stats * pl.per_set;
  return pl;
}

// Workspace: partials, then per-set mean / variance (or norm) in double, then the coefficients.
template <typename A>
struct Workspace {
  Partial<A>* partials;
  double* set_mean;
  double* set_var;
  A* coeffs;  // (center, scale, offset) per coefficient
};

template <typename A>
static inline int64_t workspace_bytes(const FamilyParams& p, const Plan& pl) {
  return align16(pl.partials * int64_t(sizeof(Partial<A>))) + 2 * align16(p.stats * 8) +
         align16(p.coeffs * 3 * int64_t(sizeof(A)));
}

template <typename A>
static inline Workspace<A> workspace_of(const FamilyParams& p, const Plan& pl) {
  char* base = static_cast<char*>(p.workspace);
  Workspace<A> ws;
  ws.partials = reinterpret_cast<Partial<A>*>(base);
  base += align16(pl.partials * int64_t(sizeof(Partial<A>)));
  ws.set_mean = reinterpret_cast<double*>(base);
  base += align16(p.stats * 8);
  ws.set_var = reinterpret_cast<double*>(base);
  base += align16(p.stats * 8);
  ws.coeffs = reinterpret_cast<A*>(base);
  return ws;
}

// Elements of a range starting at p before a 16-byte boundary (at most len): its scalar head, the
// rest loads as vectors. Rows of odd length (65535) start misaligned three times in four.
template <typename T>
__device__ __forceinline__ int64_t head_elements(const T* p, int64_t len) {
  const int64_t misaligned = int64_t(reinterpret_cast<uintptr_t>(p) & 15);
  const int64_t head = misaligned == 0 ? 0 : (16 - misaligned) / int64_t(sizeof(T));
  return head < len ? head : len;
}

// One thread's sums: deviations from the piece's first value (mean / variance), or |x| / x^2.
template <typename A, int kStat>
struct ThreadSums {
  A n = A(0), lin = A(0), sq = A(0);
  __device__ __forceinline__ void add(A v, A shift) {
    n += A(1);
    if (kStat == FN_STAT_MEAN_VAR) {
      const A d = v - shift;
      lin += d;
      sq = fma(d, d, sq);
    }
#ifdef FASTNORM_WANT_P_NORM
    else if (kStat == FN_STAT_ABS_SUM) {
      sq += fabs(v);
    } else {
      sq = fma(v, v, sq);
    }
#endif
  }
  __device__ __forceinline__ Stats<A> stats() const {
    if (kStat != FN_STAT_MEAN_VAR || n == A(0)) return {n, A(0), sq};
    const A mean = lin / n;
    return {n, mean, sq - lin * mean};
  }
};

// A vector's values into sums about `shift`: s[0] += x - shift, s[1] += (x - shift)^2 (the set and chained
// kernels' statistics, exact enough at x + 1000 with the set's first value as the shift).
template <typename A, int V>
__device__ __forceinline__ void add_shifted(A (&s)[2], const A (&a)[V], A shift) {
#pragma unroll
  for (int e = 0; e < V; ++e) {
    const A d = a[e] - shift;
    s[0] += d;
    s[1] = fma(d, d, s[1]);
  }
}

// Vectors a thread of the statistics pass loads before it uses the first (strided_batches).
constexpr int kStatsBatch = 8;

// Partial statistics of every piece: block b is piece b % per_set of set b / per_set.
template <typename T, int kStat>
__global__ void __launch_bounds__(kThreads) piece_stats_kernel(FamilyParams p, Plan pl,
                                                               Partial<typename AccOf<T>::type>* out) {
  using A = typename AccOf<T>::type;
  constexpr int V = 16 / sizeof(T);
  __shared__ Stats<A> smem[32];
  const int64_t set = blockIdx.x / pl.per_set, q = blockIdx.x % pl.per_set;
  const T* base = static_cast<const T*>(p.x) + set * p.set_stride;
  ThreadSums<A, kStat> t;
  A shift;
  if (pl.per_run > 0) {  // part of one run
    const int64_t j = q / pl.per_run, lo = (q % pl.per_run) * pl.chunk;
    const int64_t len = min(pl.chunk, p.run_len - lo);
    const T* src = base + j * p.run_stride + lo;
    shift = to_acc(src[0]);
    const int64_t head = head_elements(src, len), vecs = (len - head) / V;
    for (int64_t i = threadIdx.x; i < head; i += kThreads) t.add(to_acc(src[i]), shift);
    const Vec<T, V>* vsrc = reinterpret_cast<const Vec<T, V>*>(src + head);
    strided_batches<kStatsBatch>(
        int64_t(threadIdx.x), int64_t(kThreads), vecs,
        [&](int64_t i) { return load_vec<false>(vsrc + i); },  // kept in L2 for the output pass
        [&](int64_t, const Vec<T, V>& v) {
          A a[V];
          widen(v.v, a);
#pragma unroll
          for (int e = 0; e < V; ++e) t.add(a[e], shift);
        });
    for (int64_t i = head + vecs * V + threadIdx.x; i < len; i += kThreads) t.add(to_acc(src[i]), shift);
  } else {  // whole short runs [j0, j1): element e of the piece is run j0 + e / run_len
    const int64_t j0 = q * pl.runs_per_piece;
    const int64_t j1 = min(p.runs, j0 + pl.runs_per_piece);
    const uint32_t run_len = uint32_t(p.run_len), total = uint32_t((j1 - j0) * p.run_len);
    shift = to_acc(base[j0 * p.run_stride]);
    for (uint32_t e = threadIdx.x; e < total; e += kThreads) {
      const uint32_t j = e / run_len;
      t.add(to_acc(base[(j0 + j) * p.run_stride + (e - j * run_len)]), shift);
    }
  }
  if (kStat != FN_STAT_MEAN_VAR) shift = A(0);
  const Stats<A> s = group_reduce(t.stats(), kThreads, kStat != FN_STAT_MEAN_VAR, smem);
  if (threadIdx.x == 0) out[blockIdx.x] = Partial<A>{s.n, shift, s.mean, s.m2};
}

struct Moments {
  double n, mean, m2;
};

__device__ __forceinline__ Moments merge_moments(const Moments& a, const Moments& b) {
  if (b.n == 0.0) return a;
  if (a.n == 0.0) return b;
  const double n = a.n + b.n, d = b.mean - a.mean, wb = b.n / n;
  return {n, a.mean + d * wb, a.m2 + b.m2 + d * d * a.n * wb};
}

__device__ __forceinline__ Moments warp_merge(Moments m, bool mean_var) {
  for (int off = 16; off > 0; off >>= 1) {
    const Moments b{__shfl_xor_sync(0xffffffffu, m.n, off), __shfl_xor_sync(0xffffffffu, m.mean, off),
                    __shfl_xor_sync(0xffffffffu, m.m2, off)};
    m = mean_var ? merge_moments(m, b) : Moments{m.n + b.n, 0.0, m.m2 + b.m2};
  }
  return m;
}

// Sets with at least this many partials take a block each in merge_stats_kernel, fewer a warp: the
// Frobenius norm's one set of 29K partials took a warp 80 us (H100), as long as 1% of the whole call;
// BatchNorm 64x64x512x512's 64 sets of 256 partials 7 us a warp each, 3.2 us a block.
constexpr int64_t kBlockMergePartials = 128;

// A set's partials merged in double (a fixed order: results repeat bit for bit) by a warp, or by a
// block (kBlockPerSet); the set's statistics written for the coefficients (double) and for the caller
// (accumulator dtype).
template <typename A, int kStat, bool kBlockPerSet>
__global__ void __launch_bounds__(kThreads) merge_stats_kernel(FamilyParams p, Plan pl, Workspace<A> ws) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t set = kBlockPerSet ? int64_t(blockIdx.x) : int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (set >= p.stats) return;  // a whole warp (one set a block: never)
  const bool mean_var = kStat == FN_STAT_MEAN_VAR;
  Moments m{0.0, 0.0, 0.0};
  for (int64_t q = kBlockPerSet ? threadIdx.x : lane; q < pl.per_set; q += kBlockPerSet ? kThreads : 32) {
    const Partial<A> part = ws.partials[set * pl.per_set + q];
    const Moments b{double(part.n), double(part.shift) + double(part.mean), double(part.m2)};
    m = mean_var ? merge_moments(m, b) : Moments{m.n + b.n, 0.0, m.m2 + b.m2};
  }
  m = warp_merge(m, mean_var);
  if (kBlockPerSet) {
    __shared__ Moments warps[kWarpsPerBlock];
    if (lane == 0) warps[warp] = m;
    __syncthreads();
    if (warp != 0) return;
    m = warp_merge(lane < kWarpsPerBlock ? warps[lane] : Moments{0.0, 0.0, 0.0}, mean_var);
  }
  if (lane != 0) return;
  if (mean_var) {
    const double var = m.m2 / m.n;
    ws.set_mean[set] = m.mean;
    ws.set_var[set] = var < 0.0 ? 0.0 : var;  // NaN stays NaN
    static_cast<A*>(p.mean)[set] = A(m.mean);
    static_cast<A*>(p.var)[set] = A(ws.set_var[set]);
  }
#ifdef FASTNORM_WANT_P_NORM
  else {
    const double s = p.p_mean ? m.m2 / m.n : m.m2;
    ws.set_mean[set] = kStat == FN_STAT_SQUARE_SUM ? sqrt(s) : s;
    static_cast<A*>(p.mean)[set] = A(ws.set_mean[set]);
  }
#endif
}

__device__ __forceinline__ double param_at(const void* t, int dtype, int64_t i) {
  switch (dtype) {
    case FN_F32: return static_cast<const float*>(t)[i];
    case FN_F64: return static_cast<const double*>(t)[i];
    case FN_F16: return __half2float(static_cast<const __half*>(t)[i]);
    default: return __bfloat162float(static_cast<const __nv_bfloat16*>(t)[i]);
  }
}

// (center, scale, offset) of every coefficient: the mean's rounding error goes into the offset, so
// x - center stays exact near the mean (x + 1000) as in the LayerNorm kernels.
template <typename A, int kStat>
__global__ void __launch_bounds__(kThreads) coefficients_kernel(FamilyParams p, Workspace<A> ws) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= p.coeffs) return;
  const int64_t ch = c % p.channels, set = (c / p.channels) * p.groups + ch / (p.channels / p.groups);
  A* out = ws.coeffs + 3 * c;
#ifdef FASTNORM_WANT_P_NORM
  if (kStat != FN_STAT_MEAN_VAR) {
    const double norm = ws.set_mean[set];
    out[0] = A(0);
    out[1] = A(1.0 / (norm < p.eps ? p.eps : norm));  // NaN norms give NaN
    out[2] = A(0);
    return;
  }
#endif
  const double mean = p.given_stats ? double(static_cast<const A*>(p.mean)[set]) : ws.set_mean[set];
  const double var = p.given_stats ? double(static_cast<const A*>(p.var)[set]) : ws.set_var[set];
  const double w = p.weight ? param_at(p.weight, p.wdtype, ch) : 1.0;
  const double b = p.bias ? param_at(p.bias, p.wdtype, ch) : 0.0;
  const double scale = w / sqrt(var + p.eps);
  const A center = A(mean);
  out[0] = center;
  out[1] = A(scale);
  out[2] = A(b - (mean - double(center)) * scale);
}

// The output epilogue: z as is, or silu(z) = z / (1 + exp(-z)) (exp to inf for z < -88 in float: z / inf
// = -0, the limit; NaN stays NaN). A compile-time flag: the plain kernels keep their code and registers.
template <int kAct>
__device__ __forceinline__ float activate(float z) {
  return kAct == FN_ACT_SILU ? z / (1.0f + expf(-z)) : z;
}

template <int kAct>
__device__ __forceinline__ double activate(double z) {
  return kAct == FN_ACT_SILU ? z / (1.0 + exp(-z)) : z;
}

template <int kAct, typename T, typename A>
__device__ __forceinline__ T apply_one(T x, A center, A scale, A offset) {
  return from_acc<T>(activate<kAct>(fma(to_acc(x) - center, scale, offset)));
}

// y = act((x - center) * scale + offset) over rows of at least kLongRow elements: block b is piece
// b % per_row of row b / per_row, the blocks taking the pieces last to first (the first find in L2 the
// end of x, which the statistics pass read last). Plain loads and stores, a thread's kApplyVectors
// loaded before its first store, at most 40 registers (6 blocks an SM; 4 for double, whose SiLU would
// spill). H100, KernelBench's fp32 shapes, against evict-first hints and a load at a time: BatchNorm
// 64x64x512x512 4.304 -> 4.248 ms, GroupNorm 112x64x512x512 7.521 -> 7.404 (torch.compile 4.229, 7.462;
// benchmarks/NOTES.md, session 25). 8 blocks an SM (32 registers) measured slower.
constexpr int64_t kLongRow = 2048;
constexpr int kApplyVectors = 4;

template <typename T, int kAct>
__global__ void __launch_bounds__(kThreads, sizeof(T) == 8 ? 4 : 6)
    apply_rows_kernel(FamilyParams p, const typename AccOf<T>::type* coeffs, int64_t per_row, int64_t piece) {
  using A = typename AccOf<T>::type;
  constexpr int V = 16 / sizeof(T);
  const int64_t b = int64_t(gridDim.x) - 1 - blockIdx.x;
  const int64_t r = b / per_row, lo = (b % per_row) * piece;
  const int64_t len = min(piece, p.row_len - lo);
  const A* k = coeffs + 3 * (r % p.coeffs);
  const A center = k[0], scale = k[1], offset = k[2];
  const T* x = static_cast<const T*>(p.x) + r * p.row_len + lo;
  T* y = static_cast<T*>(p.y) + r * p.row_len + lo;
  // Vectors where x and y sit at the same offset from a 16-byte boundary (a scalar head first).
  const bool together = ((reinterpret_cast<uintptr_t>(x) ^ reinterpret_cast<uintptr_t>(y)) & 15) == 0;
  const int64_t head = together ? head_elements(x, len) : len, vecs = (len - head) / V;
  for (int64_t i = threadIdx.x; i < head; i += kThreads) y[i] = apply_one<kAct>(x[i], center, scale, offset);
  const Vec<T, V>* vx = reinterpret_cast<const Vec<T, V>*>(x + head);
  Vec<T, V>* vy = reinterpret_cast<Vec<T, V>*>(y + head);
  strided_batches<kApplyVectors>(
      int64_t(threadIdx.x), int64_t(kThreads), vecs, [&](int64_t i) { return load_vec<false>(vx + i); },
      [&](int64_t i, const Vec<T, V>& v) {
        A a[V];
        widen(v.v, a);
#pragma unroll
        for (int e = 0; e < V; ++e) a[e] = activate<kAct>(fma(a[e] - center, scale, offset));
        store_vec<false>(vy + i, pack<T>(a));
      });
  for (int64_t i = head + vecs * V + threadIdx.x; i < len; i += kThreads) y[i] = apply_one<kAct>(x[i], center, scale, offset);
}

// The same for short rows, one element at a time over the whole tensor.
template <typename T, int kAct>
__global__ void __launch_bounds__(kThreads) apply_elements_kernel(FamilyParams p, const typename AccOf<T>::type* coeffs) {
  using A = typename AccOf<T>::type;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  for (int64_t e = int64_t(blockIdx.x) * kThreads + threadIdx.x; e < p.numel; e += int64_t(gridDim.x) * kThreads) {
    const A* k = coeffs + 3 * ((e / p.row_len) % p.coeffs);
    y[e] = apply_one<kAct>(x[e], k[0], k[1], k[2]);
  }
}

// The output pass, the activation (FamilyActivation) fused in as its epilogue.
template <typename T, int kAct>
static void launch_apply(const FamilyParams& p, const typename AccOf<T>::type* coeffs, cudaStream_t stream) {
  if (p.row_len >= kLongRow) {
    const int64_t piece = int64_t(kThreads) * (16 / sizeof(T)) * kApplyVectors;
    const int64_t per_row = (p.row_len + piece - 1) / piece;
    const unsigned blocks = unsigned(p.numel / p.row_len * per_row);
    apply_rows_kernel<T, kAct><<<blocks, kThreads, 0, stream>>>(p, coeffs, per_row, piece);
  } else {
    const int64_t blocks = (p.numel + kThreads * 4 - 1) / (kThreads * 4);
    const int64_t cap = int64_t(device_info().sms) * 32;
    apply_elements_kernel<T, kAct><<<unsigned(blocks < cap ? blocks : cap), kThreads, 0, stream>>>(p, coeffs);
  }
}

template <typename T, int kStat>
static const char* run_passes(const FamilyParams& p, cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  const Plan pl = plan_of(p);
  if (p.workspace_bytes < workspace_bytes<A>(p, pl)) return "family workspace too small";
  const Workspace<A> ws = workspace_of<A>(p, pl);
  if (!p.given_stats) {
    piece_stats_kernel<T, kStat><<<unsigned(pl.partials), kThreads, 0, stream>>>(p, pl, ws.partials);
    if (pl.per_set >= kBlockMergePartials) {
      merge_stats_kernel<A, kStat, true><<<unsigned(p.stats), kThreads, 0, stream>>>(p, pl, ws);
    } else {
      merge_stats_kernel<A, kStat, false><<<unsigned((p.stats + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads, 0,
                                            stream>>>(p, pl, ws);
    }
  }
  coefficients_kernel<A, kStat><<<unsigned((p.coeffs + kThreads - 1) / kThreads), kThreads, 0, stream>>>(p, ws);
  if (p.activation == FN_ACT_SILU) {
    launch_apply<T, FN_ACT_SILU>(p, ws.coeffs, stream);
  } else {
    launch_apply<T, FN_ACT_NONE>(p, ws.coeffs, stream);
  }
  return launch_result(cudaGetLastError());
}

template <typename T>
static const char* run_passes_stat(const FamilyParams& p, cudaStream_t stream) {
  switch (p.stat) {
    case FN_STAT_MEAN_VAR: return run_passes<T, FN_STAT_MEAN_VAR>(p, stream);
#ifdef FASTNORM_WANT_P_NORM
    case FN_STAT_ABS_SUM: return run_passes<T, FN_STAT_ABS_SUM>(p, stream);
    case FN_STAT_SQUARE_SUM: return run_passes<T, FN_STAT_SQUARE_SUM>(p, stream);
#endif
    default: return FASTNORM_NOT_BUILT;
  }
}

}  // namespace family
}  // namespace fastnorm
