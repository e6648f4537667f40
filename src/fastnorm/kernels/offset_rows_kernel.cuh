// The kernels of the rows the vector kernels cannot take: odd n, or row starts off a 16-byte boundary
// (100000x257, x[:, 1:]). Three, by row length and call size (offset_rows_chunked says which):
//
// Chunked rows (offset_rows_kernel), rows of 1025 and more, and calls whose rows have 128+ elements
// of at most 24 MB (8-byte types, float32 rows of 641+) or fewer than 16 rows an SM (2-byte types) or
// than SMs (float32 rows of up to 640): a group of `tpr` threads a row (4-512, a power of two), the row in
// registers.
// Loads and stores stay 16 bytes wide at any offset: the group works in the aligned 16-byte chunks
// of y that cover the row, the first and last partly outside it (bytes of the same 16-byte granule
// as the row's own, so inside its allocation), and masks the elements outside. Where x's rows start
// at y's offsets (x contiguous) a chunk of y is a chunk of x; otherwise (a view such as x[:, 1:]) it
// is read as the two chunks of x that hold its elements, realigned in registers. A row's offsets
// repeat every VEC rows, so a block takes the rows of one residue modulo VEC, all at one offset, and
// keeps the weight and bias of their chunks in shared memory, gathered once: the output loop reads
// them as 16-byte vectors. The grid is what the SMs hold (then grid-stride), so that gathering is
// paid once a block. Before it, rows of 1025+ took the row kernel's scalar path (H100: fp32 834x1429
// LN 12.7 us against Liger's 7.9, bf16 11231x1997 LN 122.9 -> 49.2 us with it) and fp32 4096x771 LN
// 26.1 us (-> 15.1).
//
// Warp rows (warp_rows_kernel), the other rows of 32-1024: a warp a row (rows of up to 224 elements:
// 2-8 rows at once), the rows in registers: lane l holds elements l, l + 32, ... (each load instruction
// of the warp reads consecutive elements, so plain scalar loads coalesce), all of its loads in flight
// before the first use, and the statistics meet in warp shuffles. On large calls of short rows it was
// faster than the chunked kernel (bf16 100000x257 LN 67 against 80 us; fp32 248320x59, x misaligned,
// 56 against 111; benchmarks/NOTES.md).
//
// Rows of fewer than 32 elements (1000000x1, 500000x7): a thread a row (thread_rows_kernel below).
//
// The strided-row kernel (strided_rows_kernel.cuh, the same family) takes some rows of 1025-16384 before
// these: latency-bound calls, and float16 calls of many rows.
#pragma once
#include <cstdlib>

#include "cuda_rows.cuh"

