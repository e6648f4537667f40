// CPU kernels of the normalization family (GroupNorm, InstanceNorm, BatchNorm, L1 / L2 / Frobenius):
// the statistics of sets of contiguous runs of x, then y = (x - center) * scale + offset per row, as
// family_params.h describes.
//
// Each set is cut into pieces of at most kChunk elements (part of one long run, or several short
// runs); pieces are computed in parallel and fold into their set in piece order (Chan's formula in
// double, see cpu_vec.h's Moments), so results do not depend on the thread count. The run-level work
// (sums, output) is at::vec code where the CPU has the vector units, else portable scalar code.
#include <cmath>
#include <limits>
#include <vector>

#include "cpu_vec.h"
#include "family_params.h"
#include "kernel_set.h"

namespace {

using fastnorm_cpu::ceil_div;
using fastnorm_cpu::kChunk;
using fastnorm_cpu::kParallelMinWork;
using fastnorm_cpu::Moments;

// Sums over one run, in the form Moments::add takes: deviations from `center` (sq = sum of squares,
// lin = plain sum); for the p-norm statistics, sq holds the sum of |x| or of x^2.
struct RunSums {
  double center, sq, lin;
};

// The output map of one row: y = (x - center) * scale + offset.
struct Coeff {
  double center, scale, offset;
};

// The SiLU epilogue (FN_ACT_SILU): z * sigmoid(z), written z / (1 + exp(-z)), which goes to -0 where exp
// overflows and keeps NaN.
inline double silu(double z) { return z / (1.0 + std::exp(-z)); }

// Portable run operations: double arithmetic, one element at a time.
template <class T>
struct ScalarRuns {
  static RunSums mean_var(const T* x, int64_t len) {
    const double center = static_cast<double>(x[0]);
    double sq = 0.0, lin = 0.0;
    for (int64_t e = 0; e < len; ++e) {
      const double d = static_cast<double>(x[e]) - center;
      sq += d * d;
      lin += d;
    }
    return {center, sq, lin};
  }
  static RunSums abs_sum(const T* x, int64_t len) {
    double s = 0.0;
    for (int64_t e = 0; e < len; ++e) s += std::fabs(static_cast<double>(x[e]));
    return {0.0, s, 0.0};
  }
  static RunSums square_sum(const T* x, int64_t len) {
    double s = 0.0;
    for (int64_t e = 0; e < len; ++e) s += static_cast<double>(x[e]) * static_cast<double>(x[e]);
    return {0.0, s, 0.0};
  }
  static void apply(const T* x, T* y, int64_t len, const Coeff& k) {
    for (int64_t e = 0; e < len; ++e) y[e] = static_cast<T>((static_cast<double>(x[e]) - k.center) * k.scale + k.offset);
  }
  static void apply_silu(const T* x, T* y, int64_t len, const Coeff& k) {
    for (int64_t e = 0; e < len; ++e) y[e] = static_cast<T>(silu((static_cast<double>(x[e]) - k.center) * k.scale + k.offset));
  }
};

}  // namespace

