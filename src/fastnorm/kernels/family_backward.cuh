// CUDA backward of the family's affine members (FamilyBackwardParams): GroupNorm / InstanceNorm and
// BatchNorm, the SiLU epilogue included. x is N * C planes of S elements; each plane belongs to one set
// of statistics. With g = dy' (dy, or dy * silu'(z) after SiLU), u = x - mean and M elements a set:
//   dx = rstd * w * g - rstd / M * sum_set(w g) - u * rstd^3 / M * sum_set(w g u)   (statistics of x)
//   dx = rstd * w * g                                                             (given statistics)
//   dweight[c] = sum over c's planes of rstd * sum(g u),  dbias[c] = sum of sum(g).
// So every plane needs two sums, sum(g) and sum(g u), and the set sums are weighted sums of those:
// 1. plane_sums_kernel: the two sums of each piece of a plane (reads x and dy);
// 2. finalize_kernel: per set the two dx coefficients, per channel dweight and dbias, each summed over its
//    planes' pieces by a group of threads in a fixed order: the results repeat bit for bit;
// 3. plane_dx_kernel: dx = rstd * w * g + kx * u + k0 (reads x and dy again, writes dx).
// Five passes over the tensor's size where torch's eager backward takes eight or more. GroupNorm's sets
// small enough for L2 take set_backward_kernel instead: 1 and 2 in one block a set, 3 from L2; larger ones,
// up to 16 MB of x and dy a set, chain_backward_kernel: 1, the sets' part of 2 and 3 in one kernel whose
// tickets put a piece's dx shortly after its sums (family_chain_kernel.cuh), x and dy re-read from L2.
#pragma once
#include "family_chain_kernel.cuh"

