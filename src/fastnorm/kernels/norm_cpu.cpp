// CPU (OpenMP) LayerNorm / RMSNorm forward over the (outer, n, inner) view described in norm_params.h.
//
// Accuracy first: every element is widened to double, statistics are accumulated in double with a
// two-pass (mean, then squared deviations) scheme and chunked (cascaded) sums, and each output is
// rounded exactly once from double to the output dtype. No PyTorch headers, so this compiles fast.
// Results do not depend on the thread count (partial sums are always combined in chunk order).
// NormParams' threads / blocks_per_row / workspace are CUDA tuning knobs and are ignored here.
#include "norm_params.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

namespace {

// ---------------------------------------------------------------------------------------------
// 16-bit float formats, converted bit by bit (no dependency on compiler half types).

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

inline float float_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    const float mag = float(mant) * 5.9604644775390625e-8f;
    return sign ? -mag : mag;
  }
  if (exp == 0x1f) return float_from_bits(sign | 0x7f800000u | (mant << 13));  // Inf / NaN
  return float_from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

inline float bfloat16_to_float(uint16_t b) { return float_from_bits(uint32_t(b) << 16); }

// Rounds a double straight to a narrow binary float format (round to nearest, ties to even) in a
// single step, so no double rounding through float. kMant = stored mantissa bits, kBias = exponent
// bias, kExpMax = the all-ones exponent field (Inf/NaN).
template <int kMant, int kBias, int kExpMax>
inline uint16_t double_to_narrow(double v) {
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  const uint16_t sign = uint16_t((u >> 63) << 15);
  const int dexp = int((u >> 52) & 0x7ff);
  const uint64_t dmant = u & ((uint64_t(1) << 52) - 1);
  const uint16_t inf = uint16_t(kExpMax << kMant);
  if (dexp == 0x7ff) return dmant ? uint16_t(sign | inf | (1u << (kMant - 1))) : uint16_t(sign | inf);
  if (dexp == 0) return sign;  // double zero/subnormal: far below the narrow format's range
  const int e = dexp - 1023;   // unbiased exponent
  const int max_e = kExpMax - 1 - kBias;
  const int min_e = 1 - kBias;
  if (e > max_e) return uint16_t(sign | inf);
  const uint64_t sig = dmant | (uint64_t(1) << 52);
  const int shift = (52 - kMant) + std::max(0, min_e - e);  // extra shift for subnormal results
  if (shift > 62) return sign;                               // < half the smallest subnormal
  uint64_t rounded = sig >> shift;
  const uint64_t rem = sig & ((uint64_t(1) << shift) - 1);
  const uint64_t halfway = uint64_t(1) << (shift - 1);
  if (rem > halfway || (rem == halfway && (rounded & 1))) ++rounded;
  // `rounded` carries the implicit bit (2^kMant) for normal results, which adds one to the exponent
  // field; a mantissa carry rolls into the exponent (or into Inf) by plain addition.
  const uint64_t exp_field = uint64_t(std::max(e + kBias - 1, 0)) << kMant;
  return uint16_t(sign | uint16_t(exp_field + rounded));
}

inline double load(const float* p, int64_t k) { return double(p[k]); }
inline double load(const double* p, int64_t k) { return p[k]; }
inline double load(const Half* p, int64_t k) { return double(half_to_float(p[k].bits)); }
inline double load(const BFloat16* p, int64_t k) { return double(bfloat16_to_float(p[k].bits)); }

inline void store(float* p, int64_t k, double v) { p[k] = float(v); }
inline void store(double* p, int64_t k, double v) { p[k] = v; }
inline void store(Half* p, int64_t k, double v) { p[k].bits = double_to_narrow<10, 15, 0x1f>(v); }
inline void store(BFloat16* p, int64_t k, double v) { p[k].bits = double_to_narrow<7, 127, 0xff>(v); }

// ---------------------------------------------------------------------------------------------
// Scheduling helpers.

constexpr int64_t kChunk = 4096;          // cascaded-sum chunk along a row (also the parallel grain)
constexpr int64_t kBlock = 128;           // consecutive inner positions handled together
constexpr int64_t kParallelMinWork = 32768;  // below this many elements, threads cost more than they save

inline int max_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------
// inner == 1: each row is n contiguous elements.