namespace fastnorm {

constexpr int kOffsetRowMaxThreads = 512;  // threads a row, at most
constexpr int kOffsetRowBlock = 256;       // threads a block of narrower groups
// Chunks (16 bytes, as loaded: widened at each use) a thread holds, at most.
constexpr int kOffsetRowMaxK = 4;
// Rows longer than 512 threads of kOffsetRowMaxK chunks, bfloat16 only (one block an SM; H100, against the
// row kernel's scalar path: bf16 1024x30001 LN 128.5 -> 93.2 us, 162x19257 28.1 -> 24.8, 400x25000 at an
// offset level; fp32 2000x12001 at an offset 20% slower; float16 spilled).
constexpr int kOffsetRowWideK = 8;
template <typename T>
constexpr int kOffsetRowTopK = std::is_same<T, __nv_bfloat16>::value ? kOffsetRowWideK : kOffsetRowMaxK;

// K: chunks a thread holds (tpr * K chunks cover the row at any offset). The chunks are y's: chunk c
// holds the row's elements c * VEC - off_y ... Block b takes the rows b % VEC + VEC * s for its slots s,
// which share x's offset and y's. With kShifted (x's rows start at other offsets in their 16 bytes
// than y's: x a view such as x[:, 1:]), each chunk is read as the two chunks of x that hold its
// elements, realigned in registers (the neighbour's chunk comes from L1: the warp's loads of chunk
// c + 1 touch the lines of its loads of c); without it x's rows start where y's do. Shared memory: the
// weight and bias of each chunk ([2][chunks] ParamVec, one more each for the realignment of vectors).
// Registers: at most 64 (two blocks of 512 or four of 256 an SM; at 68 the fp32 rows of 5818 ran 1.45x
// slower, one block an SM), but where that spills: K = 4 with float16 x (its conversions), float64 x or
// 2-byte x and float32 weights (a chunk of weights twice as wide), and K = 8 (rows of up to 4096
// chunks: 512 threads, one block an SM). The realigned loads fit in the same registers.
template <typename T, typename W, int K>
constexpr int kOffsetRowMinBlocks =
    K >= 8 || (K == 4 && (std::is_same<T, __half>::value || sizeof(T) == 8 || (sizeof(T) == 2 && sizeof(W) == 4))) ? 1 : 2;

struct Pair16 {
  uint4 w, b;
};

template <typename T, typename W, int K, bool kShifted>
__global__ void __launch_bounds__(kOffsetRowMaxThreads, (kOffsetRowMinBlocks<T, W, K>)) offset_rows_kernel(RowArgs<T, W> a, int vec_params) {
  using A = typename AccOf<T>::type;
  constexpr int VEC = 16 / int(sizeof(T));
  using V = Vec<T, VEC>;
  using PV = ParamVec<W, VEC>;
  extern __shared__ __align__(16) unsigned char dyn_smem[];
  __shared__ A sums[2][32];
  int buf = 0;
  const int tpr = a.tpr, sh = __ffs(tpr) - 1;
  const int groups = blockDim.x >> sh;
  const int group = threadIdx.x >> sh, t = threadIdx.x & (tpr - 1);
  const int n = int(a.n);
  const A inv_n = A(1) / A(n);
  const bool rms = a.rms;
  const int residue = int(blockIdx.x % VEC);
  const int off_y = int((reinterpret_cast<uintptr_t>(a.y + residue * a.n) & 15) / sizeof(T));
  const int off = kShifted ? int((reinterpret_cast<uintptr_t>(a.x + residue * a.x_stride) & 15) / sizeof(T)) : off_y;
  const int chunks = (off_y + n + VEC - 1) / VEC, chunks_x = (off + n + VEC - 1) / VEC;
  // y's chunk c starts in x's chunk c + lo_c, shift_b bytes in.
  const int lo_c = off < off_y ? -1 : 0;
  const int shift_b = (off - off_y - lo_c * VEC) * int(sizeof(T));
  // Loads the chunks of the group's row in the slot: zeros past the row's chunks, so sums need no row check.
  auto load_slot = [&](int64_t slot, V (&raw)[K]) {
    const int64_t row = residue + VEC * (slot + group);
    const bool active = row < a.rows;
    const V* xc = reinterpret_cast<const V*>(reinterpret_cast<uintptr_t>(a.x + (active ? row : 0) * a.x_stride) &
                                             ~uintptr_t(15));
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = t + k * tpr;
      if (active && c < chunks) {
        if constexpr (kShifted) {
          // Only x's own chunks are read (any chunk holding an element of the row is one of them).
          const int cx = c + lo_c;
          const uint4 zero = make_uint4(0, 0, 0, 0);
          const uint4 lo = cx >= 0 ? *reinterpret_cast<const uint4*>(xc + cx) : zero;
          const uint4 hi = shift_b != 0 && cx + 1 < chunks_x ? *reinterpret_cast<const uint4*>(xc + cx + 1) : zero;
          const uint4 r = realigned(lo, hi, shift_b);
          raw[k] = *reinterpret_cast<const V*>(&r);
        } else {
          raw[k] = load_vec<false>(xc + c);
        }
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) raw[k].v[e] = from_acc<T>(A(0));
      }
    }
  };
  // The first slot's loads go out before the parameters come in: a block of one slot (a small call)
  // waits for one round trip to DRAM, not two.
  const int64_t first_slot = int64_t(blockIdx.x / VEC) * groups;
  V raw[K];
  load_slot(first_slot, raw);
  constexpr bool kVecParams = sizeof(W) == sizeof(T);
  PV* wc = reinterpret_cast<PV*>(dyn_smem);  // chunk c's weights in wc[c], its bias in bc[c]
  PV* bc = wc + chunks + (kVecParams && vec_params ? 1 : 0);
  if (kVecParams && vec_params) {
    // Parameters of x's size, 16-byte aligned: their own vectors are copied (one round trip; gathered
    // element by element, a block of a 3378-element fp32 row waited for 7 in turn), vector v into slot
    // v + 1 where y's chunks start off_y elements before a vector, then realigned in place, a round of
    // blockDim chunks at a time: chunk c from slots c and c + 1 into slot c.
    const int last = (n - 1) / VEC, lead = off_y ? 1 : 0;
    strided_batches<2>(int(threadIdx.x), int(blockDim.x), chunks, [&](int v) {
      const uint4 zero = make_uint4(0, 0, 0, 0);
      Pair16 pair{zero, zero};
      if (v <= last && a.w) pair.w = *reinterpret_cast<const uint4*>(a.w + v * VEC);
      if (v <= last && a.b) pair.b = *reinterpret_cast<const uint4*>(a.b + v * VEC);
      return pair;
    }, [&](int v, const Pair16& pair) {
      *reinterpret_cast<uint4*>(wc + v + lead) = pair.w;
      *reinterpret_cast<uint4*>(bc + v + lead) = pair.b;
    });
    if (lead) {
      if (threadIdx.x == 0) {  // vector -1: elements before the row, never stored
        *reinterpret_cast<uint4*>(wc) = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(bc) = make_uint4(0, 0, 0, 0);
      }
      const int shift_p = (VEC - off_y) * int(sizeof(T));
      for (int base = 0; base < chunks; base += blockDim.x) {
        __syncthreads();
        const int c = base + int(threadIdx.x);
        uint4 w, b;
        if (c < chunks) {
          w = realigned(*reinterpret_cast<const uint4*>(wc + c), *reinterpret_cast<const uint4*>(wc + c + 1), shift_p);
          b = realigned(*reinterpret_cast<const uint4*>(bc + c), *reinterpret_cast<const uint4*>(bc + c + 1), shift_p);
        }
        __syncthreads();
        if (c < chunks) {
          *reinterpret_cast<uint4*>(wc + c) = w;
          *reinterpret_cast<uint4*>(bc + c) = b;
        }
      }
    }
  } else {
    // Element by element (consecutive threads, consecutive elements), already realigned.
#pragma unroll 4
    for (int i = threadIdx.x; i < chunks * VEC; i += blockDim.x) {
      const int j = i - off_y;
      const int in = j >= 0 && j < n ? j : 0;  // elements outside the row: any value, never stored
      if (a.w) wc[i / VEC].v[i % VEC] = a.w[in];
      if (a.b) bc[i / VEC].v[i % VEC] = a.b[in];
    }
  }
  __syncthreads();
  const int64_t slot_step = int64_t(gridDim.x / VEC) * groups;
  for (int64_t slot = first_slot; residue + VEC * slot < a.rows; slot += slot_step) {
    const int64_t row = residue + VEC * (slot + group);
    const bool active = row < a.rows;
    const T* xr = a.x + (active ? row : 0) * a.x_stride;
    const A shift = rms || !active ? A(0) : A(to_acc(xr[0]));
    A total[1] = {A(0)};
#pragma unroll
    for (int k = 0; k < K; ++k) {
      A v[VEC];
      widen(raw[k].v, v);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const int j = (t + k * tpr) * VEC + e - off_y;
        const A d = v[e] - shift;
        if (j >= 0 && j < n) total[0] = rms ? fma(d, d, total[0]) : total[0] + d;
      }
    }
    group_sums(total, tpr, sums[buf]);
    buf ^= 1;
    Affine<A> st;
    if (rms) {
      st = affine_of(A(0), A(0), total[0] * inv_n, a.eps, true);
    } else {
      const A mean_rel = total[0] * inv_n;
      A q[1] = {A(0)};
#pragma unroll
      for (int k = 0; k < K; ++k) {
        A v[VEC];
        widen(raw[k].v, v);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int j = (t + k * tpr) * VEC + e - off_y;
          const A d = (v[e] - shift) - mean_rel;
          if (j >= 0 && j < n) q[0] = fma(d, d, q[0]);
        }
      }
      group_sums(q, tpr, sums[buf]);
      buf ^= 1;
      st = affine_of(shift, mean_rel, q[0] * inv_n, a.eps, false);
    }
    if (active && a.stats && t == 0) save_affine(a.stats, row, st);
    T* yr = a.y + (active ? row : 0) * int64_t(n);
    V* yc = reinterpret_cast<V*>(reinterpret_cast<uintptr_t>(yr) & ~uintptr_t(15));
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = t + k * tpr;
      if (!active || c >= chunks) continue;
      A v[VEC], wv[VEC], bv[VEC];
      widen(raw[k].v, v);
      if (a.w) {
        widen(wc[c].v, wv);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) wv[e] = A(1);
      }
      if (a.b) {
        widen(bc[c].v, bv);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) bv[e] = A(0);
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) v[e] = fma(normalized(v[e], st), wv[e], bv[e]);
      const V y = pack<T>(v);
      const int j0 = c * VEC - off_y;
      if (j0 >= 0 && j0 + VEC <= n) {
        store_vec<false>(yc + c, y);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if (j0 + e >= 0 && j0 + e < n) yr[j0 + e] = y.v[e];
        }
      }
    }
    if (residue + VEC * (slot + slot_step) < a.rows) load_slot(slot + slot_step, raw);
  }
}