namespace fastnorm {
namespace family {
namespace backward {

// Planes of at least kLongPlane elements are cut into pieces of a block each; shorter ones take a warp
// each (their sums need shuffles only).
constexpr int64_t kLongPlane = 1024;

struct Plan {
  int64_t planes = 0, piece = 0, per_plane = 1, pieces = 0, sets = 0;
  bool warp_planes = false;
  bool held = false;  // held_chain_backward_kernel's pieces (kHeldVecs vectors a thread)
};

// The held chain (held_chain_backward_kernel): vectors of x and of dy a thread holds in registers and in
// shared memory; a piece is kThreads x (both) vectors.
constexpr int kHeldRegs = 3, kHeldSmem = 6, kHeldVecs = kHeldRegs + kHeldSmem;
template <typename T>
static inline bool held_backward_fits(int64_t pieces_per_set);
template <typename T>
static inline bool held_backward_takes(const FamilyBackwardParams& p);

// Vectors of x (and of dy) a thread takes in a piece: 2, or 4 on planes of 16K elements and more, where
// a block's setup and reduction would otherwise come every 8 KB (fp32). FASTNORM_FAMILY_BWD_PIECE_VECS
// overrides, for measurements.
static inline int64_t piece_vectors(int64_t spatial) {
  const int64_t v = env_int("FASTNORM_FAMILY_BWD_PIECE_VECS", 0);
  return v > 0 ? v : spatial >= 16384 ? 4 : 2;
}

template <typename T>
static inline Plan plan_of(const FamilyBackwardParams& p) {
  Plan pl;
  pl.planes = p.n * p.channels;
  pl.sets = p.mode == FN_BWD_GROUPS ? p.n * p.groups : p.channels;
  pl.warp_planes = p.spatial < kLongPlane;
  if (!pl.warp_planes) {
    pl.piece = int64_t(kThreads) * (16 / int64_t(sizeof(T))) * piece_vectors(p.spatial);
    if (held_backward_takes<T>(p)) {
      const int64_t piece = int64_t(kThreads) * (16 / int64_t(sizeof(T))) * kHeldVecs;
      if (held_backward_fits<T>(p.channels / p.groups * ((p.spatial + piece - 1) / piece))) {
        pl.piece = piece;
        pl.held = true;
      }
    }
    pl.per_plane = (p.spatial + pl.piece - 1) / pl.piece;
  }
  pl.pieces = pl.planes * pl.per_plane;
  return pl;
}

template <typename A>
static inline int64_t workspace_bytes(const Plan& pl) {
  return align16(2 * pl.pieces * int64_t(sizeof(A))) + align16(2 * pl.sets * int64_t(sizeof(A))) +
         chain_counter_bytes(pl.sets);
}

template <typename A>
struct Scratch {
  A* sums;   // (sum g, sum g u) per piece, pieces of a plane together
  A* set_k;  // (kx, k0) per set
  unsigned* counters;  // chain_backward_kernel's (family_chain_kernel.cuh chain_counter_bytes)
};

template <typename A>
static inline Scratch<A> scratch_of(const FamilyBackwardParams& p, const Plan& pl) {
  char* base = static_cast<char*>(p.workspace);
  const int64_t sums = align16(2 * pl.pieces * int64_t(sizeof(A)));
  return {reinterpret_cast<A*>(base), reinterpret_cast<A*>(base + sums),
          reinterpret_cast<unsigned*>(base + sums + align16(2 * pl.sets * int64_t(sizeof(A))))};
}

__device__ __forceinline__ int64_t set_of(const FamilyBackwardParams& p, int64_t plane) {
  const int64_t c = plane % p.channels;
  return p.mode == FN_BWD_GROUPS ? (plane / p.channels) * p.groups + c / (p.channels / p.groups) : c;
}

template <typename A>
__device__ __forceinline__ A rstd_of(const FamilyBackwardParams& p, int64_t set) {
  return A(1) / sqrt(static_cast<const A*>(p.var)[set] + A(p.eps));
}

__device__ __forceinline__ float exp_acc(float v) { return expf(v); }
__device__ __forceinline__ double exp_acc(double v) { return exp(v); }

// What one plane's elements need: its set's mean, rstd * w (z's scale and dx's factor of g), the bias.
template <typename A>
struct PlaneTerms {
  A mean, scale, bias;
  int64_t set;
};

template <typename A, int kAct>
__device__ __forceinline__ PlaneTerms<A> plane_terms(const FamilyBackwardParams& p, int64_t plane) {
  const int64_t c = plane % p.channels, set = set_of(p, plane);
  const A w = p.weight ? A(param_at(p.weight, p.wdtype, c)) : A(1);
  const A b = kAct == FN_ACT_SILU && p.bias ? A(param_at(p.bias, p.wdtype, c)) : A(0);
  return {static_cast<const A*>(p.mean)[set], rstd_of<A>(p, set) * w, b, set};
}

// g = dy, or dy * silu'(z) with z = u * scale + bias, silu'(z) = s (1 + z (1 - s)), s = sigmoid(z).
template <int kAct, typename A>
__device__ __forceinline__ A grad_in(A dy, A u, const PlaneTerms<A>& t) {
  if (kAct != FN_ACT_SILU) return dy;
  const A z = fma(u, t.scale, t.bias);
  const A s = A(1) / (A(1) + exp_acc(-z));
  return dy * s * fma(z, A(1) - s, A(1));
}

// Vectors of x and of dy a thread loads before it uses the first (double's SiLU would spill at 4).
template <typename T>
constexpr int kWalkBatch = sizeof(T) == 8 ? 2 : 4;

// op(x, dy) over elements [0, len) of a piece, thread `lane` of `lanes`: vectors where x, dy (and dx)
// sit at the same offset from a 16-byte boundary, after a scalar head; kWrite stores op's result to dx.
// Plain loads and stores: evict-first hints on the dx pass made it 3% slower (H100, BatchNorm
// 64x64x512x512 fp32: 4.37 against 4.25 ms, torch.compile's 4.16; benchmarks/NOTES.md, session 25).
// kLast: evict-first all the same, for the chained dx pass, which wants L2 kept for the data still to
// be read a second time.
template <typename T, bool kWrite, bool kLast = false, typename Op>
__device__ __forceinline__ void walk(const T* x, const T* dy, T* dx, int64_t len, int lane, int lanes, Op op) {
  using A = typename AccOf<T>::type;
  constexpr int V = 16 / sizeof(T);
  const uintptr_t ax = reinterpret_cast<uintptr_t>(x);
  bool together = ((ax ^ reinterpret_cast<uintptr_t>(dy)) & 15) == 0;
  if (kWrite) together = together && ((ax ^ reinterpret_cast<uintptr_t>(dx)) & 15) == 0;
  const int64_t head = together ? head_elements(x, len) : len, vecs = (len - head) / V;
  for (int64_t i = lane; i < head; i += lanes) {
    const A r = op(A(to_acc(x[i])), A(to_acc(dy[i])));
    if (kWrite) dx[i] = from_acc<T>(r);
  }
  const Vec<T, V>* vx = reinterpret_cast<const Vec<T, V>*>(x + head);
  const Vec<T, V>* vdy = reinterpret_cast<const Vec<T, V>*>(dy + head);
  Vec<T, V>* vdx = reinterpret_cast<Vec<T, V>*>(dx + head);
  struct Pair {
    Vec<T, V> x, dy;
  };
  strided_batches<kWalkBatch<T>>(
      int64_t(lane), int64_t(lanes), vecs,
      [&](int64_t i) { return Pair{load_vec<kLast>(vx + i), load_vec<kLast>(vdy + i)}; },
      [&](int64_t i, const Pair& v) {
        A xa[V], ga[V];
        widen(v.x.v, xa);
        widen(v.dy.v, ga);
#pragma unroll
        for (int e = 0; e < V; ++e) xa[e] = op(xa[e], ga[e]);
        if (kWrite) store_vec<kLast>(vdx + i, pack<T>(xa));
      });
  for (int64_t i = head + vecs * V + lane; i < len; i += lanes) {
    const A r = op(A(to_acc(x[i])), A(to_acc(dy[i])));
    if (kWrite) dx[i] = from_acc<T>(r);
  }
}

// The piece a block (long planes) or a warp (short planes) takes: plane, first element, length, and
// this thread's lane among the lanes sharing it. False for a warp past the last plane.
struct Piece {
  int64_t plane, index, lo, len;
  int lane, lanes;
};

// Piece `index` of long planes, the block's threads its lanes.
__device__ __forceinline__ Piece piece_at(const FamilyBackwardParams& p, const Plan& pl, int64_t index) {
  const int64_t plane = index / pl.per_plane, lo = (index % pl.per_plane) * pl.piece;
  return {plane, index, lo, min(pl.piece, p.spatial - lo), int(threadIdx.x), kThreads};
}

// reverse: the dx pass takes the pieces last to first, so its first blocks find in L2 what the sums
// pass read last.
__device__ __forceinline__ bool piece_of(const FamilyBackwardParams& p, const Plan& pl, Piece& q, bool reverse) {
  if (pl.warp_planes) {
    q.plane = q.index = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
    q.lo = 0;
    q.len = p.spatial;
    q.lane = threadIdx.x & 31;
    q.lanes = 32;
    return q.plane < pl.planes;
  }
  q = piece_at(p, pl, reverse ? int64_t(gridDim.x) - 1 - blockIdx.x : int64_t(blockIdx.x));
  return true;
}

template <typename T, int kAct>
__global__ void __launch_bounds__(kThreads) plane_sums_kernel(FamilyBackwardParams p, Plan pl,
                                                              typename AccOf<T>::type* sums) {
  using A = typename AccOf<T>::type;
  __shared__ A smem[2 * 32];
  Piece q;
  if (!piece_of(p, pl, q, false)) return;  // a whole warp of short planes: no block barrier below
  const PlaneTerms<A> t = plane_terms<A, kAct>(p, q.plane);
  const int64_t first = q.plane * p.spatial + q.lo;
  A s[2] = {A(0), A(0)};
  walk<T, false>(static_cast<const T*>(p.x) + first, static_cast<const T*>(p.dy) + first, static_cast<T*>(nullptr),
                 q.len, q.lane, q.lanes, [&](A x, A dy) {
                   const A u = x - t.mean, g = grad_in<kAct>(dy, u, t);
                   s[0] += g;
                   s[1] = fma(g, u, s[1]);
                   return x;
                 });
  group_sums<2>(s, q.lanes, smem);
  if (q.lane == 0) {
    sums[2 * q.index] = s[0];
    sums[2 * q.index + 1] = s[1];
  }
}

// Threads that sum one set's (or one channel's) items in finalize_kernel: a power of two, 32 to kThreads.
static inline int finalize_threads(int64_t items) {
  int t = 32;
  while (t < kThreads && t < items) t *= 2;
  return t;
}

// The piece sums of a set's or a channel's planes, item i (plane i / per_plane, piece i % per_plane) to
// thread i % threads of its group, then one tree over the group: a fixed order, the results repeat bit for
// bit. Blocks [0, set_blocks): the sets' (kx, k0); the rest: the channels' dweight and dbias. A warp a set
// and a thread a channel took 170 us on BatchNorm 64x64x512x512 and 368 us on GroupNorm 112x64x512x512
// (thousands of loads in a row a thread; H100); this takes 15 and 32 us.
template <typename A>
__global__ void __launch_bounds__(kThreads) finalize_kernel(FamilyBackwardParams p, Plan pl, Scratch<A> ws,
                                                            int64_t set_blocks, int set_threads,
                                                            int channel_threads) {
  __shared__ double red[2 * 32];
  const bool set_part = int64_t(blockIdx.x) < set_blocks;
  const int threads = set_part ? set_threads : channel_threads, t = threadIdx.x % threads;
  const int64_t id = (set_part ? int64_t(blockIdx.x) : int64_t(blockIdx.x) - set_blocks) * (kThreads / threads) +
                     threadIdx.x / threads;
  const bool groups = p.mode == FN_BWD_GROUPS;
  const int64_t per_group = p.channels / p.groups, count = groups ? per_group : p.n;
  double s[2] = {0.0, 0.0};
  if (set_part) {  // w-weighted sums of g and g u over the set
    const int64_t items = id < pl.sets ? count * pl.per_plane : 0;
    for (int64_t i = t; i < items; i += threads) {
      const int64_t j = i / pl.per_plane;
      const int64_t plane =
          groups ? (id / p.groups) * p.channels + (id % p.groups) * per_group + j : j * p.channels + id;
      const double w = p.weight ? param_at(p.weight, p.wdtype, plane % p.channels) : 1.0;
      const A* q = ws.sums + 2 * (plane * pl.per_plane + i % pl.per_plane);
      s[0] = fma(w, double(q[0]), s[0]);
      s[1] = fma(w, double(q[1]), s[1]);
    }
  } else {  // dbias = sum of g, dweight = sum of rstd g u over the channel's planes
    const int64_t items = id < p.channels ? p.n * pl.per_plane : 0;
    for (int64_t i = t; i < items; i += threads) {
      const int64_t plane = (i / pl.per_plane) * p.channels + id;
      const A* q = ws.sums + 2 * (plane * pl.per_plane + i % pl.per_plane);
      s[0] += double(q[0]);
      s[1] = fma(double(rstd_of<A>(p, set_of(p, plane))), double(q[1]), s[1]);
    }
  }
  group_sums<2>(s, threads, red);
  if (t != 0) return;
  if (set_part) {
    if (id >= pl.sets) return;
    const double rstd = double(rstd_of<A>(p, id)), m = double(count) * double(p.spatial);
    ws.set_k[2 * id] = A(-rstd * rstd * rstd * s[1] / m);
    ws.set_k[2 * id + 1] = A(-rstd * s[0] / m);
    return;
  }
  if (id >= p.channels) return;
  if (p.dweight) static_cast<A*>(p.dweight)[id] = A(s[1]);
  if (p.dbias) static_cast<A*>(p.dbias)[id] = A(s[0]);
}

// finalize_kernel's launch: a group of threads for each set (when dx needs its coefficients) and for each
// channel (when dweight or dbias is asked for).
template <typename A>
static void launch_finalize(const FamilyBackwardParams& p, const Plan& pl, const Scratch<A>& ws, bool set_terms,
                            bool channel_terms, cudaStream_t stream) {
  const int64_t count = p.mode == FN_BWD_GROUPS ? p.channels / p.groups : p.n;
  const int set_threads = finalize_threads(count * pl.per_plane);
  const int channel_threads = finalize_threads(p.n * pl.per_plane);
  const int64_t per_block_sets = kThreads / set_threads, per_block_channels = kThreads / channel_threads;
  const int64_t set_blocks = set_terms ? (pl.sets + per_block_sets - 1) / per_block_sets : 0;
  const int64_t channel_blocks = channel_terms ? (p.channels + per_block_channels - 1) / per_block_channels : 0;
  if (set_blocks + channel_blocks == 0) return;
  finalize_kernel<A><<<unsigned(set_blocks + channel_blocks), kThreads, 0, stream>>>(
      p, pl, ws, set_blocks, set_threads, channel_threads);
}

template <typename T, int kAct, bool kGiven>
__global__ void __launch_bounds__(kThreads) plane_dx_kernel(FamilyBackwardParams p, Plan pl,
                                                            const typename AccOf<T>::type* set_k) {
  using A = typename AccOf<T>::type;
  Piece q;
  if (!piece_of(p, pl, q, true)) return;
  const PlaneTerms<A> t = plane_terms<A, kAct>(p, q.plane);
  const A kx = kGiven ? A(0) : set_k[2 * t.set], k0 = kGiven ? A(0) : set_k[2 * t.set + 1];
  const int64_t first = q.plane * p.spatial + q.lo;
  walk<T, true>(static_cast<const T*>(p.x) + first, static_cast<const T*>(p.dy) + first,
                static_cast<T*>(p.dx) + first, q.len, q.lane, q.lanes, [&](A x, A dy) {
                  const A u = x - t.mean;
                  return fma(t.scale, grad_in<kAct>(dy, u, t), fma(kx, u, k0));
                });
}

// A set-path unit's terms: its channel's rstd * w and bias about the set's mean.
template <typename A, int kAct>
__device__ __forceinline__ PlaneTerms<A> unit_terms(const FamilyBackwardParams& p, const sets::SetPlan& sp, int64_t set,
                                                  const sets::Unit& un, A mean, A rstd) {
  const int64_t c = sets::channel_of(sp, set, un.run);
  const A w = p.weight ? A(param_at(p.weight, p.wdtype, c)) : A(1);
  const A b = kAct == FN_ACT_SILU && p.bias ? A(param_at(p.bias, p.wdtype, c)) : A(0);
  return {mean, rstd * w, b, set};
}

// One block a set (family_set_kernels.cuh; statistics of x: FN_BWD_GROUPS, FN_BWD_BATCH): the units' two
// sums, then per run its sums, then the set's (w-weighted) sums, then dx from the data this block just read
// (in L2). GroupNorm's runs are (sample, channel) planes: their sums go to plane_sums for finalize_kernel's
// dweight / dbias (one piece a plane). BatchNorm's set is a whole channel: the block writes its dweight and
// dbias itself.
template <typename T, int kAct>
__global__ void __launch_bounds__(sets::kThreads, 1) set_backward_kernel(FamilyBackwardParams p, sets::SetPlan sp,
                                                                        typename AccOf<T>::type* plane_sums) {
  using A = typename AccOf<T>::type;
  constexpr int V = 16 / sizeof(T);
  extern __shared__ unsigned char shared_bytes[];
  A* unit_sums = reinterpret_cast<A*>(shared_bytes);  // 2 a unit
  __shared__ A red[2 * 32];
  const int64_t set = blockIdx.x, len = sp.runs * sp.spatial;
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const A mean = static_cast<const A*>(p.mean)[set], rstd = rstd_of<A>(p, set);
  for (int64_t u = warp; u < sp.units; u += sets::kWarps) {
    const sets::Unit un = sets::unit_of(sp, u);
    const int64_t off = sets::run_offset(sp, set, un.run);
    const PlaneTerms<A> t = unit_terms<A, kAct>(p, sp, set, un, mean, rstd);
    const Vec<T, V>* g = reinterpret_cast<const Vec<T, V>*>(dy + off);
    A s[2] = {A(0), A(0)};
    sets::unit_vectors<T, false>(x + off, un, lane, [&](int64_t i, const A(&a)[V]) {
      A d[V];
      widen(load_vec<false>(g + i).v, d);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A uu = a[e] - mean, gg = grad_in<kAct>(d[e], uu, t);
        s[0] += gg;
        s[1] = fma(gg, uu, s[1]);
      }
    });
    group_sums<2>(s, 32, red);  // a warp: shuffles only
    if (lane == 0) {
      unit_sums[2 * u] = s[0];
      unit_sums[2 * u + 1] = s[1];
    }
  }
  __syncthreads();
  // Sums over the set of g and g u, each run's weighted by its channel's w (BatchNorm: one channel, so
  // unweighted here and scaled below).
  A wsum[2] = {A(0), A(0)};
  for (int64_t r = threadIdx.x; r < sp.runs; r += sets::kThreads) {
    A sg = A(0), sgu = A(0);
    for (int64_t k = 0; k < sp.segs; ++k) {
      sg += unit_sums[2 * (r * sp.segs + k)];
      sgu += unit_sums[2 * (r * sp.segs + k) + 1];
    }
    A w = A(1);
    if (sp.channel_per_run) {
      const int64_t c = sets::channel_of(sp, set, r);
      if (plane_sums) {
        const int64_t plane = (set / sp.groups) * p.channels + c;
        plane_sums[2 * plane] = sg;
        plane_sums[2 * plane + 1] = sgu;
      }
      w = p.weight ? A(param_at(p.weight, p.wdtype, c)) : A(1);
    }
    wsum[0] = fma(w, sg, wsum[0]);
    wsum[1] = fma(w, sgu, wsum[1]);
  }
  group_sums<2>(wsum, sets::kThreads, red);  // the warps' calls above left red untouched
  if (!sp.channel_per_run) {
    if (threadIdx.x == 0) {
      if (p.dweight) static_cast<A*>(p.dweight)[set] = rstd * wsum[1];
      if (p.dbias) static_cast<A*>(p.dbias)[set] = wsum[0];
    }
    const A w = p.weight ? A(param_at(p.weight, p.wdtype, set)) : A(1);
    wsum[0] *= w;
    wsum[1] *= w;
  }
  if (p.dx == nullptr) return;
  const A kx = -rstd * rstd * rstd * wsum[1] / A(len), k0 = -rstd * wsum[0] / A(len);
  T* dx = static_cast<T*>(p.dx);
  for (int64_t u = warp; u < sp.units; u += sets::kWarps) {
    const sets::Unit un = sets::unit_of(sp, u);
    const int64_t off = sets::run_offset(sp, set, un.run);
    const PlaneTerms<A> t = unit_terms<A, kAct>(p, sp, set, un, mean, rstd);
    const Vec<T, V>* g = reinterpret_cast<const Vec<T, V>*>(dy + off);
    Vec<T, V>* out = reinterpret_cast<Vec<T, V>*>(dx + off);
    sets::unit_vectors<T, true>(x + off, un, lane, [&](int64_t i, A(&a)[V]) {
      A d[V];
      widen(load_vec<true>(g + i).v, d);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const A uu = a[e] - mean;
        a[e] = fma(t.scale, grad_in<kAct>(d[e], uu, t), fma(kx, uu, k0));
      }
      store_vec(out + i, pack<T>(a));
    });
  }
}

// GroupNorm sets of 256 KB to 16 MB of x and dy on planes of 16K elements or more (past the set path),
// without SiLU (whose float32 instance spills 28 bytes with a 24-byte stack frame; not the sigmoid's
// division, a reciprocal intrinsic there spilled the same): each piece has two tickets
// (family_chain_kernel.cuh), its sums and, lag pieces later, its dx. The last sums of a set make
// the set's (kx, k0) as finalize_kernel does (the set's pieces in a fixed order over a block's threads) and
// raise its flag; dweight and dbias come after, from finalize_kernel over the same piece sums. H100
// (benchmarks/group_norm_paths.py --backward): 1.03-1.04x the plane kernels on sets of 4-8 MB (KernelBench's
// GroupNorm 12.15 -> 11.81 ms), 1.03-1.29x on smaller shapes, whose ratios swing between processes;
// 8x512x64x64 fp32 (planes of 4096, pieces of 2048 elements) read 0.96x once, so planes under 16K elements
// stay on the plane kernels.
struct ChainTickets {
  int64_t per_set = 0, lag = 0;
};

// GroupNorm calls the chained backward takes (sets of 256 KB - 16 MB of x and dy, dx wanted, no SiLU, planes
// of 16K elements or more).
template <typename T>
static inline bool chain_backward_takes(const FamilyBackwardParams& p) {
  const int64_t per_group = p.channels / p.groups, bytes = 2 * per_group * p.spatial * int64_t(sizeof(T));
  return p.mode == FN_BWD_GROUPS && p.dx && p.activation == FN_ACT_NONE && p.spatial >= 16384 &&
         bytes >= (256 << 10) && bytes <= env_int("FASTNORM_FAMILY_BWD_CHAIN_KB", 16 << 10) << 10;
}

template <typename T>
static inline ChainTickets chain_tickets(const FamilyBackwardParams& p, const Plan& pl) {
  ChainTickets ct;
  if (!chain_backward_takes<T>(p) || 2 * pl.pieces >= (int64_t(1) << 31)) return ct;
  ct.per_set = p.channels / p.groups * pl.per_plane;
  if (pl.held) return ct;
  ct.lag = chain::ticket_lag("FASTNORM_FAMILY_BWD_CHAIN_LAG_KB", 6 << 20, 2 * pl.piece * int64_t(sizeof(T)),
                             ct.per_set, pl.pieces);
  return ct;
}

// The last sums of a set: the set's (kx, k0) from its pieces' sums, weighted by w, in a fixed order over the
// block's threads (the set's planes are set * per_group on, GroupNorm: n * C + g * per_group, its pieces
// contiguous), then its flag raised.
template <typename A>
__device__ __forceinline__ void close_set(const FamilyBackwardParams& p, const Plan& pl, const ChainTickets& ct,
                                          const Scratch<A>& ws, int64_t set) {
  __shared__ double red[2 * 32];
  const int64_t per_group = p.channels / p.groups, base = set * ct.per_set;
  double d[2] = {0.0, 0.0};
  for (int64_t i = threadIdx.x; i < ct.per_set; i += kThreads) {
    const int64_t plane = set * per_group + i / pl.per_plane;
    const double w = p.weight ? param_at(p.weight, p.wdtype, plane % p.channels) : 1.0;
    d[0] = fma(w, double(__ldcg(ws.sums + 2 * (base + i))), d[0]);
    d[1] = fma(w, double(__ldcg(ws.sums + 2 * (base + i) + 1)), d[1]);
  }
  group_sums<2>(d, kThreads, red);
  if (threadIdx.x == 0) {
    const double rstd = double(rstd_of<A>(p, set)), m = double(per_group) * double(p.spatial);
    ws.set_k[2 * set] = A(-rstd * rstd * rstd * d[1] / m);
    ws.set_k[2 * set + 1] = A(-rstd * d[0] / m);
    raise_flag(ws.counters, pl.sets, set);
  }
}

template <typename T, typename A = typename AccOf<T>::type>
__global__ void __launch_bounds__(kThreads) chain_backward_kernel(FamilyBackwardParams p, Plan pl, ChainTickets ct,
                                                                  Scratch<A> ws) {
  constexpr int kAct = FN_ACT_NONE;
  __shared__ A smem[2 * 32];
  int64_t index;
  const bool out = chain::decode_ticket(pl.pieces, ct.lag, take_ticket(ws.counters), index);
  const Piece q = piece_at(p, pl, index);
  const PlaneTerms<A> t = plane_terms<A, kAct>(p, q.plane);
  const int64_t first = q.plane * p.spatial + q.lo;
  const T* x = static_cast<const T*>(p.x) + first;
  const T* dy = static_cast<const T*>(p.dy) + first;
  if (!out) {
    A s[2] = {A(0), A(0)};
    walk<T, false>(x, dy, static_cast<T*>(nullptr), q.len, q.lane, q.lanes, [&](A xv, A dyv) {
      const A u = xv - t.mean, g = grad_in<kAct>(dyv, u, t);
      s[0] += g;
      s[1] = fma(g, u, s[1]);
      return xv;
    });
    group_sums<2>(s, kThreads, smem);
    if (threadIdx.x == 0) {
      ws.sums[2 * index] = s[0];
      ws.sums[2 * index + 1] = s[1];
    }
    if (arrive_last(ws.counters, t.set, ct.per_set)) close_set<A>(p, pl, ct, ws, t.set);
    return;
  }
  wait_flag(ws.counters, pl.sets, t.set);
  const A kx = __ldcg(ws.set_k + 2 * t.set), k0 = __ldcg(ws.set_k + 2 * t.set + 1);
  walk<T, true, true>(x, dy, static_cast<T*>(p.dx) + first, q.len, q.lane, q.lanes, [&](A xv, A dyv) {
    const A u = xv - t.mean;
    return fma(t.scale, grad_in<kAct>(dyv, u, t), fma(kx, u, k0));
  });
}

// The held chain: a ticket is a piece whose block copies its x and dy on chip (kHeldRegs vectors of each a
// thread in registers, kHeldSmem in shared memory), sums g and g u, waits for its set's (kx, k0) and writes
// dx from what it holds: x and dy read once, whatever L2 keeps (the chain above re-reads them). As in the
// forward's held chain (family_chain_kernel.cuh), a set's pieces must all be held at once: at most half the
// blocks the device holds. Sets of 2 MB of x or more (the forward's measured bound: below it the chain's
// re-reads find L2), aligned planes of whole vectors. FASTNORM_FAMILY_BWD_HOLD=0 keeps the chain. H100,
// backward alone (benchmarks/group_norm_held.py --backward): KernelBench's GroupNorm 11.70 -> 10.49 ms, bf16
// 5.84 -> 4.66, fp32 16x128x256x256 0.85 -> 0.74. A second layout for the other GroupNorm calls (2 vectors
// of each a thread in shared memory, SiLU included) lost where it applied: fp16 64x32x256x256 0.54 against 0.40.
template <typename T, typename A = typename AccOf<T>::type>
__global__ void __launch_bounds__(kThreads, 4) held_chain_backward_kernel(FamilyBackwardParams p, Plan pl,
                                                                          ChainTickets ct, Scratch<A> ws) {
  constexpr int V = 16 / sizeof(T);
  using Vt = Vec<T, V>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  Vt* held = reinterpret_cast<Vt*>(dyn_smem);  // x's vector (m, thread) at m * kThreads + thread, then dy's
  __shared__ A smem[2 * 32];
  const int64_t index = take_ticket(ws.counters);
  const Piece q = piece_at(p, pl, index);
  const PlaneTerms<A> tm = plane_terms<A, FN_ACT_NONE>(p, q.plane);
  const int64_t first = q.plane * p.spatial + q.lo;
  const Vt* xv = reinterpret_cast<const Vt*>(static_cast<const T*>(p.x) + first);
  const Vt* gv = reinterpret_cast<const Vt*>(static_cast<const T*>(p.dy) + first);
  const int nv = int(q.len / V), t = threadIdx.x;
  constexpr int kDy = kHeldSmem * kThreads;  // dy's part of the shared memory
#pragma unroll
  for (int m = 0; m < kHeldSmem; ++m) {
    const int i = (kHeldRegs + m) * kThreads + t;
    if (i < nv) {
      cp_async<16, false>(held + m * kThreads + t, xv + i);
      cp_async<16, false>(held + kDy + m * kThreads + t, gv + i);
    }
  }
  cp_async_commit();
  Vt rx[kHeldRegs], rg[kHeldRegs];
#pragma unroll
  for (int m = 0; m < kHeldRegs; ++m) {
    const int i = m * kThreads + t;
    if (i < nv) rx[m] = load_vec<false>(xv + i), rg[m] = load_vec<false>(gv + i);
  }
  A s[2] = {A(0), A(0)};
  auto add = [&](const Vt& x, const Vt& dy) {
    A xa[V], ga[V];
    widen(x.v, xa);
    widen(dy.v, ga);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      s[0] += ga[e];
      s[1] = fma(ga[e], xa[e] - tm.mean, s[1]);
    }
  };
#pragma unroll
  for (int m = 0; m < kHeldRegs; ++m) {
    if (m * kThreads + t < nv) add(rx[m], rg[m]);
  }
  cp_async_wait_all();  // each thread reads back only its own copies: no barrier
#pragma unroll 2
  for (int m = 0; m < kHeldSmem; ++m) {
    if ((kHeldRegs + m) * kThreads + t < nv) add(held[m * kThreads + t], held[kDy + m * kThreads + t]);
  }
  group_sums<2>(s, kThreads, smem);
  if (t == 0) {
    ws.sums[2 * index] = s[0];
    ws.sums[2 * index + 1] = s[1];
  }
  if (arrive_last(ws.counters, tm.set, ct.per_set)) close_set<A>(p, pl, ct, ws, tm.set);
  wait_flag(ws.counters, pl.sets, tm.set);
  const A kx = __ldcg(ws.set_k + 2 * tm.set), k0 = __ldcg(ws.set_k + 2 * tm.set + 1);
  Vt* dxv = reinterpret_cast<Vt*>(static_cast<T*>(p.dx) + first);
  auto out = [&](int i, const Vt& x, const Vt& dy) {
    A xa[V], ga[V];
    widen(x.v, xa);
    widen(dy.v, ga);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const A u = xa[e] - tm.mean;
      xa[e] = fma(tm.scale, ga[e], fma(kx, u, k0));
    }
    store_vec<false>(dxv + i, pack<T>(xa));
  };
