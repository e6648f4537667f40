// The held rows kernel: LayerNorm rows of 3-8 MB, a chunk of 80 KB a block, each chunk held on chip from
// its statistics to its output, so x is read once; its plan and launcher.
//
// It is the family's held chain (family_chain_kernel.cuh) for rows: blocks take tickets in the order they
// start (ticket_chain.cuh), a ticket is chunk j of row r, the block copies its chunk on chip (kHeldRowRegs
// vectors a thread in registers, kHeldRowSmem in shared memory: 4 blocks, 320 KB an SM), writes its partial
// moments, and waits for the row's flag, which the row's last block raises once it has added the partials.
// Rows are independent, so the blocks of the next rows load while a row's last chunks finish: its critical
// path (two block reductions, the arrivals, the flag) is hidden behind their traffic, where the resident
// kernel (resident_kernel.cuh) has the whole chip wait at each row's grid barrier and the split kernel
// reads x twice. Parameters are not held: the output reads each chunk's weight and bias with an evict-last
// hint (x and y stream evict-first), from L2 across rows where it keeps them.
// H200, same process (benchmarks/results/h200-held-rows.txt), us against the old routing: LayerNorm fp32
// 100x786432 (3 MB) 259 -> 226, 64x1000000 251 -> 189, 64x1048576 232 -> 199, 40x1572864 214 -> 191,
// 32x2000000 213 -> 209; bf16 32x2097152 137 -> 127, 24x3000000 147 -> 135; fp16 32x2097152 145 -> 129.
// Where it lost: rows of 16 MB, whose parameters (32 MB in fp32) the resident kernel keeps in shared memory
// and this one re-reads every row (fp32 16x4194304 227 -> 318, 200x4194304 2628 -> 3726); rows of 2 MB (the
// split kernel: fp32 128x524288 188 -> 195); RMSNorm, mixed (fp32 64x1048576 215 -> 180 but 40x1572864 168
// -> 173, bf16 64x1572864 132 -> 146). Prefetching the chunk's parameters into L2 while it waits cost 1-15%.
// A block waits holding its chunk, so a row's chunks must all be held at once: the plan takes a call only
// where a row's chunks are at most half the blocks the device holds (tickets go in start order, so the
// blocks that wait hold the earliest unfinished row's chunks, and its last chunk always finds a block).
#pragma once
#include "cuda_launch.cuh"
#include "cuda_rows.cuh"
#include "ticket_chain.cuh"