FASTNORM_SIMD_BEGIN
namespace {

using namespace fastnorm_cpu;

// Vector run operations (at::vec), float accumulation (double for float64) within a run of at most
// kChunk elements; the same centering as the LayerNorm kernels (chunk_stats).
template <class T>
struct VectorRuns {
  static RunSums mean_var(const T* x, int64_t len) {
    const ChunkStats c = chunk_stats(x, len, false);
    return {c.center, c.sq, c.lin};
  }
  static RunSums square_sum(const T* x, int64_t len) { return {0.0, chunk_stats(x, len, true).sq, 0.0}; }
  static RunSums abs_sum(const T* x, int64_t len) {
    using S = Step<T>;
    using V = typename S::V;
    V acc[S::kParts];
    for (int q = 0; q < S::kParts; ++q) acc[q] = V(0);
    for_each_step<T>(len, [&](const StepSpan& s) {
      V v[S::kParts];
      load_span(x, s, v);
      keep_lanes<T>(v, s.first, s.last);  // the last step's lanes seen before must not count twice
      for (int q = 0; q < S::kParts; ++q) acc[q] = acc[q] + v[q].abs();
    });
    double total = 0.0;
    for (int q = 0; q < S::kParts; ++q) total += lane_sum(acc[q]);
    return {0.0, total, 0.0};
  }
  static void apply(const T* x, T* y, int64_t len, const Coeff& k) {
    using S = Step<T>;
    using V = typename S::V;
    using C = typename S::C;
    const V center(static_cast<C>(k.center)), scale(static_cast<C>(k.scale)), offset(static_cast<C>(k.offset));
    for_each_step<T>(len, [&](const StepSpan& s) {
      V v[S::kParts];
      load_span(x, s, v);
      for (int q = 0; q < S::kParts; ++q) v[q] = at::vec::fmadd(v[q] - center, scale, offset);
      store_span(y, s, v);
    });
  }
  // The same with SiLU applied in the compute type before the store (one pass over x and y).
  static void apply_silu(const T* x, T* y, int64_t len, const Coeff& k) {
    using S = Step<T>;
    using V = typename S::V;
    using C = typename S::C;
    const V center(static_cast<C>(k.center)), scale(static_cast<C>(k.scale)), offset(static_cast<C>(k.offset));
    const V one(static_cast<C>(1)), zero(static_cast<C>(0));
    for_each_step<T>(len, [&](const StepSpan& s) {
      V v[S::kParts];
      load_span(x, s, v);
      for (int q = 0; q < S::kParts; ++q) {
        const V z = at::vec::fmadd(v[q] - center, scale, offset);
        v[q] = z / (one + (zero - z).exp());
      }
      store_span(y, s, v);
    });
  }
};

// Out-of-line entry points: the driver below is compiled for the baseline instruction set and calls
// the vector code only where simd_available().
template <class T> RunSums vector_mean_var(const T* x, int64_t len) { return VectorRuns<T>::mean_var(x, len); }
template <class T> RunSums vector_abs_sum(const T* x, int64_t len) { return VectorRuns<T>::abs_sum(x, len); }
template <class T> RunSums vector_square_sum(const T* x, int64_t len) { return VectorRuns<T>::square_sum(x, len); }
template <class T> void vector_apply(const T* x, T* y, int64_t len, const Coeff& k) { VectorRuns<T>::apply(x, y, len, k); }
template <class T> void vector_apply_silu(const T* x, T* y, int64_t len, const Coeff& k) {
  VectorRuns<T>::apply_silu(x, y, len, k);
}

}  // namespace
FASTNORM_SIMD_END

namespace {

// The run operations of one input type, vector or scalar, chosen once per call.
template <class T>
struct RunOps {
  RunSums (*sums)(const T*, int64_t);
  void (*apply)(const T*, T*, int64_t, const Coeff&);
};

template <class T>
RunOps<T> run_ops(int stat, int activation) {
  const bool simd = fastnorm_cpu::simd_available();
  RunOps<T> ops;
  if (stat == FN_STAT_MEAN_VAR) ops.sums = simd ? &vector_mean_var<T> : &ScalarRuns<T>::mean_var;
  else if (stat == FN_STAT_ABS_SUM) ops.sums = simd ? &vector_abs_sum<T> : &ScalarRuns<T>::abs_sum;
  else ops.sums = simd ? &vector_square_sum<T> : &ScalarRuns<T>::square_sum;
  if (activation == FN_ACT_SILU) ops.apply = simd ? &vector_apply_silu<T> : &ScalarRuns<T>::apply_silu;
  else ops.apply = simd ? &vector_apply<T> : &ScalarRuns<T>::apply;
  return ops;
}

// Statistics of a piece or a set so far: Moments for mean / variance, a plain sum for the p-norms.
struct Partial {
  Moments m;
  double sum = 0.0;
  int64_t count = 0;