#pragma unroll
  for (int m = 0; m < kHeldRegs; ++m) {
    if (m * kThreads + t < nv) out(m * kThreads + t, rx[m], rg[m]);
  }
#pragma unroll 2
  for (int m = 0; m < kHeldSmem; ++m) {
    const int i = (kHeldRegs + m) * kThreads + t;
    if (i < nv) out(i, held[m * kThreads + t], held[kDy + m * kThreads + t]);
  }
}

static inline size_t held_backward_smem() { return size_t(2 * kHeldSmem * kThreads * 16); }

template <typename T>
static inline bool held_backward_takes(const FamilyBackwardParams& p) {
  constexpr int64_t V = 16 / sizeof(T);
  const int64_t set_bytes = p.channels / p.groups * p.spatial * int64_t(sizeof(T));
  return sizeof(T) < 8 && env_int("FASTNORM_FAMILY_BWD_HOLD", 1) != 0 && chain_backward_takes<T>(p) &&
         set_bytes >= (2 << 20) && p.spatial % V == 0 && aligned16(p.x) && aligned16(p.dy) && aligned16(p.dx);
}

template <typename T>
static inline bool held_backward_fits(int64_t pieces_per_set) {
  if constexpr (sizeof(T) == 8) {
    return false;  // float64 would spill
  } else {
    static const bool allowed = (allow_smem(held_chain_backward_kernel<T>), true);  // over 48 KB: asked once
    (void)allowed;
    const int per_sm =
        blocks_per_sm(reinterpret_cast<const void*>(held_chain_backward_kernel<T>), kThreads, held_backward_smem());
    return per_sm > 0 && 2 * pieces_per_set <= int64_t(per_sm) * device_info().sms;
  }
}

