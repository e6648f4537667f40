// GroupNorm / InstanceNorm and BatchNorm with one block per set of statistics: a set is `runs` runs of
// `spatial` elements, run_stride apart (GroupNorm: a (sample, group), its channels' planes back to back;
// BatchNorm: a channel, its plane in every sample). The set's statistics are the block's own, so the
// forward is one kernel (statistics, then the output pass re-reading x from L2) and the backward one
// kernel (the two sums, the set's coefficients, then dx re-reading x and dy from L2; GroupNorm adds a
// small kernel for dweight / dbias, BatchNorm writes them itself). The multi-kernel paths read x once
// more from DRAM and launch 3-4 kernels more. Taken while a wave of sets fits in L2: one block of 1024
// threads an SM, a set of at most set_max_bytes (x, and dy in the backward), sets for 3/4 of the SMs or
// more, runs of whole 16-byte vectors. L1 / L2 rows of 16 KB to 1 MB take a block a row the same way
// (p_norm_row_kernel, at any alignment).
//
// A block's work is cut into units, one run's segment each, a warp a unit at a time (warp w takes units
// w, w + 32, ...): a unit's elements share their channel (weight, bias), and its sums need shuffles
// only. A run has enough segments that the 32 warps have work even with one run a set.
#pragma once
#include <cstdlib>
#include <initializer_list>

#include "family_kernels.cuh"