// Sum of x[begin, end) with independent accumulators (ILP, and a little extra accuracy).
template <class TX>
inline double chunk_sum(const TX* x, int64_t begin, int64_t end) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t k = begin;
  for (; k + 4 <= end; k += 4) {
    a0 += load(x, k);
    a1 += load(x, k + 1);
    a2 += load(x, k + 2);
    a3 += load(x, k + 3);
  }
  for (; k < end; ++k) a0 += load(x, k);
  return (a0 + a1) + (a2 + a3);
}

// Sum of squares of (x - shift) and sum of (x - shift) over [begin, end).
template <class TX>
inline void chunk_sq_sum(const TX* x, int64_t begin, int64_t end, double shift, double& sq,
                         double& lin) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0, l0 = 0, l1 = 0;
  int64_t k = begin;
  for (; k + 4 <= end; k += 4) {
    const double d0 = load(x, k) - shift, d1 = load(x, k + 1) - shift;
    const double d2 = load(x, k + 2) - shift, d3 = load(x, k + 3) - shift;
    s0 += d0 * d0;
    s1 += d1 * d1;
    s2 += d2 * d2;
    s3 += d3 * d3;
    l0 += d0 + d2;
    l1 += d1 + d3;
  }
  for (; k < end; ++k) {
    const double d = load(x, k) - shift;
    s0 += d * d;
    l0 += d;
  }
  sq = (s0 + s1) + (s2 + s3);
  lin = l0 + l1;
}

// Corrected two-pass variance: `sq` and `lin` are the sums of d^2 and d for d = x - mean; the lin
// term removes the rounding error left in the mean. Clamped at 0 without swallowing NaN (a row
// holding Inf or NaN must come out NaN, as in PyTorch).
inline double corrected_variance(double sq, double lin, double inv_n) {
  const double var = (sq - lin * lin * inv_n) * inv_n;
  return var < 0.0 ? 0.0 : var;
}

// Statistics of one row (or channel column): the mean as a rounded value plus its rounding error
// (lin / n from the corrected two-pass sums; both 0 for RMSNorm), and 1/sqrt(var + eps). The output
// subtracts both: x - mean is exact near the mean, so a large offset (x + 1000 in float64) costs no
// precision beyond the error term's (the rounded mean alone cost up to ~2 ulps of x, 5x PyTorch's
// error on 3 channels of std 0.09 at x + 1000).
struct RowStats {
  double mean, mean_err, rstd;
};

inline RowStats finish_stats(double mean, double sq, double lin, double inv_n, bool rms, double eps) {
  if (rms) return {0.0, 0.0, 1.0 / std::sqrt(sq * inv_n + eps)};
  return {mean, lin * inv_n, 1.0 / std::sqrt(corrected_variance(sq, lin, inv_n) + eps)};
}

inline double normalized(double x, const RowStats& s) { return ((x - s.mean) - s.mean_err) * s.rstd; }

template <class TX, class TW, bool kHasW, bool kHasB>
inline void write_range(const TX* x, TX* y, const TW* w, const TW* b, int64_t begin, int64_t end,
                        const RowStats& s) {
  for (int64_t k = begin; k < end; ++k) {
    double v = normalized(load(x, k), s);
    if (kHasW) v *= load(w, k);
    if (kHasB) v += load(b, k);
    store(y, k, v);
  }
}

template <class TX, class TW>
inline void write_range(const TX* x, TX* y, const TW* w, const TW* b, int64_t begin, int64_t end,
                        const RowStats& s) {
  if (w && b) write_range<TX, TW, true, true>(x, y, w, b, begin, end, s);
  else if (w) write_range<TX, TW, true, false>(x, y, w, b, begin, end, s);
  else if (b) write_range<TX, TW, false, true>(x, y, w, b, begin, end, s);
  else write_range<TX, TW, false, false>(x, y, w, b, begin, end, s);
}