  void add_run(const RunSums& r, int64_t len, bool mean_var) {
    if (mean_var) m.add(len, r.center, r.sq, r.lin);
    else sum += r.sq;
    count += len;
  }
  void add(const Partial& o, bool mean_var) {
    if (o.count == 0) return;
    if (mean_var) {  // o as sums about its own reference: lin = off * n, sq = m2 + off * lin
      const double lin = o.m.off * double(o.m.count);
      m.add(o.m.count, o.m.ref, o.m.m2 + o.m.off * lin, lin);
    } else {
      sum += o.sum;
    }
    count += o.count;
  }
};

// Runs and rows shorter than this are summed / written element by element in one loop (a call per
// run costs more than the run).
constexpr int64_t kShortRun = 16;

// Sums of runs [j0, j1) of len < kShortRun elements, `stride` apart, in double (as RunSums).
template <class T>
RunSums short_runs_sums(const T* base, int64_t j0, int64_t j1, int64_t stride, int64_t len, int stat) {
  const double center = stat == FN_STAT_MEAN_VAR ? static_cast<double>(base[j0 * stride]) : 0.0;
  double sq = 0.0, lin = 0.0;
  for (int64_t j = j0; j < j1; ++j) {
    for (int64_t e = 0; e < len; ++e) {
      const double v = static_cast<double>(base[j * stride + e]);
      if (stat == FN_STAT_MEAN_VAR) {
        sq += (v - center) * (v - center);
        lin += v - center;
      } else {
        sq += stat == FN_STAT_ABS_SUM ? std::fabs(v) : v * v;
      }
    }
  }
  return {center, sq, lin};
}

// Pieces of a set: a long run is cut into kChunk pieces; short runs are grouped, kChunk elements
// (at least one run) a piece.
struct Pieces {
  int64_t per_run = 0, runs_per_piece = 1, per_set = 0;

  explicit Pieces(const FamilyParams& p) {
    if (p.run_len >= kChunk) {
      per_run = ceil_div(p.run_len, kChunk);
      per_set = p.runs * per_run;
    } else {
      runs_per_piece = std::max<int64_t>(1, kChunk / p.run_len);
      per_set = ceil_div(p.runs, runs_per_piece);
    }
  }

  template <class T>
  Partial compute(const FamilyParams& p, const T* x, int64_t set, int64_t q, const RunOps<T>& ops) const {
    const bool mean_var = p.stat == FN_STAT_MEAN_VAR;
    const T* base = x + set * p.set_stride;
    Partial part;
    if (per_run > 0) {
      const int64_t j = q / per_run, lo = (q % per_run) * kChunk;
      const int64_t len = std::min(kChunk, p.run_len - lo);
      part.add_run(ops.sums(base + j * p.run_stride + lo, len), len, mean_var);
      return part;
    }
    const int64_t j0 = q * runs_per_piece, j1 = std::min(p.runs, j0 + runs_per_piece);
    if (p.run_len < kShortRun) {  // BatchNorm1d's (N, C): one sum over the piece, not a call per element
      part.add_run(short_runs_sums(base, j0, j1, p.run_stride, p.run_len, p.stat), (j1 - j0) * p.run_len, mean_var);
      return part;
    }
    for (int64_t j = j0; j < j1; ++j) part.add_run(ops.sums(base + j * p.run_stride, p.run_len), p.run_len, mean_var);
    return part;
  }
};

using fastnorm_cpu::param_at;

template <class A>
void store_stats(const FamilyParams& p, const std::vector<double>& mean, const std::vector<double>& var) {
  for (int64_t k = 0; k < p.stats; ++k) {
    static_cast<A*>(p.mean)[k] = static_cast<A>(mean[k]);
    if (p.var && p.stat == FN_STAT_MEAN_VAR) static_cast<A*>(p.var)[k] = static_cast<A>(var[k]);
  }
}

// Statistics of every set: ref + off (the mean, split as Moments keeps it) and the biased variance,
// or the norm in `ref`.
template <class T>
void set_statistics(const FamilyParams& p, const RunOps<T>& ops, std::vector<double>* ref, std::vector<double>* off,
                    std::vector<double>* var) {
  const T* x = static_cast<const T*>(p.x);
  const bool mean_var = p.stat == FN_STAT_MEAN_VAR;
  const Pieces pieces(p);
  std::vector<Partial> parts(p.stats * pieces.per_set);
  at::parallel_for(0, int64_t(parts.size()), std::max<int64_t>(1, kParallelMinWork / kChunk), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) parts[t] = pieces.compute(p, x, t / pieces.per_set, t % pieces.per_set, ops);
  });
  at::parallel_for(0, p.stats, std::max<int64_t>(1, 1024 / pieces.per_set), [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      Partial total;
      for (int64_t q = 0; q < pieces.per_set; ++q) total.add(parts[k * pieces.per_set + q], mean_var);
      if (mean_var) {
        (*ref)[k] = total.m.ref;
        (*off)[k] = total.m.off;
        (*var)[k] = fastnorm_cpu::clamp_variance(total.m.m2, total.m.count);
      } else {
        const double s = p.p_mean ? total.sum / double(total.count) : total.sum;
        (*ref)[k] = p.stat == FN_STAT_SQUARE_SUM ? std::sqrt(s) : s;
      }
    }
  });
}

