// GroupNorm / InstanceNorm sets too large for a block each (family_set_kernels.cuh) but a few of which
// fit L2 (256 KB - 16 MB), in one kernel that reads x from DRAM once, mostly; the multi-kernel path reads
// it twice. H100, KernelBench's GroupNorm 112x64x512x512 fp32 (8 MB sets): 6.65 ms against 7.40 for the
// multi-kernel path and 7.46 for torch.compile (75% of a copy's speed: part of x is gone from L2 by its
// second read). Measured against: y stored plain 7.21 ms, x re-read without the evict-first hint 7.55,
// chunks of 16 vectors a thread 7.38, the statistics of a whole set ahead of the outputs of the one
// before (not chunk by chunk) 7.15.
//
// Blocks take tickets in the order they start (an atomic counter). A ticket is a 32 KB chunk of a set, for
// its statistics or for its output; the statistics of chunk k + lag come right before the output of chunk
// k (lag at least a set), so an output chunk finds its set's statistics done and x still in L2 (about lag
// chunks of x read in between). The last statistics chunk of a set adds the set's partial sums (double, in
// chunk order: results repeat bit for bit) and raises the set's flag. An output chunk waits only for
// statistics tickets earlier than its own, which blocks already running hold: no deadlock, whatever
// shares the GPU. family_backward.cuh's chain_backward_kernel takes its tickets the same way.
//
// Sets of 2 MB or more (not float64) take the held chain instead (held_chain_kernel below): one ticket a
// chunk, held on chip from its statistics to its output, so x is read once (6.01 ms on KernelBench's
// GroupNorm, 83% of copy). family_backward.cuh's held_chain_backward_kernel does the same for x and dy.
#pragma once
#include "family_set_kernels.cuh"
#include "ticket_chain.cuh"

