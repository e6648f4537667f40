// CPU LayerNorm / RMSNorm forward over the (outer, n, inner) view described in norm_params.h.
//
// SIMD with at::vec::Vectorized and threads with at::parallel_for; the statistics (fp32 accumulation
// in vector registers, double for float64 inputs, chunked two-pass sums combined in double) live in
// cpu_vec.h, shared with the backward. Results do not depend on the thread count. On a CPU the vector
// code cannot run on, the portable scalar kernels at the top of this file do the work.
// NormParams' threads / blocks_per_row / workspace are CUDA tuning knobs and are ignored here.
#include "norm_params.h"
#include "cpu_vec.h"
#include "kernel_set.h"

namespace {

// ---------------------------------------------------------------------------------------------
// Portable scalar kernels (baseline instruction set): double arithmetic, one column at a time.

template <class TX, class TW>
void forward_scalar(const NormParams& p) {
  const TX* x = static_cast<const TX*>(p.x);
  TX* y = static_cast<TX*>(p.y);
  const TW* w = static_cast<const TW*>(p.weight);
  const TW* b = static_cast<const TW*>(p.bias);
  const int64_t n = p.n, inner = p.inner;
  for (int64_t o = 0; o < p.outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const TX* xc = x + o * p.x_outer_stride + i;
      TX* yc = y + o * n * inner + i;
      const auto st = fastnorm_cpu::scalar_stats(xc, n, inner, p.rms != 0, p.eps);
      for (int64_t j = 0; j < n; ++j) {
        double v = ((static_cast<double>(xc[j * inner]) - st.ref) - st.off) * st.rstd;
        if (w) v *= static_cast<double>(w[j]);
        if (b) v += static_cast<double>(b[j]);
        yc[j * inner] = static_cast<TX>(v);
      }
    }
  }
}

const char* forward_scalar_any(const NormParams& p) {
  return fastnorm_cpu::dispatch_dtypes(p.dtype, p.wdtype, p.weight || p.bias, [&](auto tx, auto tw) {
    forward_scalar<typename decltype(tx)::type, typename decltype(tw)::type>(p);
  });
}

}  // namespace

FASTNORM_SIMD_BEGIN
namespace {

using namespace fastnorm_cpu;

// Output of a run of len contiguous elements of a row: y = norm(x) [* w] [+ b], step by step (the
// last step of a run at least a step long ends at len, rewriting a few outputs with the same values).
// Inlined into the row loop: as a call per row it made 100000x257 fp32 ~13% slower, all of it kernel
// time in the page faults of the fresh output (same fault count; measured, not understood).
template <class TX, class TW, bool kRms, bool kW, bool kB>
C10_ALWAYS_INLINE void write_run(const TX* x, TX* y, const TW* w, const TW* b, int64_t len,
                                 const NormCoeffs<compute_t<TX>>& k) {
  using S = Step<TX>;
  using V = typename S::V;
  const V ref(k.ref), off(k.off), rstd(k.rstd);
  for_each_step<TX>(len, [&](const StepSpan& s) {
    V v[S::kParts], wv[S::kParts], bv[S::kParts];
    load_span(x, s, v);
    if (kW) load_params_span<TX>(w, s, wv);
    if (kB) load_params_span<TX>(b, s, bv);
    for (int q = 0; q < S::kParts; ++q) {
      V t = kRms ? v[q] * rstd : ((v[q] - ref) - off) * rstd;
      if (kW && kB) t = at::vec::fmadd(t, wv[q], bv[q]);
      else if (kW) t = t * wv[q];
      else if (kB) t = t + bv[q];
      v[q] = t;
    }
    store_span(y, s, v);
  });
}

template <class T>
const T* advance(const T* p, int64_t k) { return p ? p + k : nullptr; }

// inner == 1: rows of n contiguous elements, one row per task; a few long rows are split into chunks.
template <class TX, class TW, bool kRms, bool kW, bool kB>
void forward_rows(const NormParams& p) {
  const TX* x = static_cast<const TX*>(p.x);
  TX* y = static_cast<TX*>(p.y);
  const TW* w = static_cast<const TW*>(p.weight);
  const TW* b = static_cast<const TW*>(p.bias);
  const int64_t n = p.n, stride = p.x_outer_stride;
  const int threads = at::get_num_threads();
  if (threads > 1 && p.outer < 2 * int64_t(threads) && n >= 8 * kChunk) {  // a few long rows: split them
    const int64_t chunks = ceil_div(n, kChunk);
    std::vector<NormCoeffs<compute_t<TX>>> coeffs(p.outer);
    rows_coeffs_parallel(x, p.outer, stride, n, kRms, p.eps, coeffs.data());
    at::parallel_for(0, p.outer * chunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t o = t / chunks, e = (t % chunks) * kChunk;
        write_run<TX, TW, kRms, kW, kB>(x + o * stride + e, y + o * n + e, advance(w, e), advance(b, e),
                                        std::min(kChunk, n - e), coeffs[o]);
      }
    });
    return;
  }
  at::parallel_for(0, p.outer, std::max<int64_t>(1, kParallelMinWork / n), [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      const TX* xr = x + o * stride;
      write_run<TX, TW, kRms, kW, kB>(xr, y + o * n, w, b, n, row_coeffs(xr, n, kRms, p.eps));
    }
  });
}