// The warp-row kernel (see the top of the file).
constexpr int kWarpRowThreads = 256;
constexpr int kWarpRowMaxK = 32;  // elements a lane holds: rows of up to 32 x 32 = 1024 elements
// Whether the warp-row kernel of K elements a lane holds the parameters of its columns for all its rows (loaded
// once a warp): 2-byte rows, and rows of up to 4 elements a lane (several rows a warp at once). Loaded for each row
// after its statistics, they cost a round trip and 2 loads and conversions an element a row, and the kernel was
// bound by instruction issue (ncu, bf16 197805x256 at an offset: issue slots 84% busy, ~300 warp instructions a
// row; torch.compile's Triton kernel 40%). H200, us, against loading them each row (same device, other runs): bf16
// 197805x256 at an offset RMS 74.1 -> 66.6, 100000x257 LN 55.0 -> 43.7, 100000x33 14.9 -> 13.0, fp16 21309x257 RMS
// 14.9 -> 12.4, 200000x129 LN 57.0 -> 47.9, fp32 669317x32 at an offset LN 55.8 -> 48.7. Small calls lost half a
// microsecond (fp16 372x94 LN 4.45 -> 5.06, 11897x56 padded 5.54 -> 6.05): the x loads wait for the parameters'
// conversions. 4-byte rows of 5+ a lane keep loading them each row (kWarpRowParamBatch columns at a time): their
// registers cost occupancy (K = 10: 56 registers, 4 blocks of 256 an SM against 6) and large calls lost (fp32
// 272747x257 RMS 137 -> 159), though small ones gained (4713x257 8.0 -> 7.6; with the batches, holding them only in
// calls of a wave: +-4%, session 44).
template <typename T>
constexpr bool warp_rows_hoisted(int k) {
  return sizeof(T) == 2 || k <= 4;
}

// Columns whose parameters the kernels that do not hold them load together after a row's statistics, before
// the row's stores of those columns. Loaded beside each store, a load could not pass the store before it (y may
// alias them: nvcc kept the order) and a row of K elements a lane paid K round trips in turn. H200, float32, us,
// same process, against a column at a time (results/h200-warp-row-batches.txt): RMS 4713x257 8.06 -> 6.91,
// 16654x270 15.84 -> 14.82, 54687x205 29.9 -> 29.4, 100000x257 58.3 -> 57.5, LN 6000x600 at an offset 16.4 -> 13.3;
// all K columns at once held more registers (K = 10: 56 against 46 at 4, 40 at 1) and lost on large calls (RMS
// 272747x257 147 -> 153). Float64 keeps a column at a time (unmeasured).
template <typename T>
constexpr int kWarpRowParamBatch = sizeof(T) == 8 ? 1 : 4;

// Waves of resident blocks a call of hoisting instances (launch_warp_rows), then grid-stride: a warp's parameters
// (loaded once) serve its rows. H200, us, one wave against two / a block for every rows_per_block rows: bf16
// 3000x513 at an offset 8.10 / 9.22 / 9.22, fp16 21309x257 RMS 12.4 / 13.1 / 15.0, 197805x256 at an offset RMS
// 66.6 / 67.7 / 86.9, fp32 65536x1000 at an offset LN 156.5 / 157.6 / 200.6; fp16 1000000x64 at an offset, padded
// LN 135.5 / 130.6 / 146.8.
constexpr int64_t kWarpRowWaves = 1;

// Elements a lane holds a row (n <= 32 * K), in steps of at most a quarter: K rounded up to a power of two
// held 16 a lane for rows of 257 (9 used), 63 registers, 4 blocks an SM (bf16 100000x257 LN 64.7 us,
// 54.0 at K = 10; H100).
constexpr int kWarpRowKs[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32};
constexpr int kWarpRowKCount = int(sizeof(kWarpRowKs) / sizeof(int));

// Rows a warp takes at once: about 8 elements a lane, all loaded before the first use. One row at a time,
// a warp of 32-element fp32 rows had one 128-byte load in flight (669317x32 LN at 60% of copy: 94.6 us,
// 77.9 with 8 rows; 394263x58 at an offset 84.0 -> 72.2; H100).
constexpr int warp_rows_at_once(int k) { return k >= 8 ? 1 : (8 + k - 1) / k; }

