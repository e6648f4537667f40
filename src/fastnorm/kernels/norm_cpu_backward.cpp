// CPU LayerNorm / RMSNorm backward over the (outer, n, inner) view of norm_backward_params.h: dx, and
// dweight / dbias summed deterministically. Built like the forward (cpu_vec.h): at::vec vectors,
// at::parallel_for, fp32 sums (double for float64); statistics recomputed here are the forward's,
// bit for bit.
//
// dweight / dbias: the tasks (rows; or (outer index, block of inner positions) on the channel axis)
// are cut into at most kMaxGroups groups of consecutive tasks, from the shape alone (a group of rows
// holds at least kMinGroupElems elements, so a few long rows still make several groups). A group sums
// its tasks in order into its own double partial (rows through fp32 accumulators flushed every
// kFlushRows rows), and the partials are added in group order: the same bits for every thread count.
#include "norm_backward_params.h"
#include "cpu_vec.h"

#include <memory>

namespace {

constexpr int64_t kMaxGroups = 64;
constexpr int64_t kMinTasksPerGroup = 8;  // channel blocks: a partial (n doubles) per task would cost more
// Rows: a group's partial costs about as much as one of its rows, so a group takes a few rows, but
// at least one: 4 rows of 65536 made one group, and one thread did all the work.
constexpr int64_t kMinGroupElems = 16384;
constexpr int64_t kFlushRows = 32;

struct Groups {
  int64_t count, per;  // `count` groups of `per` consecutive tasks (the last may hold fewer)
};

Groups split_groups(int64_t tasks, int64_t min_per = kMinTasksPerGroup) {
  const int64_t per = std::max(fastnorm_cpu::ceil_div(tasks, kMaxGroups), min_per);
  return {fastnorm_cpu::ceil_div(tasks, per), per};
}

Groups split_rows(int64_t rows, int64_t n) { return split_groups(rows, fastnorm_cpu::ceil_div(kMinGroupElems, n)); }

int64_t param_sums(const NormBackwardParams& p) { return (p.dweight ? 1 : 0) + (p.dbias ? 1 : 0); }

// A few long rows with dweight / dbias wanted go by blocks of columns (backward_columns), from the
// shape alone: partials per group of rows would cost as much as the rows, and leave threads idle.
constexpr int64_t kColumnMaxRows = 32;
constexpr int64_t kColumnBlock = 1024;  // columns a task (a multiple of every step)

bool by_columns(const NormBackwardParams& p) {  // (the SIMD kernels only: the scalar ones use a partial)
  return p.inner == 1 && param_sums(p) > 0 && p.outer <= kColumnMaxRows && p.n >= 2 * kColumnBlock &&
         fastnorm_cpu::simd_available();
}

// Doubles of scratch for the partial sums: n per wanted sum per group (channel tasks <= outer * inner).
int64_t workspace_doubles(const NormBackwardParams& p) {
  if (p.outer <= 0 || p.n <= 0 || p.inner <= 0 || by_columns(p)) return 0;
  const int64_t groups = p.inner == 1 ? split_rows(p.outer, p.n).count
                                      : std::min(kMaxGroups, fastnorm_cpu::ceil_div(p.outer * p.inner, kMinTasksPerGroup));
  return groups * p.n * param_sums(p);  // >= split_groups(tasks).count for any tasks <= outer * inner
}

// dweight / dbias from the group partials (each `sums` arrays of n doubles, group after group).
template <class TW>
void finish_params(const NormBackwardParams& p, const double* partials, int64_t groups) {
  const int64_t n = p.n, sums = param_sums(p);
  TW* outs[2] = {static_cast<TW*>(p.dweight), static_cast<TW*>(p.dbias)};
  // Each column adds its partials in group order; a block of columns at a time, so the adds of
  // different columns overlap (one column's chain of dependent adds made this latency-bound).
  constexpr int64_t kCols = 256;
  at::parallel_for(0, n, 2048, [&](int64_t begin, int64_t end) {
    double total[kCols];
    int64_t slot = 0;
    for (TW* out : outs) {
      if (!out) continue;
      for (int64_t j0 = begin; j0 < end; j0 += kCols) {
        const int64_t cols = std::min(kCols, end - j0);
        std::fill(total, total + cols, 0.0);
        for (int64_t g = 0; g < groups; ++g) {
          const double* part = partials + (g * sums + slot) * n + j0;
          for (int64_t j = 0; j < cols; ++j) total[j] += part[j];
        }
        for (int64_t j = 0; j < cols; ++j) out[j0 + j] = static_cast<TW>(total[j]);
      }
      ++slot;
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Portable scalar kernels (baseline instruction set): double arithmetic, one column at a time.

template <class TX, class TW>
void backward_scalar(const NormBackwardParams& p, double* partials) {
  using C = fastnorm_cpu::compute_t<TX>;
  const TX* x = static_cast<const TX*>(p.x);
  const TX* dy = static_cast<const TX*>(p.dy);
  const TW* w = static_cast<const TW*>(p.weight);
  TX* dx = static_cast<TX*>(p.dx);
  const C* saved_mean = static_cast<const C*>(p.mean);
  const C* saved_rstd = static_cast<const C*>(p.rstd);
  const int64_t n = p.n, inner = p.inner, sums = param_sums(p);
  double* part_w = p.dweight ? partials : nullptr;
  double* part_b = p.dbias ? partials + (p.dweight ? n : 0) : nullptr;
  for (int64_t k = 0; k < sums * n; ++k) partials[k] = 0.0;
  for (int64_t o = 0; o < p.outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const TX* xc = x + o * p.x_outer_stride + i;
      const TX* dyc = dy + o * p.dy_outer_stride + i;
      fastnorm_cpu::ScalarStats st{0.0, 0.0, 0.0};
      if (saved_rstd) st = {p.rms ? 0.0 : double(saved_mean[o * inner + i]), 0.0, double(saved_rstd[o * inner + i])};
      else st = fastnorm_cpu::scalar_stats(xc, n, inner, p.rms != 0, p.eps);
      auto xhat = [&](int64_t j) { return ((static_cast<double>(xc[j * inner]) - st.ref) - st.off) * st.rstd; };
      auto grad = [&](int64_t j) {
        const double g = static_cast<double>(dyc[j * inner]);
        return w ? g * static_cast<double>(w[j]) : g;
      };
      double sg = 0.0, sgx = 0.0;
      for (int64_t j = 0; j < n; ++j) {
        sg += grad(j);
        sgx += grad(j) * xhat(j);
      }
      const double a = p.rms ? 0.0 : sg / double(n), c = sgx / double(n);
      for (int64_t j = 0; j < n; ++j) {
        if (dx) dx[(o * n + j) * inner + i] = static_cast<TX>(st.rstd * ((grad(j) - a) - xhat(j) * c));
        if (part_w) part_w[j] += static_cast<double>(dyc[j * inner]) * xhat(j);
        if (part_b) part_b[j] += static_cast<double>(dyc[j * inner]);
      }
    }
  }
  finish_params<TW>(p, partials, 1);
}

}  // namespace

FASTNORM_SIMD_BEGIN
namespace {

using namespace fastnorm_cpu;

// Inlines every call in the row / column loops: GCC left at::vec's bf16 / fp16 loads (and
// keep_lanes) as calls through the PLT there, each spilling the live vectors.
#if defined(__GNUC__)
#define FASTNORM_FLATTEN __attribute__((flatten))
#else
#define FASTNORM_FLATTEN
#endif

// ---------------------------------------------------------------------------------------------
// inner == 1: rows.

// Zeroes the lanes of a step that are not new (see StepSpan).
template <class T>
C10_ALWAYS_INLINE void keep_new(const StepSpan& s, Vectorized<compute_t<T>>* v) {
  if (s.first != 0 || s.last != Step<T>::kStep) keep_lanes<T>(v, s.first, s.last);
}

// g = dy [* w] and xhat at one step.
template <class TX, class TW, bool kW>
C10_ALWAYS_INLINE void grad_and_xhat(const TX* x, const TX* dy, const TW* w, const StepSpan& s,
                                     const NormCoeffs<compute_t<TX>>& k, Vectorized<compute_t<TX>>* g,
                                     Vectorized<compute_t<TX>>* xhat, Vectorized<compute_t<TX>>* dyv) {
  using S = Step<TX>;
  using V = typename S::V;
  const V ref(k.ref), off(k.off), rstd(k.rstd);
  load_span(x, s, xhat);
  load_span(dy, s, dyv);
  V wv[S::kParts];
  if (kW) load_params_span<TX>(w, s, wv);
  for (int q = 0; q < S::kParts; ++q) {
    xhat[q] = ((xhat[q] - ref) - off) * rstd;
    g[q] = kW ? dyv[q] * wv[q] : dyv[q];
  }
}

// dx at one step: rstd * (g - a - xhat * c), a = mean(g) (0 for RMSNorm), c = mean(g * xhat).
template <class TX>
C10_ALWAYS_INLINE void store_dx_step(TX* dx, const StepSpan& s, const Vectorized<compute_t<TX>>* g,
                                     const Vectorized<compute_t<TX>>* xhat, const Vectorized<compute_t<TX>>& a,
                                     const Vectorized<compute_t<TX>>& c, const Vectorized<compute_t<TX>>& rstd) {
  Vectorized<compute_t<TX>> d[Step<TX>::kParts];
  for (int q = 0; q < Step<TX>::kParts; ++q) d[q] = rstd * ((g[q] - a) - xhat[q] * c);
  store_span(dx, s, d);
}

// dy * xhat and dy added into the fp32 accumulators acc_w / acc_b (null: not wanted) at one step;
// lanes seen before must already be zero in dyv and xhat (keep_new): they add nothing, even an Inf dy.
template <class TX>
C10_ALWAYS_INLINE void add_param_terms(const StepSpan& s, const Vectorized<compute_t<TX>>* dyv,
                                       const Vectorized<compute_t<TX>>* xhat, compute_t<TX>* acc_w,
                                       compute_t<TX>* acc_b) {
  using S = Step<TX>;
  using V = typename S::V;
  for (int q = 0; q < S::kParts; ++q) {
    const int64_t at_q = s.pos + q * S::kWidth;
    if (acc_w) (V::loadu(acc_w + at_q) + dyv[q] * xhat[q]).store(acc_w + at_q);
    if (acc_b) (V::loadu(acc_b + at_q) + dyv[q]).store(acc_b + at_q);
  }
}

struct GradSums {
  double g, gx;  // sums of g and of g * xhat
};

// Sums of g and g * xhat over a chunk of a row (len <= kChunk elements at x, dy, w), in fp32
// vectors; dy * xhat and dy added into the fp32 accumulators acc_w / acc_b (len + kStep elements
// each, or null) on the way, as this pass reads x and dy anyway. Steps alternate between two sets of
// vectors: one set was a chain of dependent adds, 4 cycles a step.
template <class TX, class TW, bool kW>
C10_ALWAYS_INLINE GradSums chunk_grad_sums(const TX* x, const TX* dy, const TW* w, int64_t len,
                                           const NormCoeffs<compute_t<TX>>& k, compute_t<TX>* acc_w,
                                           compute_t<TX>* acc_b) {
  using S = Step<TX>;
  using V = typename S::V;
  constexpr int64_t kStep = S::kStep;
  V sg[2][S::kParts], sgx[2][S::kParts];
  for (int u = 0; u < 2; ++u)
    for (int q = 0; q < S::kParts; ++q) sg[u][q] = sgx[u][q] = V(0);
  auto step = [&](const StepSpan& s, V* sgu, V* sgxu) {
    V g[S::kParts], xhat[S::kParts], dyv[S::kParts];
    grad_and_xhat<TX, TW, kW>(x, dy, w, s, k, g, xhat, dyv);
    keep_new<TX>(s, g);
    keep_new<TX>(s, xhat);
    for (int q = 0; q < S::kParts; ++q) {
      sgu[q] = sgu[q] + g[q];
      sgxu[q] = at::vec::fmadd(g[q], xhat[q], sgxu[q]);
    }
    if (acc_w || acc_b) {
      keep_new<TX>(s, dyv);
      add_param_terms<TX>(s, dyv, xhat, acc_w, acc_b);
    }
  };
  int64_t e = 0;
  for (; e + 2 * kStep <= len; e += 2 * kStep) {
    step(StepSpan{e, kStep, 0, kStep}, sg[0], sgx[0]);
    step(StepSpan{e + kStep, kStep, 0, kStep}, sg[1], sgx[1]);
  }
  if (e < len) {  // the rest (under two steps) into the first set; a tail step may end at len
    for_each_step<TX>(len - e, [&](StepSpan s) {
      s.pos += e;
      step(s, sg[0], sgx[0]);
    });
  }
  V tg = sg[0][0] + sg[1][0], tgx = sgx[0][0] + sgx[1][0];
  for (int q = 1; q < S::kParts; ++q) {
    tg = tg + (sg[0][q] + sg[1][q]);
    tgx = tgx + (sgx[0][q] + sgx[1][q]);
  }
  return {lane_sum(tg), lane_sum(tgx)};
}

// dx over a run of len elements of a row, given the row's mean(g) (a) and mean(g * xhat) (c).
template <class TX, class TW, bool kW>
C10_ALWAYS_INLINE void run_dx(const TX* x, const TX* dy, const TW* w, TX* dx, int64_t len,
                              const NormCoeffs<compute_t<TX>>& k, compute_t<TX> a, compute_t<TX> c) {
  using S = Step<TX>;
  using V = typename S::V;
  const V av(a), cv(c), rstd(k.rstd);
  for_each_step<TX>(len, [&](const StepSpan& s) {
    V g[S::kParts], xhat[S::kParts], dyv[S::kParts];
    grad_and_xhat<TX, TW, kW>(x, dy, w, s, k, g, xhat, dyv);
    store_dx_step(dx, s, g, xhat, av, cv, rstd);
  });
}

// dx of one row, and its dy * xhat, dy added into the fp32 accumulators acc_w / acc_b (n + kStep
// elements each, or null): chunk sums (which do the accumulators), then dx if wanted.
// Inlined into the row loop for the reason write_run is (norm_cpu.cpp).
template <class TX, class TW, bool kRms, bool kW>
C10_ALWAYS_INLINE void row_backward(const TX* x, const TX* dy, const TW* w, TX* dx, int64_t n,
                                    const NormCoeffs<compute_t<TX>>& k, compute_t<TX>* acc_w, compute_t<TX>* acc_b) {
  using C = compute_t<TX>;
  double sum_g = 0.0, sum_gx = 0.0;  // chunks added in double, in order
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const GradSums t = chunk_grad_sums<TX, TW, kW>(x + c0, dy + c0, kW ? w + c0 : w, std::min(kChunk, n - c0), k,
                                                   acc_w ? acc_w + c0 : nullptr, acc_b ? acc_b + c0 : nullptr);
    sum_g += t.g;
    sum_gx += t.gx;
  }
  if (dx) run_dx<TX, TW, kW>(x, dy, w, dx, n, k, kRms ? C(0) : C(sum_g / double(n)), C(sum_gx / double(n)));
}

template <class TX>
NormCoeffs<compute_t<TX>> saved_coeffs(const NormBackwardParams& p, int64_t index) {
  using C = compute_t<TX>;
  const C ref = p.rms ? C(0) : static_cast<const C*>(p.mean)[index];
  return {ref, C(0), static_cast<const C*>(p.rstd)[index]};
}

template <class TX, class TW, bool kRms, bool kW>
void backward_rows(const NormBackwardParams& p, double* partials) {
  using C = compute_t<TX>;
  const TX* x = static_cast<const TX*>(p.x);
  const TX* dy = static_cast<const TX*>(p.dy);
  const TW* w = static_cast<const TW*>(p.weight);
  TX* dx = static_cast<TX*>(p.dx);
  const int64_t n = p.n, sums = param_sums(p);
  const Groups groups = split_rows(p.outer, n);
  at::parallel_for(0, groups.count, 1, [&](int64_t gbegin, int64_t gend) FASTNORM_FLATTEN {
    std::vector<C> acc(sums * (n + Step<TX>::kStep));
    C* acc_w = p.dweight ? acc.data() : nullptr;
    C* acc_b = p.dbias ? acc.data() + (p.dweight ? n + Step<TX>::kStep : 0) : nullptr;
    for (int64_t g = gbegin; g < gend; ++g) {
      double* part = sums ? partials + g * sums * n : nullptr;
      if (part) std::fill(part, part + sums * n, 0.0);
      const int64_t r0 = g * groups.per, r1 = std::min(p.outer, r0 + groups.per);
      for (int64_t r = r0; r < r1; ++r) {
        const TX* xr = x + r * p.x_outer_stride;
        const auto k = p.rstd ? saved_coeffs<TX>(p, r) : row_coeffs(xr, n, kRms, p.eps);
        row_backward<TX, TW, kRms, kW>(xr, dy + r * p.dy_outer_stride, w, dx ? dx + r * n : nullptr, n, k,
                                       acc_w, acc_b);
        if (part && ((r - r0 + 1) % kFlushRows == 0 || r + 1 == r1)) {  // fp32 -> the group's double partial
          for (int64_t s = 0; s < sums; ++s) {
            C* a = acc.data() + s * (n + Step<TX>::kStep);
            for (int64_t j = 0; j < n; ++j) part[s * n + j] += double(a[j]);
            std::fill(a, a + n, C(0));
          }
        }
      }
    }
  });
  if (sums) finish_params<TW>(p, partials, groups.count);
}

// A few long rows (see by_columns): the rows' statistics and sums in one parallel region over (row,
// chunk), then dx and dweight / dbias in one over blocks of columns, each block going down the rows
// in order (fp32 accumulators flushed into double every kFlushRows rows): no partials, the same bits
// for every thread count, and every thread busy however few the rows.
template <class TX, class TW, bool kRms, bool kW>
void backward_columns(const NormBackwardParams& p) {
  using S = Step<TX>;
  using C = compute_t<TX>;
  using V = typename S::V;
  const TX* x = static_cast<const TX*>(p.x);
  const TX* dy = static_cast<const TX*>(p.dy);
  const TW* w = static_cast<const TW*>(p.weight);
  TX* dx = static_cast<TX*>(p.dx);
  const int64_t n = p.n, rows = p.outer, chunks = ceil_div(n, kChunk);
  const int64_t xs = p.x_outer_stride, dys = p.dy_outer_stride;
  std::vector<NormCoeffs<C>> coeffs(rows);
  if (p.rstd) {
    for (int64_t r = 0; r < rows; ++r) coeffs[r] = saved_coeffs<TX>(p, r);
  } else {
    rows_coeffs_parallel(x, rows, xs, n, kRms, p.eps, coeffs.data());
  }
  std::vector<GradSums> parts(rows * chunks);
  at::parallel_for(0, rows * chunks, 1, [&](int64_t begin, int64_t end) FASTNORM_FLATTEN {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = t / chunks, c0 = (t % chunks) * kChunk;
      parts[t] = chunk_grad_sums<TX, TW, kW>(x + r * xs + c0, dy + r * dys + c0, kW ? w + c0 : w,
                                             std::min(kChunk, n - c0), coeffs[r], nullptr, nullptr);
    }
  });
  std::vector<C> mean_g(rows), mean_gx(rows);
  for (int64_t r = 0; r < rows; ++r) {
    double sg = 0.0, sgx = 0.0;  // chunks in order, as row_backward adds them
    for (int64_t c = 0; c < chunks; ++c) {
      sg += parts[r * chunks + c].g;
      sgx += parts[r * chunks + c].gx;
    }
    mean_g[r] = kRms ? C(0) : C(sg / double(n));
    mean_gx[r] = C(sgx / double(n));
  }
  TW* dw = static_cast<TW*>(p.dweight);
  TW* db = static_cast<TW*>(p.dbias);
  at::parallel_for(0, ceil_div(n, kColumnBlock), 1, [&](int64_t begin, int64_t end) FASTNORM_FLATTEN {
    std::vector<C> acc(2 * (kColumnBlock + S::kStep));
    C* acc_w = acc.data();
    C* acc_b = acc.data() + kColumnBlock + S::kStep;
    std::vector<double> total(2 * kColumnBlock);
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t j0 = blk * kColumnBlock, len = std::min(kColumnBlock, n - j0);
      std::fill(acc.begin(), acc.end(), C(0));
      std::fill(total.begin(), total.end(), 0.0);
      const TW* wb = kW ? w + j0 : w;
      for (int64_t r = 0; r < rows; ++r) {
        const TX* xr = x + r * xs + j0;
        const TX* dyr = dy + r * dys + j0;
        TX* dxr = dx ? dx + r * n + j0 : nullptr;
        const V a(mean_g[r]), c(mean_gx[r]), rstd(coeffs[r].rstd);
        for_each_step<TX>(len, [&](const StepSpan& s) {
          V g[S::kParts], xhat[S::kParts], dyv[S::kParts];
          grad_and_xhat<TX, TW, kW>(xr, dyr, wb, s, coeffs[r], g, xhat, dyv);
          if (dxr) store_dx_step(dxr, s, g, xhat, a, c, rstd);
          keep_new<TX>(s, dyv);
          keep_new<TX>(s, xhat);
          add_param_terms<TX>(s, dyv, xhat, dw ? acc_w : nullptr, db ? acc_b : nullptr);
        });
        if ((r + 1) % kFlushRows == 0 || r + 1 == rows) {  // fp32 -> double
          for (int64_t j = 0; j < len; ++j) {
            total[j] += double(acc_w[j]);
            total[kColumnBlock + j] += double(acc_b[j]);
          }
          std::fill(acc.begin(), acc.end(), C(0));
        }
      }
      for (int64_t j = 0; j < len; ++j) {
        if (dw) dw[j0 + j] = static_cast<TW>(total[j]);
        if (db) db[j0 + j] = static_cast<TW>(total[kColumnBlock + j]);
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// inner > 1: blocks of lanes along inner, as in the forward.

template <class TX, class TW, bool kRms, bool kW, int NV>
void block_backward(const NormBackwardParams& p, int64_t o, int64_t i0, int64_t width, const TX* x_end,
                    const TX* dy_end, double* part_w, double* part_b) {
  using Bk = Block<TX, NV>;
  using S = typename Bk::S;
  using C = typename Bk::C;
  using V = typename Bk::V;
  constexpr int64_t W = S::kWidth;
  const int64_t n = p.n, inner = p.inner;
  const TX* x = static_cast<const TX*>(p.x) + o * p.x_outer_stride + i0;
  const TX* dy = static_cast<const TX*>(p.dy) + o * p.dy_outer_stride + i0;
  const TW* w = static_cast<const TW*>(p.weight);
  TX* dx = p.dx ? static_cast<TX*>(p.dx) + o * n * inner + i0 : nullptr;
  V ref[NV], off[NV], rstd[NV];
  if (p.rstd) {
    C r_l[Bk::kLanes] = {}, o_l[Bk::kLanes] = {}, s_l[Bk::kLanes] = {};
    for (int64_t l = 0; l < width; ++l) {
      const auto k = saved_coeffs<TX>(p, o * inner + i0 + l);
      r_l[l] = k.ref;
      s_l[l] = k.rstd;
    }
    for (int q = 0; q < NV; ++q) {
      ref[q] = V::loadu(r_l + q * W);
      off[q] = V::loadu(o_l + q * W);
      rstd[q] = V::loadu(s_l + q * W);
    }
  } else {
    block_coeffs<TX, NV>(x, n, inner, width, std::min(Bk::kLanes, inner - i0 - width), x_end, kRms, p.eps, ref,
                         off, rstd);
  }
  auto row = [&](int64_t j, V* g, V* xhat, V* dyv) {
    load_block_row<TX, NV>(x + j * inner, width, x_end, xhat);
    load_block_row<TX, NV>(dy + j * inner, width, dy_end, dyv);
    const V wj(kW ? static_cast<C>(w[j]) : C(1));
    for (int q = 0; q < NV; ++q) {
      xhat[q] = ((xhat[q] - ref[q]) - off[q]) * rstd[q];
      g[q] = kW ? dyv[q] * wj : dyv[q];
    }
  };
  // Per-lane sums of g and g * xhat over j: fp32 vectors per chunk of rows, chunks added in double.
  V a[NV], c[NV];
  {
    double tg[Bk::kLanes] = {}, tgx[Bk::kLanes] = {};
    V sg[NV], sgx[NV];
    for (int64_t j0 = 0; j0 < n; j0 += Bk::kRowsPerChunk) {
      for (int q = 0; q < NV; ++q) sg[q] = sgx[q] = V(0);
      for (int64_t j = j0, j1 = std::min(n, j0 + Bk::kRowsPerChunk); j < j1; ++j) {
        V g[NV], xhat[NV], dyv[NV];
        row(j, g, xhat, dyv);
        for (int q = 0; q < NV; ++q) {
          sg[q] = sg[q] + g[q];
          sgx[q] = at::vec::fmadd(g[q], xhat[q], sgx[q]);
        }
      }
      C lg[Bk::kLanes], lgx[Bk::kLanes];
      for (int q = 0; q < NV; ++q) {
        sg[q].store(lg + q * W);
        sgx[q].store(lgx + q * W);
      }
      for (int64_t l = 0; l < Bk::kLanes; ++l) {
        tg[l] += double(lg[l]);
        tgx[l] += double(lgx[l]);
      }
    }
    C la[Bk::kLanes], lc[Bk::kLanes];
    for (int64_t l = 0; l < Bk::kLanes; ++l) {
      la[l] = kRms ? C(0) : C(tg[l] / double(n));
      lc[l] = C(tgx[l] / double(n));
    }
    for (int q = 0; q < NV; ++q) {
      a[q] = V::loadu(la + q * W);
      c[q] = V::loadu(lc + q * W);
    }
  }
  // One block per slab: a row's dx may be stored whole past width, as in the forward's write_block.
  const TX* store_end = dx && width == inner ? static_cast<TX*>(p.dx) + (o + 1) * n * inner : dx;
  const V zero(C(0));
  for (int64_t j = 0; j < n; ++j) {
    V g[NV], xhat[NV], dyv[NV];
    row(j, g, xhat, dyv);
    if (dx) {
      TX* dxj = dx + j * inner;
      for (int q = 0; q < NV; ++q) g[q] = rstd[q] * ((g[q] - a[q]) - xhat[q] * c[q]);
      store_block_row<TX, NV>(dxj, width, store_end, g);
    }
    if (part_w || part_b) {
      V tw = zero, tb = zero;
      for (int q = 0; q < NV && q * W < width; ++q) {
        V d = dyv[q], dxh = dyv[q] * xhat[q];
        if (width - q * W < W) {  // lanes past width hold other elements
          d = V::set(zero, d, width - q * W);
          dxh = V::set(zero, dxh, width - q * W);
        }
        tw = tw + dxh;
        tb = tb + d;
      }
      if (part_w) part_w[j] += lane_sum(tw);
      if (part_b) part_b[j] += lane_sum(tb);
    }
  }
}

template <class TX, class TW, bool kRms, bool kW, int NV>
void backward_channel_blocks(const NormBackwardParams& p, double* partials) {
  using Bk = Block<TX, NV>;
  const int64_t n = p.n, inner = p.inner, sums = param_sums(p);
  const int64_t blocks = ceil_div(inner, Bk::kLanes);
  const TX* x_end = static_cast<const TX*>(p.x) + (p.outer - 1) * p.x_outer_stride + n * inner;
  const TX* dy_end = static_cast<const TX*>(p.dy) + (p.outer - 1) * p.dy_outer_stride + n * inner;
  const Groups groups = split_groups(p.outer * blocks);
  at::parallel_for(0, groups.count, 1, [&](int64_t gbegin, int64_t gend) {
    for (int64_t g = gbegin; g < gend; ++g) {
      double* part = sums ? partials + g * sums * n : nullptr;
      if (part) std::fill(part, part + sums * n, 0.0);
      double* part_w = p.dweight ? part : nullptr;
      double* part_b = p.dbias ? part + (p.dweight ? n : 0) : nullptr;
      for (int64_t t = g * groups.per, t1 = std::min(p.outer * blocks, t + groups.per); t < t1; ++t) {
        const int64_t o = t / blocks, i0 = (t % blocks) * Bk::kLanes;
        block_backward<TX, TW, kRms, kW, NV>(p, o, i0, std::min(Bk::kLanes, inner - i0), x_end, dy_end, part_w,
                                             part_b);
      }
    }
  });
  if (sums) finish_params<TW>(p, partials, groups.count);
}

template <class TX, class TW, bool kRms, bool kW>
void backward_channels(const NormBackwardParams& p, double* partials) {
  constexpr int64_t W = Step<TX>::kWidth;
  if constexpr (Step<TX>::kParts == 1) {
    if (p.inner <= W) return backward_channel_blocks<TX, TW, kRms, kW, 1>(p, partials);
  }
  if (p.inner <= 2 * W) backward_channel_blocks<TX, TW, kRms, kW, 2>(p, partials);
  else if (p.inner <= 4 * W || p.inner > 8 * W) backward_channel_blocks<TX, TW, kRms, kW, 4>(p, partials);
  else backward_channel_blocks<TX, TW, kRms, kW, 8>(p, partials);
}

template <class TX, class TW, bool kRms, bool kW>
void backward_layout(const NormBackwardParams& p, double* partials) {
  if (by_columns(p)) backward_columns<TX, TW, kRms, kW>(p);
  else if (p.inner == 1) backward_rows<TX, TW, kRms, kW>(p, partials);
  else backward_channels<TX, TW, kRms, kW>(p, partials);
}

const char* backward_simd(const NormBackwardParams& p, double* partials) {
  return dispatch_dtypes(p.dtype, p.wdtype, p.weight || p.dweight || p.dbias, [&](auto tx, auto tw) {
    using TX = typename decltype(tx)::type;
    using TW = typename decltype(tw)::type;
    if (p.rms) {
      if (p.weight) backward_layout<TX, TW, true, true>(p, partials);
      else backward_layout<TX, TW, true, false>(p, partials);
    } else {
      if (p.weight) backward_layout<TX, TW, false, true>(p, partials);
      else backward_layout<TX, TW, false, false>(p, partials);
    }
  });
}

}  // namespace
FASTNORM_SIMD_END

int64_t fastnorm_cpu_backward_workspace_bytes(const NormBackwardParams& p) {
  return workspace_doubles(p) * int64_t(sizeof(double));
}

const char* fastnorm_cpu_backward(const NormBackwardParams& p) {
  if (p.outer < 0 || p.n < 0 || p.inner < 0) return "fastnorm_cpu_backward: negative size";
  if (p.rms && p.dbias) return "fastnorm_cpu_backward: RMSNorm has no bias";
  if ((p.dweight || p.dbias) && p.wdtype == FN_NONE) return "fastnorm_cpu_backward: dweight/dbias need wdtype";
  if (!p.rms && (p.mean == nullptr) != (p.rstd == nullptr))
    return "fastnorm_cpu_backward: LayerNorm needs both saved mean and rstd, or neither";
  if (p.n == 0) return nullptr;  // dx, dweight and dbias are all empty
  if (p.outer == 0 || p.inner == 0) {  // no elements: dweight / dbias are sums over nothing
    if (!p.dweight && !p.dbias) return nullptr;
    return fastnorm_cpu::dispatch_dtypes(p.dtype, p.wdtype, true, [&](auto, auto tw) {
      using TW = typename decltype(tw)::type;
      for (void* out : {p.dweight, p.dbias})
        if (out) std::fill(static_cast<TW*>(out), static_cast<TW*>(out) + p.n, TW(0));
    });
  }
  if (!p.x || !p.dy) return "fastnorm_cpu_backward: null x or dy";
  const int64_t doubles = workspace_doubles(p);
  std::unique_ptr<double[]> own;  // not zeroed: every group zeroes its own partial
  double* partials = static_cast<double*>(p.workspace);
  if (doubles > 0 && (!partials || p.workspace_bytes < doubles * int64_t(sizeof(double)))) {
    if (partials) return "fastnorm_cpu_backward: workspace smaller than fastnorm_cpu_backward_workspace_bytes";
    own.reset(new double[doubles]);
    partials = own.get();
  }
  if (fastnorm_cpu::simd_available()) return backward_simd(p, partials);
  return fastnorm_cpu::dispatch_dtypes(p.dtype, p.wdtype, p.weight || p.dweight || p.dbias, [&](auto tx, auto tw) {
    backward_scalar<typename decltype(tx)::type, typename decltype(tw)::type>(p, partials);
  });
}