namespace fastnorm {
namespace family {
namespace sets {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

// Bytes a set may hold (x, plus dy in the backward) for the set path; FASTNORM_FAMILY_SET_KB overrides
// (0 turns the path off), for measurements.
static inline int64_t set_max_bytes() {
  return env_int("FASTNORM_FAMILY_SET_KB", 1024) * 1024;
}

struct SetPlan {
  int64_t sets, runs, spatial, run_stride, set_stride;
  int64_t groups;         // channel of run r of set k: (k % groups) * runs + r (GroupNorm), else k (BatchNorm)
  bool channel_per_run;
  int64_t segs, seg_len, units;
};

// GroupNorm (N, C, S) with G groups: N * G sets of C / G runs; BatchNorm: C sets of N runs.
template <typename T>
static inline SetPlan set_plan(int64_t n, int64_t channels, int64_t spatial, int64_t groups, bool batch) {
  constexpr int64_t V = 16 / sizeof(T);
  SetPlan sp{};
  const int64_t per_group = channels / groups;
  sp.sets = batch ? channels : n * groups;
  sp.runs = batch ? n : per_group;
  sp.spatial = spatial;
  sp.run_stride = batch ? channels * spatial : spatial;
  sp.set_stride = batch ? spatial : per_group * spatial;
  sp.groups = groups;
  sp.channel_per_run = !batch;
  // Runs shorter than a vector (no set path for them) still get a plan without a division by zero.
  const int64_t vecs = spatial / V, want = (kWarps + sp.runs - 1) / (sp.runs > 0 ? sp.runs : 1);
  sp.segs = want < vecs ? want : vecs > 0 ? vecs : 1;
  sp.seg_len = (vecs + sp.segs - 1) / sp.segs * V;
  sp.units = sp.runs * sp.segs;
  return sp;
}

// Whether a set plan takes the set path, `tensors` read per element, given the pointers it reads and writes.
template <typename T>
static inline bool set_path_ok(const SetPlan& sp, int tensors, std::initializer_list<const void*> ptrs) {
  if (sp.spatial % (16 / int64_t(sizeof(T))) != 0 || 4 * sp.sets < 3 * int64_t(device_info().sms)) return false;
  if (sp.runs * sp.spatial * int64_t(sizeof(T)) * tensors > set_max_bytes()) return false;
  for (const void* q : ptrs) {
    if (reinterpret_cast<uintptr_t>(q) % 16 != 0) return false;
  }
  // the units' sums in dynamic shared memory, beside the static: within the 48 KB a launch gets unasked
  return 2 * sp.units * int64_t(sizeof(double)) <= 32 * 1024;
}

// Unit u of a set: run u / segs, elements [lo, hi) of it.
struct Unit {
  int64_t run, lo, hi;
};

__device__ __forceinline__ Unit unit_of(const SetPlan& sp, int64_t u) {
  const int64_t r = u / sp.segs, lo = (u % sp.segs) * sp.seg_len;
  return {r, lo, lo + sp.seg_len < sp.spatial ? lo + sp.seg_len : sp.spatial};
}

__device__ __forceinline__ int64_t channel_of(const SetPlan& sp, int64_t set, int64_t run) {
  return sp.channel_per_run ? (set % sp.groups) * sp.runs + run : set;
}

// Offset of run r of a set from the tensor's start.
__device__ __forceinline__ int64_t run_offset(const SetPlan& sp, int64_t set, int64_t run) {
  return set * sp.set_stride + run * sp.run_stride;
}

// f(i, a) on every vector i of run data `x` (as A values a) that a lane of the warp takes in unit `un`.
template <typename T, bool kStream, typename F>
__device__ __forceinline__ void unit_vectors(const T* x, const Unit& un, int lane, F f) {
  using A = typename AccOf<T>::type;
  constexpr int V = 16 / sizeof(T);
  const Vec<T, V>* v = reinterpret_cast<const Vec<T, V>*>(x);
#pragma unroll 4
  for (int64_t i = un.lo / V + lane; i < un.hi / V; i += 32) {
    A a[V];
    widen(load_vec<kStream>(v + i).v, a);
    f(i, a);
  }
}

template <typename T, int kAct>
__global__ void __launch_bounds__(kThreads, 1) set_forward_kernel(FamilyParams p, SetPlan sp) {
  using A = typename AccOf<T>::type;
  constexpr int V = 16 / sizeof(T);
  __shared__ A red[2 * 32];
  const int64_t set = blockIdx.x, len = sp.runs * sp.spatial;
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const A shift = to_acc(x[run_offset(sp, set, 0)]);  // sums about the set's first value: exact enough at x + 1000
  A s[2] = {A(0), A(0)};
  for (int64_t u = warp; u < sp.units; u += kWarps) {
    const Unit un = unit_of(sp, u);
    unit_vectors<T, false>(x + run_offset(sp, set, un.run), un, lane,
                           [&](int64_t, const A(&a)[V]) { add_shifted(s, a, shift); });
  }
  group_sums<2>(s, kThreads, red);
  const A mean_rel = s[0] / A(len);
  A var = s[1] / A(len) - mean_rel * mean_rel;
  var = var > A(0) ? var : A(0) * var;  // NaN stays NaN
  const A rstd = A(1) / sqrt(var + A(p.eps));
  if (threadIdx.x == 0) {
    static_cast<A*>(p.mean)[set] = shift + mean_rel;
    static_cast<A*>(p.var)[set] = var;
  }
  for (int64_t u = warp; u < sp.units; u += kWarps) {
    const Unit un = unit_of(sp, u);
    const int64_t c = channel_of(sp, set, un.run), off = run_offset(sp, set, un.run);
    const A w = p.weight ? A(param_at(p.weight, p.wdtype, c)) : A(1);
    const A b = p.bias ? A(param_at(p.bias, p.wdtype, c)) : A(0);
    const A scale = rstd * w;
    Vec<T, V>* out = reinterpret_cast<Vec<T, V>*>(y + off);
    unit_vectors<T, true>(x + off, un, lane, [&](int64_t i, A(&a)[V]) {
#pragma unroll
      for (int e = 0; e < V; ++e) a[e] = activate<kAct>(fma((a[e] - shift) - mean_rel, scale, b));
      store_vec(out + i, pack<T>(a));
    });
  }
}

template <typename T>
static const char* run_set_forward(const FamilyParams& p, const SetPlan& sp, cudaStream_t stream) {
  if (p.activation == FN_ACT_SILU) {
    set_forward_kernel<T, FN_ACT_SILU><<<unsigned(sp.sets), kThreads, 0, stream>>>(p, sp);
  } else {
    set_forward_kernel<T, FN_ACT_NONE><<<unsigned(sp.sets), kThreads, 0, stream>>>(p, sp);
  }
  return launch_result(cudaGetLastError());
}

// The forward's set plan where the set path applies (statistics of x, not given: GroupNorm, InstanceNorm,
// BatchNorm in training), else a plan of no sets.
template <typename T>
static SetPlan set_forward_plan(const FamilyParams& p) {
  SetPlan none{};
  if (p.stat != FN_STAT_MEAN_VAR || p.given_stats || p.coeffs % p.channels != 0) return none;
  const int64_t spatial = p.row_len, n = p.numel / (p.channels * spatial);
  const bool batch = p.stats == p.channels && p.runs == n && p.run_len == spatial && p.set_stride == spatial &&
                     p.run_stride == p.channels * spatial;
  const bool groups = p.runs == 1 && p.stats == n * p.groups && p.run_len == p.channels / p.groups * spatial &&
                      p.set_stride == p.run_len;
  if (!batch && !groups) return none;
  const SetPlan sp = set_plan<T>(n, p.channels, spatial, batch ? p.channels : p.groups, batch);
  return set_path_ok<T>(sp, 1, {p.x, p.y}) ? sp : none;
}

// L1 / L2 normalization of rows that fit L2 a wave at a time (p_normalize over trailing dims): a block a
// row takes its sum of |x| or x^2, then writes y = x / max(norm, eps) re-reading the row from L2, so x
// comes from DRAM once; the multi-kernel path reads it twice (66% of a copy's speed on KernelBench's
// 32768 x 65535 fp32 rows, H100). Rows at any offset: a scalar head to the 16-byte boundary, vectors, a
// scalar tail (x and y at different offsets: all scalar).
template <typename T, int kStat>
__global__ void __launch_bounds__(kThreads, 1) p_norm_row_kernel(FamilyParams p) {
  using A = typename AccOf<T>::type;
  constexpr int V = 16 / sizeof(T);
  __shared__ A red[32];
  const int64_t len = p.row_len;
  const T* x = static_cast<const T*>(p.x) + int64_t(blockIdx.x) * len;
  T* y = static_cast<T*>(p.y) + int64_t(blockIdx.x) * len;
  const bool together = ((reinterpret_cast<uintptr_t>(x) ^ reinterpret_cast<uintptr_t>(y)) & 15) == 0;
  const int64_t head = together ? head_elements(x, len) : len, vecs = (len - head) / V, tail = head + vecs * V;
  const Vec<T, V>* vx = reinterpret_cast<const Vec<T, V>*>(x + head);
  Vec<T, V>* vy = reinterpret_cast<Vec<T, V>*>(y + head);
  A s[1] = {A(0)};
  const auto add = [&](A v) { s[0] = kStat == FN_STAT_ABS_SUM ? s[0] + fabs(v) : fma(v, v, s[0]); };
  const int64_t scalars = head + len - tail;  // element k of the head, then of the tail
  for (int64_t k = threadIdx.x; k < scalars; k += kThreads) add(to_acc(x[k < head ? k : tail + k - head]));
  strided_batches<4>(
      int64_t(threadIdx.x), int64_t(kThreads), vecs, [&](int64_t i) { return load_vec<false>(vx + i); },
      [&](int64_t, const Vec<T, V>& v) {
        A a[V];
        widen(v.v, a);
#pragma unroll
        for (int e = 0; e < V; ++e) add(a[e]);
      });
  group_sums<1>(s, kThreads, red);
  const double sum = p.p_mean ? double(s[0]) / double(len) : double(s[0]);
  const double norm = kStat == FN_STAT_SQUARE_SUM ? sqrt(sum) : sum;
  const A scale = A(1.0 / (norm < p.eps ? p.eps : norm));  // a NaN norm gives NaN, as torch's clamp_min
  if (threadIdx.x == 0) static_cast<A*>(p.mean)[blockIdx.x] = A(norm);
  for (int64_t k = threadIdx.x; k < scalars; k += kThreads) {
    const int64_t i = k < head ? k : tail + k - head;
    y[i] = from_acc<T>(to_acc(x[i]) * scale);
  }
  strided_batches<4>(
      int64_t(threadIdx.x), int64_t(kThreads), vecs, [&](int64_t i) { return load_vec<true>(vx + i); },
      [&](int64_t i, const Vec<T, V>& v) {
        A a[V];
        widen(v.v, a);
#pragma unroll
        for (int e = 0; e < V; ++e) a[e] *= scale;
        store_vec(vy + i, pack<T>(a));
      });
}

// Whether p_norm_row_kernel takes a p_normalize call (whole rows, one run a set): rows for 3/4 of the SMs or
// more, of 16 KB (a vector a thread) to set_max_bytes.
template <typename T>
static inline bool p_norm_rows_take(const FamilyParams& p) {
  const int64_t bytes = p.row_len * int64_t(sizeof(T));
  return 4 * p.stats >= 3 * int64_t(device_info().sms) && bytes >= int64_t(kThreads) * 16 && bytes <= set_max_bytes();
}

template <typename T>
static const char* run_p_norm_rows(const FamilyParams& p, cudaStream_t stream) {
  if (p.stat == FN_STAT_ABS_SUM) {
    p_norm_row_kernel<T, FN_STAT_ABS_SUM><<<unsigned(p.stats), kThreads, 0, stream>>>(p);
  } else {
    p_norm_row_kernel<T, FN_STAT_SQUARE_SUM><<<unsigned(p.stats), kThreads, 0, stream>>>(p);
  }
  return launch_result(cudaGetLastError());
}

}  // namespace sets
}  // namespace family
}  // namespace fastnorm