// Row statistics from per-chunk partial sums computed in chunk order. Summing the partials in a
// fixed order makes the result independent of thread count.
template <class TX>
RowStats row_stats_serial(const TX* x, int64_t n, bool rms, double eps) {
  const double inv_n = 1.0 / double(n);
  if (rms) {
    double sq_total = 0, lin;
    for (int64_t c = 0; c < n; c += kChunk) {
      double sq;
      chunk_sq_sum(x, c, std::min(n, c + kChunk), 0.0, sq, lin);
      sq_total += sq;
    }
    return finish_stats(0.0, sq_total, 0.0, inv_n, true, eps);
  }
  double total = 0;
  for (int64_t c = 0; c < n; c += kChunk) total += chunk_sum(x, c, std::min(n, c + kChunk));
  const double mean = total * inv_n;
  double sq_total = 0, lin_total = 0;
  for (int64_t c = 0; c < n; c += kChunk) {
    double sq, lin;
    chunk_sq_sum(x, c, std::min(n, c + kChunk), mean, sq, lin);
    sq_total += sq;
    lin_total += lin;
  }
  return finish_stats(mean, sq_total, lin_total, inv_n, false, eps);
}

// Same statistics, with the chunks of one long row spread over the threads.
template <class TX>
RowStats row_stats_parallel(const TX* x, int64_t n, bool rms, double eps) {
  const int64_t chunks = ceil_div(n, kChunk);
  const double inv_n = 1.0 / double(n);
  std::vector<double> sq(chunks), lin(chunks);
  double mean = 0;
  if (!rms) {
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c)
      lin[c] = chunk_sum(x, c * kChunk, std::min(n, (c + 1) * kChunk));
    double total = 0;
    for (int64_t c = 0; c < chunks; ++c) total += lin[c];
    mean = total * inv_n;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c)
    chunk_sq_sum(x, c * kChunk, std::min(n, (c + 1) * kChunk), mean, sq[c], lin[c]);
  double sq_total = 0, lin_total = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    sq_total += sq[c];
    lin_total += lin[c];
  }
  return finish_stats(mean, sq_total, lin_total, inv_n, rms, eps);
}

template <class TX, class TW>
void forward_rows(const NormParams& p) {
  const TX* x = static_cast<const TX*>(p.x);
  TX* y = static_cast<TX*>(p.y);
  const TW* w = static_cast<const TW*>(p.weight);
  const TW* b = static_cast<const TW*>(p.bias);
  const int64_t n = p.n, outer = p.outer, stride = p.x_outer_stride;
  const int threads = max_threads();
  // Few long rows: parallelize inside each row instead of across rows.
  if (threads > 1 && outer < 2 * int64_t(threads) && n >= 4 * kChunk) {
    const int64_t chunks = ceil_div(n, kChunk);
    for (int64_t o = 0; o < outer; ++o) {
      const TX* xr = x + o * stride;
      TX* yr = y + o * n;
      const RowStats s = row_stats_parallel(xr, n, p.rms != 0, p.eps);
#pragma omp parallel for schedule(static)
      for (int64_t c = 0; c < chunks; ++c)
        write_range(xr, yr, w, b, c * kChunk, std::min(n, (c + 1) * kChunk), s);
    }
    return;
  }
  const bool parallel = outer > 1 && outer * n >= kParallelMinWork;
  (void)parallel;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t o = 0; o < outer; ++o) {
    const TX* xr = x + o * stride;
    const RowStats s = row_stats_serial(xr, n, p.rms != 0, p.eps);
    write_range(xr, y + o * n, w, b, 0, n, s);
  }
}

// ---------------------------------------------------------------------------------------------
// inner > 1: reduce over j for a block of up to kBlock consecutive inner positions at once, so
// every memory access runs contiguously along i (and the innermost loops vectorize).