// Rows of 32-48 elements take a group of L lanes each, 32 / L rows side by side in a warp: with a whole
// warp a row, each row paid two 5-level shuffle trees of its own and the kernel was bound by instruction
// issue; a group's trees have 3-4 levels, each serving 32 / L rows at once. H200, against a warp a row
// (results/h200-warp-row-lanes.txt): 32 elements on 8 lanes (4 a lane), fp32 669317x32 at an offset LN
// 74.3 -> 54.6 us, RMS 60.4 -> 52.5 (torch.compile 44.6); 33-48 on 16 (3 a lane, 6 rows a warp at once
// instead of 4), bf16 100000x33 LN 18.0 -> 14.9, 300000x48 RMS 35.2 -> 30.3. Rows of 49-64 on 16 lanes
// (4 a lane: 72 registers, 4 rows at once, as on a warp) lost 4-7% (fp32 394263x58 LN 61.2 -> 63.7, fp16
// 1000000x64 RMS 106.5 -> 114.5), but 2-byte rows of 49-64 on 8 lanes (8 a lane, parameters held: 72
// registers) gained (H200, same process, against a warp a row: fp16 1000000x64 at an offset, padded, LN 136.1
// -> 110.0 us, RMS 101.5 -> 96.5; 200000x56 at an offset LN 31.3 -> 25.3, 11897x56 padded 5.98 -> 5.70; bf16
// 100000x63 LN 18.0 -> 16.1, 300000x49 at an offset RMS 33.5 -> 30.8); float32 rows of 49-64 keep a warp a
// row. FASTNORM_WARP_ROW_LANES=8, 16 or 32 (read at each call) forces a group size, for A/B runs.
constexpr int64_t kWarpRowEightLanesFrom = 49;
static inline int warp_row_lanes(int64_t n, int elem) {
  return n <= 32 ? 8 : n <= 48 ? 16 : elem == 2 && n >= kWarpRowEightLanesFrom ? 8 : 32;
}

// K: elements a lane holds of each of the R row slots it takes at once; L lanes a row (a power of two,
// at most 32): lane l holds elements l % L, l % L + L, ... of row slot r's row l / L, so a warp takes
// R * 32 / L rows at once. LayerNorm's statistics are about each row's first element: sums of
// x - shift give the mean, then the centered sum of squares. kMinBlocks: blocks an SM the register budget is
// sized for (kWarpRowMoreBlocks: more).
constexpr int warp_rows_min_blocks(int k) { return k >= 24 ? 1 : 2; }
template <typename T, typename W, int K, int R, int L = 32, int kMinBlocks = warp_rows_min_blocks(K)>
__global__ void __launch_bounds__(kWarpRowThreads, kMinBlocks) warp_rows_kernel(RowArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  constexpr int G = 32 / L;  // rows side by side in a warp
  const int lane = threadIdx.x & 31, sub = lane & (L - 1), side = lane / L;
  const int warps_per_block = blockDim.x >> 5;
  const int n = int(a.n);
  const A inv_n = A(1) / A(n);
  const bool rms = a.rms;
  const int64_t step = int64_t(gridDim.x) * warps_per_block * R * G;
  // kHoist (warp_rows_hoisted): the parameters of the lane's columns loaded and converted once for all the rows
  // the warp takes, else loaded for each row after its statistics, kWarpRowParamBatch columns at a time.
  constexpr bool kHoist = warp_rows_hoisted<T>(K);
  A wv[kHoist ? K : 1], bv[kHoist ? K : 1];
  if constexpr (kHoist) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = sub + L * k < n ? sub + L * k : n - 1;
      wv[k] = a.w ? A(to_acc(a.w[j])) : A(1);
      bv[k] = a.b ? A(to_acc(a.b[j])) : A(0);
    }
  }
  // The loop runs by the warp's first row, so that every lane of the warp takes each shuffle.
  for (int64_t warp_first = (int64_t(blockIdx.x) * warps_per_block + (threadIdx.x >> 5)) * R * G; warp_first < a.rows;
       warp_first += step) {
    const int64_t first = warp_first + side;
    // The loads as they come (2-byte values too): all of them before the first conversion. A conversion
    // beside each guarded load made them wait in turn (fp16 1000000x64 LN: 223 against 137 us, H100).
    // One element a lane, or a group of lanes a row: unguarded, the index clamped into the row (fp32
    // 669317x32 LN 84.5 -> 77.9 us, H100); the sums and stores skip the clamped ones. (`first` is this
    // lane's row of slot 0; slot r's is first + r * G.)
    constexpr bool kClamp = K == 1 || L < 32;
    T raw[R][K];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool active = first + r * G < a.rows;
      const T* xr = a.x + (active ? first + r * G : warp_first) * a.x_stride;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int j = sub + L * k;
        if constexpr (kClamp) {
          raw[r][k] = xr[j < n ? j : n - 1];
        } else {
          raw[r][k] = active && j < n ? xr[j] : from_acc<T>(A(0));
        }
      }
    }
    A v[R][K];
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
      for (int k = 0; k < K; ++k) v[r][k] = A(to_acc(raw[r][k]));
    }
    A shift[R], s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      shift[r] = rms ? A(0) : __shfl_sync(0xffffffffu, v[r][0], 0, L);  // the group's first lane
      s[r] = A(0);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (sub + L * k < n) s[r] += rms ? v[r][k] * v[r][k] : v[r][k] - shift[r];
      }
    }
    group_sums(s, L, static_cast<A*>(nullptr));
    Affine<A> st[R];
    if (rms) {
#pragma unroll
      for (int r = 0; r < R; ++r) st[r] = affine_of(A(0), A(0), s[r] * inv_n, a.eps, true);
    } else {
      A q[R];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        q[r] = A(0);
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const A d = (v[r][k] - shift[r]) - s[r] * inv_n;
          if (sub + L * k < n) q[r] = fma(d, d, q[r]);
        }
      }
      group_sums(q, L, static_cast<A*>(nullptr));