namespace fastnorm {

constexpr int kHeldRowThreads = 256, kHeldRowRegs = 8, kHeldRowSmem = 12;
constexpr int kHeldRowChunk = kHeldRowThreads * (kHeldRowRegs + kHeldRowSmem);  // vectors a chunk
constexpr int64_t kHeldRowLeastBytes = 3 << 20, kHeldRowMostBytes = 8 << 20;  // rows of [least, most)
constexpr int64_t kHeldRowForcedBytes = 1 << 20;  // FASTNORM_HELD_ROWS=2: any row from here up that fits

// Workspace: the chain's counters (ticket, per row arrivals and flag; zeroed by the launcher), each chunk's
// partial moments about its row's shift (double), each row's affine map (center, offset, rstd).
template <typename A>
struct HeldRowsWorkspace {
  unsigned* counters;
  double* partials;
  A* maps;
};

static inline int64_t held_rows_workspace_bytes(int64_t rows, int64_t chunks, int64_t acc_size) {
  return align16(chain_counter_bytes(rows)) + align16(rows * chunks * 2 * 8) + rows * 3 * acc_size;
}

template <typename A>
static inline HeldRowsWorkspace<A> held_rows_workspace(void* base, int64_t rows, int64_t chunks) {
  char* c = static_cast<char*>(base);
  HeldRowsWorkspace<A> ws;
  ws.counters = reinterpret_cast<unsigned*>(c);
  c += align16(chain_counter_bytes(rows));
  ws.partials = reinterpret_cast<double*>(c);
  ws.maps = reinterpret_cast<A*>(c + align16(rows * chunks * 2 * 8));
  return ws;
}

// The row's last block: the partials added in double in chunk order (results repeat bit for bit), the
// row's affine map published (and saved for a backward where asked), its flag raised.
template <typename T, typename W, typename A>
__device__ __forceinline__ void close_held_row(const RowArgs<T, W>& a, int64_t chunks, const HeldRowsWorkspace<A>& ws,
                                               int64_t row, A shift, double* red) {
  double d[2] = {0.0, 0.0};
  for (int64_t c = threadIdx.x; c < chunks; c += kHeldRowThreads) {
    d[0] += __ldcg(ws.partials + 2 * (row * chunks + c));
    d[1] += __ldcg(ws.partials + 2 * (row * chunks + c) + 1);
  }
  group_sums<2>(d, kHeldRowThreads, red);
  if (threadIdx.x == 0) {
    const double mean_rel = d[0] / double(a.n), mean_sq = d[1] / double(a.n);
    const double var = a.rms ? mean_sq : corrected_variance(mean_rel, mean_sq);
    const Affine<A> st = affine_of(shift, A(mean_rel), A(var), a.eps, a.rms);
    A* m = ws.maps + 3 * row;
    m[0] = st.center, m[1] = st.offset, m[2] = st.rstd;
    if (a.stats) save_affine(a.stats, row, st);
    raise_flag(ws.counters, a.rows, row);
  }
}

template <typename T, typename W, int VEC>
__global__ void __launch_bounds__(kHeldRowThreads, 4)
    held_rows_kernel(RowArgs<T, W> a, int64_t chunks, HeldRowsWorkspace<typename AccOf<T>::type> ws) {
  using A = typename AccOf<T>::type;
  using V = Vec<T, VEC>;
  constexpr int kRegs = kHeldRowRegs, kSmem = kHeldRowSmem;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  V* held = reinterpret_cast<V*>(dyn_smem);  // vector (m, thread) at m * kHeldRowThreads + thread
  __shared__ double red[2][2 * 32];          // two block reductions: alternate buffers (group_sums)
  const int t = threadIdx.x;
  const int64_t k = take_ticket(ws.counters);
  const int64_t row = k / chunks, j = k % chunks;
  const T* xr = a.x + row * a.x_stride;
  const int64_t lo = j * kHeldRowChunk, nvec = a.n / VEC;  // the chunk's first vector in the row
  const int nv = int(min(int64_t(kHeldRowChunk), nvec - lo));
  const V* xv = reinterpret_cast<const V*>(xr) + lo;
#pragma unroll
  for (int m = 0; m < kSmem; ++m) {
    const int i = (kRegs + m) * kHeldRowThreads + t;
    if (i < nv) cp_async<int(sizeof(V))>(held + m * kHeldRowThreads + t, xv + i);  // evict-first: read once
  }
  cp_async_commit();
  V regs[kRegs];
#pragma unroll
  for (int m = 0; m < kRegs; ++m) {
    const int i = m * kHeldRowThreads + t;
    if (i < nv) regs[m] = load_vec<true>(xv + i);
  }
  const bool rms = a.rms;
  const A shift = rms ? A(0) : A(to_acc(xr[0]));  // moments about the row's first value: exact at x + 1000
  // The thread's part: RMSNorm its sum of squares; LayerNorm its exact (count, mean, M2), two passes over
  // what it holds, as moments about the shift in double (see the resident kernel).
  int count = 0;
  A vals[VEC], s = A(0);
  auto each = [&](auto&& f) { each_held<kHeldRowThreads, kRegs, kSmem>(regs, held, t, nv, f); };
  cp_async_wait_all();  // each thread reads back only its own copies: no barrier
  double moments[2];
  if (rms) {
    each([&](int, const V& v) {
      widen(v.v, vals);
#pragma unroll
      for (int e = 0; e < VEC; ++e) s = fma(vals[e], vals[e], s);
    });
    moments[0] = 0.0, moments[1] = double(s);
  } else {
    each([&](int, const V& v) {
      widen(v.v, vals);
      ++count;
#pragma unroll
      for (int e = 0; e < VEC; ++e) s += vals[e] - shift;
    });
    const A mean = shift + (count > 0 ? s / A(count * VEC) : A(0));
    A m2 = A(0);
    each([&](int, const V& v) {
      widen(v.v, vals);
#pragma unroll
      for (int e = 0; e < VEC; ++e) m2 = fma(vals[e] - mean, vals[e] - mean, m2);
    });
    const double tn = double(count * VEC), d = double(mean) - double(shift);
    moments[0] = tn * d, moments[1] = double(m2) + tn * d * d;
  }
  group_sums<2>(moments, kHeldRowThreads, red[0]);
  if (t == 0) {
    ws.partials[2 * (row * chunks + j)] = moments[0];
    ws.partials[2 * (row * chunks + j) + 1] = moments[1];
  }
  const W* w = a.w ? a.w + lo * VEC : nullptr;
  const W* b = a.b ? a.b + lo * VEC : nullptr;
  if (arrive_last(ws.counters, row, chunks)) close_held_row(a, chunks, ws, row, shift, red[1]);
  wait_flag(ws.counters, a.rows, row);
  const A* map = ws.maps + 3 * row;
  const Affine<A> st{__ldcg(map), __ldcg(map + 1), __ldcg(map + 2)};
  V* yv = reinterpret_cast<V*>(a.y + row * a.n) + lo;
  auto out = [&](int i, const V& v) {
    store_vec<true>(yv + i, normalize_vec<true>(v, st, w, b, int64_t(i) * VEC));
  };
  each(out);
}

static inline size_t held_rows_smem() { return size_t(kHeldRowSmem) * kHeldRowThreads * 16; }

// Blocks of the held rows kernel an SM holds, from the device's shared memory (its static arrays and the
// 1 KB the driver keeps a block: under 2 KB); its launch bounds keep registers within 4 blocks. The
// launcher checks it against the occupancy API: the workspace is sized by this rule (forward.cu), which
// must not need the kernel of each dtype.
static inline int held_rows_per_sm(const Device& dev) {
  const int by_smem = int(dev.smem_per_sm / int64_t(held_rows_smem() + (2 << 10)));
  return by_smem < 4 ? by_smem : 4;
}

// A row's chunks where the held rows kernel takes the call, else 0: LayerNorm rows of 16-byte vectors (`vec`
// elements; not float64, whose registers would spill) of kHeldRowLeastBytes to kHeldRowMostBytes, a row's
// chunks at most half the blocks the device holds, and at least a wave of blocks in all (fewer rows go to the
// resident and streamed kernels, which spread a row over the chip). FASTNORM_HELD_ROWS (read at each call,
// for tests and A/B runs): 0 off, 2 any row of kHeldRowForcedBytes up that fits, RMSNorm too.
static inline int64_t held_rows_chunks(const NormParams& p, const Device& dev, int vec) {
  const int64_t row_bytes = p.n * elem_size(p.dtype), mode = env_int("FASTNORM_HELD_ROWS", 1);
  const bool window = row_bytes >= kHeldRowLeastBytes && row_bytes < kHeldRowMostBytes;
  if (vec == 1 || p.dtype == FN_F64 || p.blocks_per_row > 0 || p.threads > 0 || mode == 0) return 0;
  if (!(mode == 2 ? row_bytes >= kHeldRowForcedBytes : window && !p.rms)) return 0;
  const int64_t chunks = (p.n / vec + kHeldRowChunk - 1) / kHeldRowChunk, slots = int64_t(held_rows_per_sm(dev)) * dev.sms;
  const bool fits = slots > 0 && 2 * chunks <= slots && p.outer * chunks >= slots && p.outer * chunks < (int64_t(1) << 31);
  return fits ? chunks : 0;
}

template <typename T, typename W, int VEC>
static inline const char* launch_held_rows(const NormParams& p, int64_t chunks, cudaStream_t stream) {
  using A = typename AccOf<T>::type;
  if (p.workspace == nullptr || p.workspace_bytes < held_rows_workspace_bytes(p.outer, chunks, sizeof(A))) {
    return "held-rows workspace missing or too small";
  }
  static const bool allowed = (allow_smem(held_rows_kernel<T, W, VEC>), true);  // over 48 KB: asked once
  (void)allowed;
  const void* kernel = reinterpret_cast<const void*>(held_rows_kernel<T, W, VEC>);
  if (blocks_per_sm(kernel, kHeldRowThreads, held_rows_smem()) < held_rows_per_sm(device_info())) {
    return "held-rows kernel: fewer blocks an SM than planned";  // its waits could deadlock: never launch it so
  }
  const HeldRowsWorkspace<A> ws = held_rows_workspace<A>(p.workspace, p.outer, chunks);
  clear_chain_counters(ws.counters, p.outer, stream);
  RowArgs<T, W> a = row_args<T, W>(p, kHeldRowThreads);
  held_rows_kernel<T, W, VEC><<<unsigned(p.outer * chunks), kHeldRowThreads, held_rows_smem(), stream>>>(a, chunks, ws);
  return launch_result(cudaGetLastError());
}

}  // namespace fastnorm