// L1 / L2 rows of at most this many bytes take cached_p_norm_rows: a core's L2 holds one.
constexpr int64_t kCachedRowBytes = 1 << 20;

// L1 / L2 normalization of whole rows (one run a set) that fit a core's cache: a task takes a row's sum,
// then writes the row while it is still cached, so x is read from memory once (the statistics pass and the
// output pass read it twice). The same pieces, folded in the same order as set_statistics: the same bits.
template <class T>
bool cached_p_norm_rows(const FamilyParams& p, const RunOps<T>& ops) {
  using A = fastnorm_cpu::compute_t<T>;
  if (p.stat == FN_STAT_MEAN_VAR || p.given_stats || p.runs != 1 || p.run_len != p.row_len || p.coeffs != p.stats ||
      p.row_len * int64_t(sizeof(T)) > kCachedRowBytes || p.row_len < kShortRun) {
    return false;
  }
  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  const Pieces pieces(p);
  at::parallel_for(0, p.stats, std::max<int64_t>(1, kParallelMinWork / p.row_len), [&](int64_t b, int64_t e) {
    for (int64_t k = b; k < e; ++k) {
      Partial total;
      for (int64_t q = 0; q < pieces.per_set; ++q) total.add(pieces.compute(p, x, k, q, ops), false);
      const double s = p.p_mean ? total.sum / double(total.count) : total.sum;
      const double norm = p.stat == FN_STAT_SQUARE_SUM ? std::sqrt(s) : s;
      static_cast<A*>(p.mean)[k] = static_cast<A>(norm);
      const Coeff coeff{0.0, 1.0 / std::max(norm, p.eps), 0.0};
      for (int64_t lo = 0; lo < p.row_len; lo += kChunk) {
        ops.apply(x + k * p.row_len + lo, y + k * p.row_len + lo, std::min(kChunk, p.row_len - lo), coeff);
      }
    }
  });
  return true;
}