template <class TX, class TW>
void forward_block(const TX* x, TX* y, const TW* w, const TW* b, int64_t n, int64_t inner,
                   int64_t width, bool rms, double eps) {
  double total[kBlock], part[kBlock], mean[kBlock], sq[kBlock], lin[kBlock];
  RowStats stats[kBlock];
  const double inv_n = 1.0 / double(n);
  for (int64_t ii = 0; ii < width; ++ii) mean[ii] = 0.0;
  if (!rms) {
    for (int64_t ii = 0; ii < width; ++ii) total[ii] = 0.0;
    for (int64_t j0 = 0; j0 < n; j0 += kChunk) {  // cascaded over chunks of j, as for rows
      for (int64_t ii = 0; ii < width; ++ii) part[ii] = 0.0;
      for (int64_t j = j0, j1 = std::min(n, j0 + kChunk); j < j1; ++j) {
        const TX* xj = x + j * inner;
        for (int64_t ii = 0; ii < width; ++ii) part[ii] += load(xj, ii);
      }
      for (int64_t ii = 0; ii < width; ++ii) total[ii] += part[ii];
    }
    for (int64_t ii = 0; ii < width; ++ii) mean[ii] = total[ii] * inv_n;
  }
  for (int64_t ii = 0; ii < width; ++ii) sq[ii] = lin[ii] = 0.0;
  for (int64_t j0 = 0; j0 < n; j0 += kChunk) {
    double part_lin[kBlock];
    for (int64_t ii = 0; ii < width; ++ii) part[ii] = part_lin[ii] = 0.0;
    for (int64_t j = j0, j1 = std::min(n, j0 + kChunk); j < j1; ++j) {
      const TX* xj = x + j * inner;
      for (int64_t ii = 0; ii < width; ++ii) {
        const double d = load(xj, ii) - mean[ii];
        part[ii] += d * d;
        part_lin[ii] += d;
      }
    }
    for (int64_t ii = 0; ii < width; ++ii) {
      sq[ii] += part[ii];
      lin[ii] += part_lin[ii];
    }
  }
  for (int64_t ii = 0; ii < width; ++ii) stats[ii] = finish_stats(mean[ii], sq[ii], lin[ii], inv_n, rms, eps);
  for (int64_t j = 0; j < n; ++j) {
    const TX* xj = x + j * inner;
    TX* yj = y + j * inner;
    const double wj = w ? load(w, j) : 1.0;
    const double bj = b ? load(b, j) : 0.0;
    for (int64_t ii = 0; ii < width; ++ii)
      store(yj, ii, normalized(load(xj, ii), stats[ii]) * wj + bj);
  }
}

template <class TX, class TW>
void forward_strided(const NormParams& p) {
  const TX* x = static_cast<const TX*>(p.x);
  TX* y = static_cast<TX*>(p.y);
  const TW* w = static_cast<const TW*>(p.weight);
  const TW* b = static_cast<const TW*>(p.bias);
  const int64_t n = p.n, inner = p.inner, stride = p.x_outer_stride;
  const int64_t blocks = ceil_div(inner, kBlock);
  const int64_t tasks = p.outer * blocks;
  const bool parallel = tasks > 1 && p.outer * n * inner >= kParallelMinWork;
  (void)parallel;
#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t o = t / blocks;
    const int64_t i0 = (t % blocks) * kBlock;
    const int64_t width = std::min(kBlock, inner - i0);
    forward_block(x + o * stride + i0, y + o * n * inner + i0, w, b, n, inner, width, p.rms != 0,
                  p.eps);
  }
}

template <class TX, class TW>
void forward_typed(const NormParams& p) {
  if (p.inner == 1) forward_rows<TX, TW>(p);
  else forward_strided<TX, TW>(p);
}

template <class TX>
const char* dispatch_weight(const NormParams& p) {
  const bool affine = p.weight != nullptr || p.bias != nullptr;
  switch (affine ? p.wdtype : FN_F32) {  // without weight and bias, the type is irrelevant
    case FN_F32: forward_typed<TX, float>(p); return nullptr;
    case FN_F64: forward_typed<TX, double>(p); return nullptr;
    case FN_F16: forward_typed<TX, Half>(p); return nullptr;
    case FN_BF16: forward_typed<TX, BFloat16>(p); return nullptr;
    default: return "fastnorm_cpu_forward: unsupported weight/bias dtype";
  }
}

}  // namespace

const char* fastnorm_cpu_forward(const NormParams& p) {
  if (p.outer < 0 || p.n < 0 || p.inner < 0) return "fastnorm_cpu_forward: negative size";
  if (p.outer == 0 || p.n == 0 || p.inner == 0) return nullptr;
  if (!p.x || !p.y) return "fastnorm_cpu_forward: null x or y";
  if (p.rms && p.bias) return "fastnorm_cpu_forward: RMSNorm takes no bias";
  switch (p.dtype) {
    case FN_F32: return dispatch_weight<float>(p);
    case FN_F64: return dispatch_weight<double>(p);
    case FN_F16: return dispatch_weight<Half>(p);
    case FN_BF16: return dispatch_weight<BFloat16>(p);
    default: return "fastnorm_cpu_forward: unsupported input dtype";
  }
}