#pragma unroll
      for (int r = 0; r < R; ++r) st[r] = affine_of(shift[r], s[r] * inv_n, q[r] * inv_n, a.eps, false);
    }
    if (a.stats && sub == 0) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (first + r * G < a.rows) save_affine(a.stats, first + r * G, st[r]);
      }
    }
    if constexpr (kHoist) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (first + r * G >= a.rows) continue;
        T* yr = a.y + (first + r * G) * int64_t(n);
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const int j = sub + L * k;
          if (j < n) yr[j] = from_acc<T>(fma(normalized(v[r][k], st[r]), wv[k], bv[k]));
        }
      }
    } else if constexpr (kWarpRowParamBatch<T> == 1) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int j = sub + L * k;
        if (j >= n) continue;
        const A w = a.w ? A(to_acc(a.w[j])) : A(1), b = a.b ? A(to_acc(a.b[j])) : A(0);  // serve the R rows
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (first + r * G < a.rows) a.y[(first + r * G) * int64_t(n) + j] = from_acc<T>(fma(normalized(v[r][k], st[r]), w, b));
        }
      }
    } else {
      constexpr int kBatch = kWarpRowParamBatch<T> < K ? kWarpRowParamBatch<T> : K;
#pragma unroll
      for (int k0 = 0; k0 < K; k0 += kBatch) {
        A w[kBatch], b[kBatch];
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int j = sub + L * (k0 + i);
          const bool in = k0 + i < K && j < n;
          w[i] = a.w && in ? A(to_acc(a.w[j])) : A(1);
          b[i] = a.b && in ? A(to_acc(a.b[j])) : A(0);
        }
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          const int j = sub + L * (k0 + i);
          if (k0 + i >= K || j >= n) continue;
#pragma unroll
          for (int r = 0; r < R; ++r) {
            if (first + r * G < a.rows)
              a.y[(first + r * G) * int64_t(n) + j] = from_acc<T>(fma(normalized(v[r][k0 + i], st[r]), w[i], b[i]));
          }
        }
      }
    }
  }
}

// Rows of fewer than 32 elements: a thread per row, the row in registers (K >= n), 128 rows a block.
// Thread t reads its row's elements one after another: the warp's loads of element j fall in the same
// few cache lines as its loads of element j - 1, which L1 keeps. Stores do not stay in L1, so the
// block's outputs meet in shared memory (its rows are contiguous in y) and leave in coalesced stores.
// (These rows took the row kernel before: 1000000x1 bf16 13.0 us against torch.compile's 5.8, H100.)
constexpr int kThreadRowThreads = 128;
// Rows of up to 31 elements (32 and more: the offset-row kernels); float64 up to 16 (31 doubles a thread
// spilled; its rows of 17-31 stay with the row kernel).
constexpr int kThreadRowMaxN(int elem_bytes) { return elem_bytes == 8 ? 16 : 31; }

// kEarly: the parameters in registers from the start, loaded before the first rows' x; a round trip less for
// small calls, but up to 166 registers a thread (K = 32), which costs large calls their occupancy. H200, us,
// without -> with (torch.compile): LN fp32 950x26 6.56 -> 5.28 (4.13), bf16 6609x15 5.25 -> 4.93 (4.77),
// fp32 20089x3 off2 4.13 -> 3.97, 86264x11 6.83 -> 6.66; but bf16 258797x12 off2 9.68 -> 10.78, RMS bf16
// 1000000x19 pad3 41.9 -> 54.6, LN fp32 500000x7 10.6 -> 11.4. So calls of up to 8 blocks an SM take it
// (674 blocks at 86264 rows, 2022 at 258797).
constexpr int64_t kThreadRowEarlyWaves = 8;

template <typename T, typename W, int K, bool kEarly = false>
__global__ void __launch_bounds__(kThreadRowThreads) thread_rows_kernel(RowArgs<T, W> a) {
  using A = typename AccOf<T>::type;
  __shared__ T tile[kThreadRowThreads * K];
  const int n = int(a.n);
  const A inv_n = A(1) / A(n);
  const bool rms = a.rms;
  A wv[K], bv[K];  // kEarly: the parameters in registers, loaded before the first rows' x
  if constexpr (kEarly) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      wv[k] = a.w && k < n ? A(to_acc(a.w[k])) : A(1);
      bv[k] = a.b && k < n ? A(to_acc(a.b[k])) : A(0);
    }
  }
  for (int64_t first = int64_t(blockIdx.x) * kThreadRowThreads; first < a.rows;
       first += int64_t(gridDim.x) * kThreadRowThreads) {
    const int64_t row = first + threadIdx.x;
    const int rows = int(a.rows - first < kThreadRowThreads ? a.rows - first : kThreadRowThreads);
    if (row < a.rows) {
      const T* xr = a.x + row * a.x_stride;
      A v[K];
#pragma unroll
      for (int k = 0; k < K; ++k) v[k] = k < n ? A(to_acc(xr[k])) : A(0);
      const Affine<A> st = thread_row_affine(v, n, inv_n, a.eps, rms);
      if (a.stats) save_affine(a.stats, row, st);
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (k < n) {
          A out = normalized(v[k], st);
          if constexpr (kEarly) {
            out = fma(out, wv[k], bv[k]);
          } else {
            if (a.w) out *= A(to_acc(a.w[k]));
            if (a.b) out += A(to_acc(a.b[k]));
          }
          tile[threadIdx.x * n + k] = from_acc<T>(out);
        }
      }
    }
    __syncthreads();
    T* y = a.y + first * int64_t(n);
    for (int i = threadIdx.x; i < rows * n; i += kThreadRowThreads) y[i] = tile[i];
    __syncthreads();  // the tile is rewritten by the next rows
  }
}