template <typename T, int kAct>
static void launch_dx(const FamilyBackwardParams& p, const Plan& pl, unsigned blocks,
                      const typename AccOf<T>::type* set_k, cudaStream_t stream) {
  if (p.mode == FN_BWD_GIVEN) {
    plane_dx_kernel<T, kAct, true><<<blocks, kThreads, 0, stream>>>(p, pl, set_k);
  } else {
    plane_dx_kernel<T, kAct, false><<<blocks, kThreads, 0, stream>>>(p, pl, set_k);
  }
}

template <typename T>
static const char* run_backward(const FamilyBackwardParams& p, cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  const Plan pl = plan_of<T>(p);
  if (p.workspace_bytes < workspace_bytes<A>(pl)) return "family backward workspace too small";
  const Scratch<A> ws = scratch_of<A>(p, pl);
  const bool silu = p.activation == FN_ACT_SILU;
  const bool set_terms = p.dx != nullptr && p.mode != FN_BWD_GIVEN, channel_terms = p.dweight || p.dbias;
  const sets::SetPlan sp = sets::set_plan<T>(p.n, p.channels, p.spatial, p.groups, p.mode == FN_BWD_BATCH);
  if (p.mode != FN_BWD_GIVEN && sets::set_path_ok<T>(sp, 2, {p.x, p.dy, p.dx ? p.dx : p.x})) {
    const size_t smem = size_t(2 * sp.units) * sizeof(A);
    A* plane_sums = channel_terms && sp.channel_per_run ? ws.sums : nullptr;
    if (silu) {
      set_backward_kernel<T, FN_ACT_SILU><<<unsigned(sp.sets), sets::kThreads, smem, stream>>>(p, sp, plane_sums);
    } else {
      set_backward_kernel<T, FN_ACT_NONE><<<unsigned(sp.sets), sets::kThreads, smem, stream>>>(p, sp, plane_sums);
    }
    if (plane_sums) {  // GroupNorm's dweight / dbias from its plane sums, one piece a plane
      Plan one = pl;
      one.per_plane = 1;
      launch_finalize<A>(p, one, ws, false, true, stream);
    }
    return launch_result(cudaGetLastError());
  }
  const ChainTickets ct = chain_tickets<T>(p, pl);
  if (ct.per_set > 0) {
    clear_chain_counters(ws.counters, pl.sets, stream);
    if (pl.held) {
      if constexpr (sizeof(T) < 8) {
        held_chain_backward_kernel<T><<<unsigned(pl.pieces), kThreads, held_backward_smem(), stream>>>(p, pl, ct, ws);
      }
    } else {
      chain_backward_kernel<T><<<unsigned(2 * pl.pieces), kThreads, 0, stream>>>(p, pl, ct, ws);
    }
    launch_finalize<A>(p, pl, ws, false, channel_terms, stream);
    return launch_result(cudaGetLastError());
  }
  const unsigned blocks =
      unsigned(pl.warp_planes ? (pl.planes + kWarpsPerBlock - 1) / kWarpsPerBlock : pl.pieces);
  if (set_terms || channel_terms) {
    if (silu) {
      plane_sums_kernel<T, FN_ACT_SILU><<<blocks, kThreads, 0, stream>>>(p, pl, ws.sums);
    } else {
      plane_sums_kernel<T, FN_ACT_NONE><<<blocks, kThreads, 0, stream>>>(p, pl, ws.sums);
    }
    launch_finalize<A>(p, pl, ws, set_terms, channel_terms, stream);
  }
  if (p.dx != nullptr) {
    if (silu) {
      launch_dx<T, FN_ACT_SILU>(p, pl, blocks, ws.set_k, stream);
    } else {
      launch_dx<T, FN_ACT_NONE>(p, pl, blocks, ws.set_k, stream);
    }
  }
  return launch_result(cudaGetLastError());
}

}  // namespace backward
}  // namespace family
}  // namespace fastnorm