template <class T>
const char* family_forward(const FamilyParams& p) {
  using A = fastnorm_cpu::compute_t<T>;
  const RunOps<T> ops = run_ops<T>(p.stat, p.activation);
  const bool mean_var = p.stat == FN_STAT_MEAN_VAR;
  if (cached_p_norm_rows(p, ops)) return nullptr;
  std::vector<double> ref(p.stats), off(p.stats, 0.0), var(p.stats, 0.0);
  if (p.given_stats) {
    for (int64_t k = 0; k < p.stats; ++k) {
      ref[k] = static_cast<const A*>(p.mean)[k];
      var[k] = static_cast<const A*>(p.var)[k];
    }
  } else {
    set_statistics(p, ops, &ref, &off, &var);
    std::vector<double> mean(p.stats);
    for (int64_t k = 0; k < p.stats; ++k) mean[k] = ref[k] + off[k];
    store_stats<A>(p, mean, var);
  }

  // Coefficients: the affine parameters folded in; the mean's small part `off` goes into the offset so
  // that x - center stays exact near the mean (x + 1000).
  std::vector<Coeff> coeffs(p.coeffs);
  const int64_t per_group = p.channels / p.groups;
  for (int64_t c = 0; c < p.coeffs; ++c) {
    const int64_t ch = c % p.channels, k = (c / p.channels) * p.groups + ch / per_group;
    if (mean_var) {
      const double w = p.weight ? param_at(p.weight, p.wdtype, ch) : 1.0;
      const double b = p.bias ? param_at(p.bias, p.wdtype, ch) : 0.0;
      const double scale = w / std::sqrt(var[k] + p.eps);
      coeffs[c] = {ref[k], scale, b - off[k] * scale};  // ref: a value of A (a chunk's center, or given)
    } else {
      coeffs[c] = {0.0, 1.0 / std::max(ref[k], p.eps), 0.0};
    }
  }

  const T* x = static_cast<const T*>(p.x);
  T* y = static_cast<T*>(p.y);
  const int64_t rows = p.numel / p.row_len, per_row = ceil_div(p.row_len, kChunk);
  const bool silu_act = p.activation == FN_ACT_SILU;
  if (p.row_len < kShortRun) {  // short rows: one loop over consecutive elements, no call per row
    at::parallel_for(0, p.numel, kParallelMinWork, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const Coeff& k = coeffs[(i / p.row_len) % p.coeffs];
        const double z = (static_cast<double>(x[i]) - k.center) * k.scale + k.offset;
        y[i] = static_cast<T>(silu_act ? silu(z) : z);
      }
    });
    return nullptr;
  }
  const int64_t grain = std::max<int64_t>(1, kParallelMinWork / std::min(p.row_len, kChunk));
  at::parallel_for(0, rows * per_row, grain, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const int64_t r = t / per_row, lo = (t % per_row) * kChunk;
      const int64_t at = r * p.row_len + lo;
      ops.apply(x + at, y + at, std::min(kChunk, p.row_len - lo), coeffs[r % p.coeffs]);
    }
  });
  return nullptr;
}

}  // namespace

const char* fastnorm_cpu_family(const FamilyParams& p) {
  if (p.numel < 0 || p.stats < 0 || p.runs < 0 || p.run_len < 0 || p.row_len < 0) return "fastnorm_cpu_family: negative size";
  if (p.numel == 0) return nullptr;
  if (!p.x || !p.y || (!p.given_stats && !p.mean) || p.row_len == 0 || p.run_len == 0 || p.channels <= 0 ||
      p.groups <= 0 || p.channels % p.groups != 0 || p.numel % p.row_len != 0) {
    return "fastnorm_cpu_family: inconsistent parameters";
  }
  if (p.activation != FN_ACT_NONE && p.activation != FN_ACT_SILU) return "fastnorm_cpu_family: unknown activation";
  switch (p.dtype) {
#ifdef FASTNORM_WANT_F32
    case FN_F32: return family_forward<float>(p);
#endif
#ifdef FASTNORM_WANT_F64
    case FN_F64: return family_forward<double>(p);
#endif
#ifdef FASTNORM_WANT_F16
    case FN_F16: return family_forward<c10::Half>(p);
#endif
#ifdef FASTNORM_WANT_BF16
    case FN_BF16: return family_forward<c10::BFloat16>(p);
#endif
    default: return fastnorm_dtype_not_built(p.dtype, "fastnorm_cpu_family: unsupported dtype");
  }
}