// Output of one channel block: lanes [0, width) of rows j < n, with per-lane coefficients. A row
// may be stored whole past width (lanes that belong to the next row, rewritten when that row comes)
// while that stays below `store_end` (see store_block_row).
template <class TX, class TW, bool kRms, bool kW, bool kB, int NV>
void write_block(const TX* x, TX* y, const TW* w, const TW* b, int64_t n, int64_t inner, int64_t width,
                 int64_t ahead, const TX* load_end, const TX* store_end, const Vectorized<compute_t<TX>>* ref,
                 const Vectorized<compute_t<TX>>* off, const Vectorized<compute_t<TX>>* rstd) {
  using Bk = Block<TX, NV>;
  using C = typename Bk::C;
  using V = typename Bk::V;
  for (int64_t j = 0; j < n; ++j) {
    const V wj(kW ? static_cast<C>(w[j]) : C(1)), bj(kB ? static_cast<C>(b[j]) : C(0));
    TX* yj = y + j * inner;
    prefetch_next_block<TX, NV>(yj, ahead, true);
    V v[NV];
    load_block_row<TX, NV>(x + j * inner, width, load_end, v);
    for (int q = 0; q < NV; ++q) {
      V t = kRms ? v[q] * rstd[q] : ((v[q] - ref[q]) - off[q]) * rstd[q];
      if (kW && kB) t = at::vec::fmadd(t, wj, bj);
      else if (kW) t = t * wj;
      else if (kB) t = t + bj;
      v[q] = t;
    }
    store_block_row<TX, NV>(yj, width, store_end, v);
  }
}

// inner > 1: one task per (outer index, block of inner positions).
template <class TX, class TW, bool kRms, bool kW, bool kB, int NV>
void forward_channel_blocks(const NormParams& p) {
  using Bk = Block<TX, NV>;
  using V = typename Bk::V;
  const TX* x = static_cast<const TX*>(p.x);
  TX* y = static_cast<TX*>(p.y);
  const TW* w = static_cast<const TW*>(p.weight);
  const TW* b = static_cast<const TW*>(p.bias);
  const int64_t n = p.n, inner = p.inner;
  const int64_t blocks = ceil_div(inner, Bk::kLanes);
  const TX* x_end = x + (p.outer - 1) * p.x_outer_stride + n * inner;
  const int64_t grain = std::max<int64_t>(1, kParallelMinWork / (n * Bk::kLanes));
  at::parallel_for(0, p.outer * blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t o = t / blocks, i0 = (t % blocks) * Bk::kLanes;
      const int64_t width = std::min(Bk::kLanes, inner - i0);
      const TX* xb = x + o * p.x_outer_stride + i0;
      TX* yb = y + o * n * inner + i0;
      // One block per slab: rows may spill into the next row of the same slab (this task's own).
      const TX* store_end = blocks == 1 ? y + (o + 1) * n * inner : yb;
      const int64_t ahead = std::min(Bk::kLanes, inner - i0 - width);  // lanes of the next block
      V ref[NV], off[NV], rstd[NV];
      block_coeffs<TX, NV>(xb, n, inner, width, ahead, x_end, kRms, p.eps, ref, off, rstd);
      write_block<TX, TW, kRms, kW, kB, NV>(xb, yb, w, b, n, inner, width, ahead, x_end, store_end, ref, off, rstd);
    }
  });
}