namespace fastnorm {
namespace family {
namespace chain {

// A set is `chunks` chunks of `chunk` elements; chunk k of the call is chunk k % chunks of set k / chunks.
// Each chunk has two tickets, its statistics and its output, `lag` chunks apart (at least a set).
// held: chunks of held_chain_kernel (lag unused).
struct ChainPlan {
  int64_t sets = 0, set_len, chunk, chunks, lag, spatial, per_group;
  bool held = false;
};

// The held chain's vectors a thread in registers and in shared memory: a chunk is kThreads x both.
constexpr int kHeldRegs = 8, kHeldSmem = 12;

template <typename T>
static inline bool held_chain_fits(int64_t chunks);

// Workspace: the ticket counter, then per set its arrivals and flag (zeroed before the launch); partial
// sums (2 a chunk); mean and rstd per set (double).
template <typename A>
struct ChainWorkspace {
  unsigned* counters;
  A* partials;
  double* set_stats;
};

// Ticket t of 2 * total (chunk k, output?): the first lag chunks' statistics, then the statistics of chunk
// k + lag and the output of chunk k in turn, then the last lag chunks' outputs. An output waits for its set's
// statistics, whose tickets all come before its own when lag >= a set's chunks.
__device__ __forceinline__ bool decode_ticket(int64_t total, int64_t lag, int64_t t, int64_t& k) {
  const int64_t pairs = total - lag;
  k = t;
  if (t < lag) return false;
  t -= lag;
  k = t < 2 * pairs ? t / 2 + (t & 1 ? 0 : lag) : t - pairs;
  return t >= 2 * pairs || (t & 1);
}

// Ticket lag of `lag_bytes` (FASTNORM_<name>_LAG_KB overrides) in chunks of chunk_bytes: at least a set's
// `per_set` chunks, at most all `total`.
static inline int64_t ticket_lag(const char* env, int64_t lag_bytes, int64_t chunk_bytes, int64_t per_set,
                                 int64_t total) {
  const int64_t lag = (env_int(env, lag_bytes >> 10) << 10) / chunk_bytes;
  return lag < per_set ? per_set : lag > total ? total : lag;
}

template <typename T>
static ChainPlan chain_plan(const FamilyParams& p) {
  constexpr int64_t V = 16 / sizeof(T);
  ChainPlan cp;
  const int64_t bytes = p.run_len * int64_t(sizeof(T)), tickets_cap = int64_t(1) << 31;
  // GroupNorm's layout (group_norm_forward), sets of 256 KB to FASTNORM_FAMILY_CHAIN_KB (0: off), planes of
  // whole vectors and at least kLongRow elements (a chunk spans few channels), x and y aligned.
  if (p.stat != FN_STAT_MEAN_VAR || p.given_stats || p.runs != 1 || p.row_len < kLongRow || p.row_len % V != 0 ||
      bytes < (256 << 10) || bytes > env_int("FASTNORM_FAMILY_CHAIN_KB", 16 << 10) << 10 ||
      !aligned16(p.x) || !aligned16(p.y) || sets::set_forward_plan<T>(p).sets > 0) {
    return cp;
  }
  cp.set_len = p.run_len;
  cp.spatial = p.row_len;
  cp.per_group = p.channels / p.groups;
  // The held chain for sets of 2 MB or more whose chunks fit on chip (FASTNORM_FAMILY_CHAIN_HOLD=0: off).
  // Below 2 MB the lag chain's re-reads find x in L2: H100, fp32 4x64x256x256 (1 MB sets) 0.062 against
  // 0.066 ms held (results/h100-family-ab.txt, session 33). A single file holds the one its shapes take.
#ifdef FASTNORM_WANT_GROUP_HELD
  if (sizeof(T) < 8 && bytes >= (2 << 20) && env_int("FASTNORM_FAMILY_CHAIN_HOLD", 1) != 0) {
    cp.chunk = kThreads * V * (kHeldRegs + kHeldSmem);
    cp.chunks = (cp.set_len + cp.chunk - 1) / cp.chunk;
    if (held_chain_fits<T>(cp.chunks) && p.stats * cp.chunks < tickets_cap) {
      cp.held = true;
      cp.lag = 0;
      cp.sets = p.stats;
      return cp;
    }
  }
#endif
#ifndef FASTNORM_WANT_GROUP_CHAIN
  return cp;
#endif
  cp.chunk = kThreads * V * kStatsBatch;
  cp.chunks = (cp.set_len + cp.chunk - 1) / cp.chunk;
  // Lag: 6 MB of chunks, at least a set. H100 (benchmarks/results/h100-family-ab.txt, session 28): GroupNorm
  // 112x64x512x512 fp32 (8 MB sets) 6.65 ms at one set (the least), 6.77 at 12 MB, 7.29 at 16 MB; sets of
  // 4 MB 2.97-3.03 ms at 2-8 MB, 3.19 at 12 MB, 3.51 at 16 MB (x gone from L2 before its second read).
  const int64_t total = p.stats * cp.chunks;
  cp.lag = ticket_lag("FASTNORM_FAMILY_CHAIN_LAG_KB", 6 << 20, cp.chunk * int64_t(sizeof(T)), cp.chunks, total);
  if (2 * total < tickets_cap) cp.sets = p.stats;
  return cp;
}

static inline int64_t chain_workspace_bytes(const ChainPlan& cp, int64_t acc_size) {
  return align16(chain_counter_bytes(cp.sets)) + align16(cp.sets * cp.chunks * 2 * acc_size) + cp.sets * 16;
}

template <typename A>
static ChainWorkspace<A> chain_workspace(const FamilyParams& p, const ChainPlan& cp) {
  char* base = static_cast<char*>(p.workspace);
  ChainWorkspace<A> ws;
  ws.counters = reinterpret_cast<unsigned*>(base);
  base += align16(chain_counter_bytes(cp.sets));
  ws.partials = reinterpret_cast<A*>(base);
  ws.set_stats = reinterpret_cast<double*>(base + align16(cp.sets * cp.chunks * 2 * int64_t(sizeof(A))));
  return ws;
}

// The last statistics block of a set: the set's partial sums added in double in chunk order (results repeat
// bit for bit), its mean and variance written, its (mean, rstd) published and its flag raised.
template <typename A>
__device__ __forceinline__ void close_set(const FamilyParams& p, const ChainPlan& cp, const ChainWorkspace<A>& ws,
                                          int64_t set, A shift) {
  __shared__ double dred[2 * 32];
  double d[2] = {0.0, 0.0};
  for (int64_t c = threadIdx.x; c < cp.chunks; c += kThreads) {
    d[0] += double(__ldcg(ws.partials + 2 * (set * cp.chunks + c)));
    d[1] += double(__ldcg(ws.partials + 2 * (set * cp.chunks + c) + 1));
  }
  group_sums<2>(d, kThreads, dred);
  if (threadIdx.x == 0) {
    const double mean_rel = d[0] / double(cp.set_len);
    double var = d[1] / double(cp.set_len) - mean_rel * mean_rel;
    var = var > 0.0 ? var : 0.0 * var;  // NaN stays NaN
    static_cast<A*>(p.mean)[set] = A(double(shift) + mean_rel);
    static_cast<A*>(p.var)[set] = A(var);
    ws.set_stats[2 * set] = double(shift) + mean_rel;
    ws.set_stats[2 * set + 1] = 1.0 / sqrt(var + p.eps);
    raise_flag(ws.counters, cp.sets, set);
  }
}

// Thread t's share of a chunk's coefficients (elements [lo, hi) of a set, channel first + t): its weight and
// bias into coef[1][t] and coef[2][t], read before the set closes (off the path from its flag to the outputs),
// then, once it has, (center, scale, offset) as coefficients_kernel makes them. The caller syncs before
// others read them.
template <int kRuns, typename A>
__device__ __forceinline__ void chunk_params(const FamilyParams& p, const ChainPlan& cp, int64_t set, int64_t lo,
                                             int64_t hi, A (&coef)[3][kRuns]) {
  const int64_t run0 = lo / cp.spatial, c = (set % p.groups) * cp.per_group + run0 + threadIdx.x;
  if (threadIdx.x <= (hi - 1) / cp.spatial - run0) {
    coef[1][threadIdx.x] = A(p.weight ? param_at(p.weight, p.wdtype, c) : 1.0);  // exact: A is the wider type
    coef[2][threadIdx.x] = A(p.bias ? param_at(p.bias, p.wdtype, c) : 0.0);
  }
}

template <int kRuns, typename A>
__device__ __forceinline__ void chunk_coefficients(const ChainPlan& cp, const ChainWorkspace<A>& ws, int64_t set,
                                                   int64_t lo, int64_t hi, A (&coef)[3][kRuns]) {
  const int64_t run0 = lo / cp.spatial;
  if (threadIdx.x <= (hi - 1) / cp.spatial - run0) {
    const double mean = __ldcg(ws.set_stats + 2 * set), rstd = __ldcg(ws.set_stats + 2 * set + 1);
    const double scale = rstd * double(coef[1][threadIdx.x]);
    const A center = A(mean);
    coef[0][threadIdx.x] = center;
    coef[2][threadIdx.x] = A(double(coef[2][threadIdx.x]) - (mean - double(center)) * scale);
    coef[1][threadIdx.x] = A(scale);
  }
}

// y of one vector of x whose elements are all in channel r of the chunk's coefficients.
template <int kAct, typename T, int V, typename A, int kRuns>
__device__ __forceinline__ Vec<T, V> normalize_vec(const Vec<T, V>& v, const A (&coef)[3][kRuns], uint32_t r) {
  A a[V];
  widen(v.v, a);
#pragma unroll
  for (int e = 0; e < V; ++e) a[e] = activate<kAct>(fma(a[e] - coef[0][r], coef[1][r], coef[2][r]));
  return pack<T>(a);
}

template <typename T, int kAct, typename A = typename AccOf<T>::type>
__global__ void __launch_bounds__(kThreads) chain_kernel(FamilyParams p, ChainPlan cp, ChainWorkspace<A> ws) {
  constexpr int V = 16 / sizeof(T);
  constexpr int kRuns = 16;  // channels a chunk may span: chunk / kLongRow + 2 at most
  __shared__ A red[2 * 32];
  __shared__ A coef[3][kRuns];
  int64_t k;
  const bool out = decode_ticket(cp.sets * cp.chunks, cp.lag, take_ticket(ws.counters), k);
  const int64_t set = k / cp.chunks, j = k % cp.chunks;
  const T* x = static_cast<const T*>(p.x) + set * cp.set_len;
  const Vec<T, V>* xv = reinterpret_cast<const Vec<T, V>*>(x);
  if (!out) {
    const A shift = to_acc(x[0]);  // sums about the set's first value: exact enough at x + 1000
    const int64_t hi = min((j + 1) * cp.chunk, cp.set_len) / V;
    A s[2] = {A(0), A(0)};
    strided_batches<kStatsBatch>(
        j * cp.chunk / V + threadIdx.x, int64_t(kThreads), hi, [&](int64_t i) { return load_vec<false>(xv + i); },
        [&](int64_t, const Vec<T, V>& v) {
          A a[V];
          widen(v.v, a);
          add_shifted(s, a, shift);
        });
    group_sums<2>(s, kThreads, red);
    if (threadIdx.x == 0) {
      ws.partials[2 * (set * cp.chunks + j)] = s[0];
      ws.partials[2 * (set * cp.chunks + j) + 1] = s[1];
    }
    if (arrive_last(ws.counters, set, cp.chunks)) close_set(p, cp, ws, set, shift);
    return;
  }
  const int64_t lo = j * cp.chunk, hi = min(lo + cp.chunk, cp.set_len);
  const int64_t run0 = lo / cp.spatial;
  wait_flag(ws.counters, cp.sets, set);
  chunk_params(p, cp, set, lo, hi, coef);
  chunk_coefficients(cp, ws, set, lo, hi, coef);
  __syncthreads();
  Vec<T, V>* yv = reinterpret_cast<Vec<T, V>*>(static_cast<T*>(p.y) + set * cp.set_len);
  const uint32_t spatial = uint32_t(cp.spatial), first = uint32_t(run0);
  strided_batches<kApplyVectors>(
      lo / V + threadIdx.x, int64_t(kThreads), hi / V, [&](int64_t i) { return load_vec<true>(xv + i); },
      [&](int64_t i, const Vec<T, V>& v) {
        const uint32_t r = uint32_t(i) * V / spatial - first;
        store_vec<true>(yv + i, normalize_vec<kAct>(v, coef, r));  // evict-first: L2 keeps x for the outputs to come
      });
}

// The held chain: a ticket is a chunk of a set, whose block copies it on chip (kHeldRegs vectors a thread in
// registers, kHeldSmem in shared memory), takes its partial sums, waits for the set's flag and writes its
// output from what it holds: x is read once whatever L2 keeps. H100, KernelBench's GroupNorm 112x64x512x512
// fp32 (8 MB sets): 6.65 -> 6.01 ms (75 -> 83% of copy); chunks held in shared memory alone (8 vectors a
// thread, 6 blocks an SM) 7.37 ms, registers and 8 in shared memory 6.09: what counts is the bytes held an
// SM (here 320 KB). Polling the flag every 30-1500 ns instead of 100: level or slower. The chunk's weights
// and biases loaded before the wait (chunk_params), not after the flag: 6.135 -> 6.093 ms, bf16 3.075 -> 3.034
// (back-to-back calls, no L2 flush). A block waits holding its chunk, so a set's chunks must all be held at
// once: the plan takes it only where a set's chunks are at most half the blocks the device holds (tickets go
// in start order, so the blocks that wait hold the earliest unfinished set's chunks, and its last chunk
// always finds a block).
template <typename T, int kAct, typename A = typename AccOf<T>::type>
__global__ void __launch_bounds__(kThreads, 4) held_chain_kernel(FamilyParams p, ChainPlan cp, ChainWorkspace<A> ws) {
  constexpr int V = 16 / sizeof(T), kRegs = kHeldRegs, kSmem = kHeldSmem;
  constexpr int kRuns = kThreads * (kRegs + kSmem) * V / kLongRow + 2;  // channels a chunk may span
  using Vt = Vec<T, V>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  Vt* held = reinterpret_cast<Vt*>(dyn_smem);  // vector (m, thread) at m * kThreads + thread
  __shared__ A red[2 * 32];
  __shared__ A coef[3][kRuns];
  const int64_t k = take_ticket(ws.counters);
  const int64_t set = k / cp.chunks, j = k % cp.chunks;
  const T* x = static_cast<const T*>(p.x) + set * cp.set_len;
  const int64_t lo = j * cp.chunk, hi = min(lo + cp.chunk, cp.set_len);
  const Vt* xv = reinterpret_cast<const Vt*>(x) + lo / V;
  const int nv = int((hi - lo) / V), t = threadIdx.x;
#pragma unroll
  for (int m = 0; m < kSmem; ++m) {
    const int i = (kRegs + m) * kThreads + t;
    if (i < nv) cp_async<int(sizeof(Vt)), false>(held + m * kThreads + t, xv + i);
  }
  cp_async_commit();
  chunk_params(p, cp, set, lo, hi, coef);
  Vt regs[kRegs];
#pragma unroll
  for (int m = 0; m < kRegs; ++m) {
    const int i = m * kThreads + t;
    if (i < nv) regs[m] = load_vec<false>(xv + i);
  }
  const A shift = to_acc(x[0]);  // sums about the set's first value: exact enough at x + 1000
  A s[2] = {A(0), A(0)};
  auto add = [&](const Vt& v) {
    A a[V];
    widen(v.v, a);
    add_shifted(s, a, shift);
  };
#pragma unroll
  for (int m = 0; m < kRegs; ++m) {
    if (m * kThreads + t < nv) add(regs[m]);
  }
  cp_async_wait_all();  // each thread reads back only its own copies: no barrier
#pragma unroll 4
  for (int m = 0; m < kSmem; ++m) {
    if ((kRegs + m) * kThreads + t < nv) add(held[m * kThreads + t]);
  }
  group_sums<2>(s, kThreads, red);
  if (t == 0) {
    ws.partials[2 * (set * cp.chunks + j)] = s[0];
    ws.partials[2 * (set * cp.chunks + j) + 1] = s[1];
  }
  if (arrive_last(ws.counters, set, cp.chunks)) close_set(p, cp, ws, set, shift);
  wait_flag(ws.counters, cp.sets, set);
  chunk_coefficients(cp, ws, set, lo, hi, coef);
  __syncthreads();
  Vt* yv = reinterpret_cast<Vt*>(static_cast<T*>(p.y) + set * cp.set_len + lo);
  const uint32_t spatial = uint32_t(cp.spatial), first = uint32_t(lo % cp.spatial);
  auto out = [&](int i, const Vt& v) {
    store_vec<false>(yv + i, normalize_vec<kAct>(v, coef, (first + uint32_t(i) * V) / spatial));
  };
  each_held<kThreads, kRegs, kSmem>(regs, held, t, nv, out);
}

static inline size_t held_chain_smem() { return size_t(kHeldSmem) * kThreads * 16; }

// Whether a set of `chunks` held chunks fits the held chain: at most half the blocks the device holds.
template <typename T>
static inline bool held_chain_fits(int64_t chunks) {
  if constexpr (sizeof(T) == 8) {
    return false;  // float64's registers would spill
  } else {
    static const bool allowed = (allow_smem(held_chain_kernel<T, FN_ACT_NONE>),  // over 48 KB: asked once
                                 allow_smem(held_chain_kernel<T, FN_ACT_SILU>), true);
    (void)allowed;
    const int per_sm =
        blocks_per_sm(reinterpret_cast<const void*>(held_chain_kernel<T, FN_ACT_NONE>), kThreads, held_chain_smem());
    return per_sm > 0 && 2 * chunks <= int64_t(per_sm) * device_info().sms;
  }
}

template <typename T>
static const char* run_chain(const FamilyParams& p, const ChainPlan& cp, cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  if (p.workspace_bytes < chain_workspace_bytes(cp, sizeof(A))) return "family workspace too small";
  const ChainWorkspace<A> ws = chain_workspace<A>(p, cp);
  clear_chain_counters(ws.counters, cp.sets, stream);
#ifdef FASTNORM_WANT_GROUP_HELD
  if constexpr (sizeof(T) < 8) {
    if (cp.held) {
      const unsigned blocks = unsigned(cp.sets * cp.chunks);
      if (p.activation == FN_ACT_SILU) {
        held_chain_kernel<T, FN_ACT_SILU><<<blocks, kThreads, held_chain_smem(), stream>>>(p, cp, ws);
      } else {
        held_chain_kernel<T, FN_ACT_NONE><<<blocks, kThreads, held_chain_smem(), stream>>>(p, cp, ws);
      }
      return launch_result(cudaGetLastError());
    }
  }
#endif
#ifdef FASTNORM_WANT_GROUP_CHAIN
  const unsigned blocks = unsigned(2 * cp.sets * cp.chunks);
  if (p.activation == FN_ACT_SILU) {
    chain_kernel<T, FN_ACT_SILU><<<blocks, kThreads, 0, stream>>>(p, cp, ws);
  } else {
    chain_kernel<T, FN_ACT_NONE><<<blocks, kThreads, 0, stream>>>(p, cp, ws);
  }
  return launch_result(cudaGetLastError());
#else
  return FASTNORM_NOT_BUILT;
#endif
}

}  // namespace chain
}  // namespace family
}  // namespace fastnorm