static inline bool thread_rows_take(const NormParams& p, int vec) {
  const char* env = std::getenv("FASTNORM_OFFSET_ROWS");
  if (env && env[0] == '0') return false;
  return vec == 1 && p.n <= kThreadRowMaxN(elem_size(p.dtype)) && p.threads <= 0 && p.blocks_per_row <= 0;
}

// Elements a thread holds: powers of two, and 24 (rows of 17-24: K = 32 took 80 registers at bf16 1000000x19,
// 3 blocks of 128 an SM; FASTNORM_THREAD_ROW_K24=0, read at each call, for A/B runs, leaves them to K = 32).
constexpr int next_thread_row_k(int k) { return k == 16 ? 24 : k == 24 ? 32 : 2 * k; }

template <typename T, typename W, int K>
static inline const void* thread_rows_kernel_of(int64_t n, bool early, bool k24) {
  if (n <= K && (K != 24 || k24)) {
    return early ? reinterpret_cast<const void*>(thread_rows_kernel<T, W, K, true>)
                 : reinterpret_cast<const void*>(thread_rows_kernel<T, W, K>);
  }
  if constexpr (K >= kThreadRowMaxN(int(sizeof(T)))) {  // K holds every row the kernel takes
    return nullptr;
  } else {
    return thread_rows_kernel_of<T, W, next_thread_row_k(K)>(n, early, k24);
  }
}

template <typename T, typename W>
static inline const char* launch_thread_rows(const NormParams& p, cudaStream_t stream) {
  const int64_t blocks = (p.outer + kThreadRowThreads - 1) / kThreadRowThreads;
  const int sms = device_info().sms;
  const int64_t cap = int64_t(sms) * 64;  // a few waves of resident blocks, then grid-stride
  // Calls of at most kThreadRowEarlyWaves blocks an SM load the parameters into registers before the first
  // rows' x, so their round trip overlaps x's (FASTNORM_THREAD_ROW_EARLY=0 / 1, read at each call, for A/B
  // runs: never / always).
  const int64_t forced = env_int("FASTNORM_THREAD_ROW_EARLY", -1);
  const bool early = forced == 1 || (forced != 0 && blocks <= int64_t(sms) * kThreadRowEarlyWaves);
  const void* kernel = thread_rows_kernel_of<T, W, 1>(p.n, early, env_int("FASTNORM_THREAD_ROW_K24", 1) != 0);
  return launch_row_grid<T, W>(kernel, p, 1, kThreadRowThreads, blocks < cap ? blocks : cap, stream);
}

// Whether the offset-row kernel takes a last-dim call of VEC-wide accesses: scalar rows (VEC 1) of 32
// elements up to what kOffsetRowMaxThreads threads of kOffsetRowMaxK chunks cover (fp32 8189, 2-byte
// types 16377, float64 4095), bfloat16 up to 32761 (kOffsetRowWideK chunks a thread) where the weight
// and bias of those chunks fit shared memory (float32 weights: up to 3200 chunks), no launch override.
// Shorter rows would leave threads idle: the thread-row kernel. FASTNORM_OFFSET_ROWS=0 (read at each
// call, for A/B runs) leaves all three to the row kernel.
static inline int64_t offset_row_chunks(int64_t n, int elem) {  // the most 16-byte chunks a row can touch
  const int vec = 16 / elem;
  return (n + 2 * vec - 2) / vec;
}

// Shared memory of the chunked kernel: the weight and bias of each chunk, widened as W.
static inline int64_t offset_row_smem(int64_t chunks, int w_elem, int elem) {
  return chunks * 2 * int64_t(16 / elem) * w_elem;
}

// Whether some residue's rows of y start at another offset in their 16 bytes than x's (x a view).
static inline bool offset_rows_shifted(const NormParams& p) {
  const int elem = elem_size(p.dtype), vec = 16 / elem;
  bool shifted = false;
  for (int64_t r = 0; r < vec && r < p.outer; ++r) {
    const uintptr_t ox = (reinterpret_cast<uintptr_t>(p.x) + uintptr_t(r * p.x_outer_stride * elem)) & 15;
    shifted |= ox != ((reinterpret_cast<uintptr_t>(p.y) + uintptr_t(r * p.n * elem)) & 15);
  }
  return shifted;
}

constexpr int64_t kChunkedRowsBytes = 24 << 20;  // (offset_rows_chunked)
constexpr int kChunkedRowsPerSm = 16;
constexpr int64_t kWarpRowsF32MaxN = 640;  // between 513 (faster on warps) and 771 (faster chunked), unmeasured

static inline bool offset_rows_take(const NormParams& p, int vec) {
  const char* env = std::getenv("FASTNORM_OFFSET_ROWS");
  if (env && env[0] == '0') return false;
  if (vec != 1 || p.n < 32 || p.threads > 0 || p.blocks_per_row > 0) return false;
  const int elem = elem_size(p.dtype);
  const int64_t chunks = offset_row_chunks(p.n, elem);
  if (chunks <= int64_t(kOffsetRowMaxThreads) * kOffsetRowMaxK) {
    // Shifted rows of 1025+ 4- and 8-byte elements, as many as SMs: the row kernel's scalar path was
    // level or faster (fp32 28532x3938 at an offset: RMS 337 against 362 us, LN 409 against 383).
    return elem == 2 || p.n <= 32 * kWarpRowMaxK || p.outer < device_info().sms || !offset_rows_shifted(p);
  }
  const int w_elem = p.wdtype == FN_NONE ? elem : elem_size(p.wdtype);  // no parameters: W is T
  return p.dtype == FN_BF16 && chunks <= int64_t(kOffsetRowMaxThreads) * kOffsetRowWideK &&  // kOffsetRowTopK
         offset_row_smem(chunks, w_elem, elem) <= kMaxSmem;
}