// The narrowest block that covers inner (one block per slab up to 8 vectors); wider inner: blocks of
// 4 vectors (8 spill registers: measured slower on 56x56 and 16x16 planes).
template <class TX, class TW, bool kRms, bool kW, bool kB>
void forward_channels(const NormParams& p) {
  constexpr int64_t W = Step<TX>::kWidth;
  constexpr int kMin = Step<TX>::kParts;
  if constexpr (kMin == 1) {
    if (p.inner <= W) return forward_channel_blocks<TX, TW, kRms, kW, kB, 1>(p);
  }
  if (p.inner <= 2 * W) forward_channel_blocks<TX, TW, kRms, kW, kB, 2>(p);
  else if (p.inner <= 4 * W || p.inner > 8 * W) forward_channel_blocks<TX, TW, kRms, kW, kB, 4>(p);
  else forward_channel_blocks<TX, TW, kRms, kW, kB, 8>(p);
}

template <class TX, class TW, bool kRms, bool kW, bool kB>
void forward_layout(const NormParams& p) {
#ifdef FASTNORM_WANT_ROW
  if (p.inner == 1) forward_rows<TX, TW, kRms, kW, kB>(p);
#endif
#ifdef FASTNORM_WANT_CHANNEL
  if (p.inner != 1) forward_channels<TX, TW, kRms, kW, kB>(p);
#endif
}

template <class TX, class TW>
void forward_affine(const NormParams& p) {
  const bool w = p.weight != nullptr, b = p.bias != nullptr;
  if (p.rms) {
    if (w) forward_layout<TX, TW, true, true, false>(p);
    else forward_layout<TX, TW, true, false, false>(p);
  } else if (w && b) {
    forward_layout<TX, TW, false, true, true>(p);
  } else if (w) {
    forward_layout<TX, TW, false, true, false>(p);
  } else if (b) {
    forward_layout<TX, TW, false, false, true>(p);
  } else {
    forward_layout<TX, TW, false, false, false>(p);
  }
}

const char* forward_simd(const NormParams& p) {
  return dispatch_dtypes(p.dtype, p.wdtype, p.weight || p.bias, [&](auto tx, auto tw) {
    forward_affine<typename decltype(tx)::type, typename decltype(tw)::type>(p);
  });
}

}  // namespace
FASTNORM_SIMD_END

const char* fastnorm_cpu_forward(const NormParams& p) {
  if (p.outer < 0 || p.n < 0 || p.inner < 0) return "fastnorm_cpu_forward: negative size";
  if (p.outer == 0 || p.n == 0 || p.inner == 0) return nullptr;
  if (!p.x || !p.y) return "fastnorm_cpu_forward: null x or y";
  if (p.rms && p.bias) return "fastnorm_cpu_forward: RMSNorm takes no bias";
#ifndef FASTNORM_WANT_ROW
  if (p.inner == 1) return FASTNORM_NOT_BUILT;
#endif
#ifndef FASTNORM_WANT_CHANNEL
  if (p.inner != 1) return FASTNORM_NOT_BUILT;
#endif
  return fastnorm_cpu::simd_available() ? forward_simd(p) : forward_scalar_any(p);
}