// Whether a call offset_rows_take took goes to the chunked kernel, else to the warp-row kernel.
// FASTNORM_OFFSET_ROWS=chunked or =warp (read at each call, for A/B runs) picks one where both can.
static inline bool offset_rows_chunked(const NormParams& p) {
  if (p.n > 32 * kWarpRowMaxK) return true;
  const char* env = std::getenv("FASTNORM_OFFSET_ROWS");
  if (env && env[0] == 'c') return true;
  if (env && env[0] == 'w') return false;
  if (p.n < 128) return false;
  // 2-byte rows, and 4-byte rows of up to kWarpRowsF32MaxN: the warp-row kernel once the SMs get 16 rows each
  // (bf16 3000x513 at an offset 11.1 -> 10.1 us, fp16 21309x257 RMS 21.3 -> 15.8; bf16 436x792 at an offset 5.9
  // against 10.0 on warps; H100. fp32 4713x257 RMS 8.70 -> 8.02, 16654x270 16.5 -> 15.9; 4096x771 LN 13.7
  // against 20.1 on warps; H200, results/h200-strided-rows.txt). Float32 rows of up to kWarpRowsF32MaxN from a
  // row an SM: with their parameters loaded in batches (kWarpRowParamBatch) the warp kernel is far ahead where it
  // ran before (H200, us, chunked against warps: RMS 2200x600 at an offset 11.07 -> 7.10, LN 4713x257 9.31 -> 6.82),
  // and on smaller calls warps holding their parameters were too (LN 2000x301 7.74 -> 5.70, RMS 1500x257 at an
  // offset 6.85 -> 5.28, 140x257 at an offset 5.31 -> 4.48), the batches within 4% of them on calls of a wave
  // (results/h200-warp-row-batches.txt). The others up to 24 MB on the chunked kernel.
  const int elem = elem_size(p.dtype);
  if (elem == 4 && p.n <= kWarpRowsF32MaxN) return p.outer < device_info().sms;
  if (elem == 2) return p.outer < int64_t(kChunkedRowsPerSm) * device_info().sms;
  return p.outer * p.n * elem <= kChunkedRowsBytes;
}

template <typename T, typename W, int K>
static inline const void* offset_rows_kernel_of(int k, bool shifted) {
  if constexpr (K > kOffsetRowTopK<T>) {
    return nullptr;
  } else {
    if (k <= K) {
      return shifted ? reinterpret_cast<const void*>(offset_rows_kernel<T, W, K, true>)
                     : reinterpret_cast<const void*>(offset_rows_kernel<T, W, K, false>);
    }
    return offset_rows_kernel_of<T, W, K * 2>(k, shifted);
  }
}

// Threads a row and chunks a thread: the fewest chunk slots that cover the row, then the most chunks
// a thread (a narrower group reduces in fewer shuffles, and in no barrier when it fits a warp); K = 8
// only for rows that 512 threads of 4 chunks do not cover.
// Blocks: what the SMs hold (FASTNORM_OFFSET_ROW_WAVES times that, for A/B runs), VEC of them for
// each residue, no more than the rows need; then the fill rule below.
template <typename T, typename W>
static inline const char* launch_offset_rows(const NormParams& p, cudaStream_t stream) {
  constexpr int kVec = 16 / int(sizeof(T));
  const int64_t chunks = offset_row_chunks(p.n, int(sizeof(T)));
  int64_t k_cap = env_int("FASTNORM_OFFSET_ROW_K", kOffsetRowMaxK);  // a lower cap on K, for A/B runs
  if (k_cap < 1) k_cap = kOffsetRowMaxK;
  int tpr = 0, k = 0;
  for (int kk = kOffsetRowMaxK; kk >= 1; kk /= 2) {
    const int t = pow2_at_least((chunks + kk - 1) / kk);
    if (kk > k_cap && t <= kOffsetRowMaxThreads / 2) continue;
    if (t > kOffsetRowMaxThreads) break;
    if (tpr == 0 || int64_t(t) * kk < int64_t(tpr) * k) tpr = t, k = kk;
  }
  if (tpr == 0) tpr = kOffsetRowMaxThreads, k = kOffsetRowWideK;
  // A call that gives the SMs fewer than kRowFillBlocks blocks each is latency-bound: halve the
  // chunks a thread (more threads a row, a shorter chain each) while it still does and a row fits 512
  // threads. FASTNORM_OFFSET_ROW_FILL=0 (read at each call, for A/B runs) keeps the fewest threads.
  const int64_t rows_per_residue = (p.outer + kVec - 1) / kVec;
  auto blocks_of = [&](int t) {  // all the rows' blocks: VEC residues, a row a group of t threads
    const int64_t groups = kOffsetRowBlock / std::min(t, kOffsetRowBlock);
    return (rows_per_residue + groups - 1) / groups * kVec;
  };
  if (env_int("FASTNORM_OFFSET_ROW_FILL", 1) != 0) {
    while (k > 1 && k <= kOffsetRowMaxK && blocks_of(tpr) < kRowFillBlocks * device_info().sms) {
      const int t = pow2_at_least((chunks + k / 2 - 1) / (k / 2));
      if (t > kOffsetRowMaxThreads) break;
      tpr = t, k /= 2;
    }
  }
  RowArgs<T, W> a = row_args<T, W>(p, tpr);
  const int threads = tpr > kOffsetRowBlock ? tpr : kOffsetRowBlock;
  const bool shifted = offset_rows_shifted(p);
  // FASTNORM_OFFSET_ROW_VEC_PARAMS=0 (read at each call, for A/B runs): gather element by element.
  int vec_params = sizeof(W) == sizeof(T) && aligned16(p.weight) && aligned16(p.bias) &&
                   env_int("FASTNORM_OFFSET_ROW_VEC_PARAMS", 1) != 0;
  const size_t smem = size_t(offset_row_smem(chunks + vec_params, int(sizeof(W)), int(sizeof(T))));
  const void* kernel = offset_rows_kernel_of<T, W, 1>(k, shifted);
  static bool smem_allowed[2][16] = {};
  if (!smem_allowed[shifted][k & 15]) allow_smem(kernel), smem_allowed[shifted][k & 15] = true;
  int64_t waves = env_int("FASTNORM_OFFSET_ROW_WAVES", 1);
  if (waves < 1) waves = 1;
  int64_t resident = int64_t(device_info().sms) * blocks_per_sm(kernel, threads, smem) * waves;
  resident = resident / kVec * kVec;
  if (resident < kVec) resident = kVec;
  const int64_t blocks = std::min(blocks_of(tpr), resident);
  void* args[] = {&a, &vec_params};
  return launch_result(cudaLaunchKernel(kernel, dim3(unsigned(blocks)), dim3(threads), args, smem, stream));
}

// The smallest K of kWarpRowKs that holds rows of n on `lanes` lanes (0: none, n > 32 * kWarpRowMaxK).
static inline int warp_rows_k(int64_t n, int lanes = 32) {
  for (int k : kWarpRowKs) {
    if (n <= int64_t(lanes) * k) return k;
  }
  return 0;
}

// Float32 rows of 161-320 (K = 8 and 10) in large calls: 6 blocks an SM (40 registers, no spill; 5 at the
// default bound's 42 and 46). H200, us, same process, 5 -> 6 blocks: RMS 100000x257 57.2 -> 55.3 (torch.compile
// 53.6), LN 59.6 -> 57.5 (58.6), 54687x205 28.8 -> 27.9, 272747x257 146.3 -> 140.5; calls of a few waves lost
// (16654x270 14.59 -> 14.78, 4713x257 6.75 -> 6.88), so only calls of kWarpRowMoreBlocksWaves waves and more
// take them (the rule against 5 blocks: 30000x257 21.60 -> 21.34, 54687x205 28.93 -> 28.00, 100000x257 56.99 ->
// 55.36; 16654x270 and 25000x300 level; results/h200-strided-fixed-blocks.txt). FASTNORM_WARP_ROW_MIN_BLOCKS=5
// / 6 (read at each call, for A/B runs) forces one or the other.
constexpr int kWarpRowMoreBlocksPerSm = 6;
constexpr int64_t kWarpRowMoreBlocksWaves = 4;
template <typename T>
constexpr bool kWarpRowMoreBlocks(int k) { return sizeof(T) == 4 && (k == 8 || k == 10); }

template <typename T, typename W, int I = 0>
static inline const void* warp_rows_kernel_of(int k, int lanes, bool more_blocks = false) {
  if constexpr (I >= kWarpRowKCount) {
    return nullptr;
  } else {
    constexpr int K = kWarpRowKs[I];
    if (k == K) {
      // warp_row_lanes: rows of 32 on 8 lanes (4 elements a lane), of 33-48 on 16 (3 a lane), 2-byte ones of 49-64
      // on 8 (8 a lane).
      if constexpr (K == 4 || (K == 8 && sizeof(T) == 2)) {
        if (lanes == 8) return reinterpret_cast<const void*>(warp_rows_kernel<T, W, K, warp_rows_at_once(K), 8>);
      }
      if constexpr (K == 3) {
        if (lanes == 16) return reinterpret_cast<const void*>(warp_rows_kernel<T, W, K, warp_rows_at_once(K), 16>);
      }
      if constexpr (kWarpRowMoreBlocks<T>(K)) {
        constexpr int kMore = kWarpRowMoreBlocksPerSm;
        if (lanes == 32 && more_blocks)
          return reinterpret_cast<const void*>(warp_rows_kernel<T, W, K, warp_rows_at_once(K), 32, kMore>);
      }
      return lanes == 32 ? reinterpret_cast<const void*>(warp_rows_kernel<T, W, K, warp_rows_at_once(K)>) : nullptr;
    }
    return warp_rows_kernel_of<T, W, I + 1>(k, lanes, more_blocks);
  }
}

template <typename T, typename W>
static inline const char* launch_warp_rows(const NormParams& p, cudaStream_t stream) {
  // Lanes a row (warp_row_lanes, or FASTNORM_WARP_ROW_LANES where an instance has them), and elements a lane.
  int lanes = int(env_int("FASTNORM_WARP_ROW_LANES", 0));
  if (lanes != 8 && lanes != 16) lanes = lanes == 32 ? 32 : warp_row_lanes(p.n, elem_size(p.dtype));
  if (warp_rows_kernel_of<T, W>(warp_rows_k(p.n, lanes), lanes) == nullptr) lanes = 32;
  const int k = warp_rows_k(p.n, lanes);
  const int64_t rows_per_block = int64_t(kWarpRowThreads / 32) * warp_rows_at_once(k) * (32 / lanes);
  const int64_t blocks = (p.outer + rows_per_block - 1) / rows_per_block;
  const int64_t forced_blocks = env_int("FASTNORM_WARP_ROW_MIN_BLOCKS", 0);
  const bool more_blocks = forced_blocks == kWarpRowMoreBlocksPerSm ||
                           (forced_blocks == 0 && kWarpRowMoreBlocks<T>(k) &&
                            blocks >= kWarpRowMoreBlocksWaves * kWarpRowMoreBlocksPerSm * device_info().sms);
  const void* kernel = warp_rows_kernel_of<T, W>(k, lanes, more_blocks);
  // Hoisting instances: kWarpRowWaves waves of resident blocks, then grid-stride, so that a warp's parameters
  // serve several rows; the others a block for every rows_per_block rows (fp32 272747x257 RMS 211.3 us at 4
  // waves, 194.8 not; H100). FASTNORM_WARP_ROW_WAVES (read at each call, for A/B runs): waves of resident
  // blocks; 0, a block for every rows_per_block rows.
  const int64_t waves = env_int("FASTNORM_WARP_ROW_WAVES", warp_rows_hoisted<T>(k) ? kWarpRowWaves : 0);
  const int64_t cap = waves > 0 ? int64_t(device_info().sms) * blocks_per_sm(kernel, kWarpRowThreads, 0) * waves : blocks;
  return launch_row_grid<T, W>(kernel, p, 32, kWarpRowThreads, blocks < cap ? blocks : cap, stream);
}

}  // namespace fastnorm
