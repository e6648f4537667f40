// SIMD building blocks of the CPU kernels (forward and backward): ATen's at::vec::Vectorized for the
// arithmetic and the bf16/fp16 <-> float conversions, and the row / channel statistics both directions
// share, so a backward that recomputes the statistics gets exactly the forward's.
//
// Instruction set. On x86-64 with GCC the vector code is compiled for AVX2 + FMA + F16C inside
// FASTNORM_SIMD_BEGIN / FASTNORM_SIMD_END (a `#pragma GCC target` region: the extension's own flags
// stay baseline, as torch.utils.cpp_extension sets them), and the kernels call simd_available() first:
// a CPU without those falls back to the portable scalar kernels. Compiled with -mavx2 -mfma -mf16c, or
// on another architecture (NEON on ARM), at::vec picks its vectors from the compiler's flags and no
// region or runtime check is needed.
//
// Accuracy. Sums run in vector registers of the compute type (float for fp32/bf16/fp16 inputs, double
// for float64) over chunks of at most kChunk elements (L1-resident), centered on the chunk's first
// element, whose shift the sum of the deviations then corrects (a second pass centers on the mean when
// that element lies far out); chunks combine in double in chunk order (Chan's formula). The mean is
// kept in two parts, a value of the compute type (the first chunk's center) plus a small offset, so
// `(x - ref) - offset` is exact near the mean: a row at x + 1000 keeps its precision in float32 and
// float64 alike.
//
// Determinism. Chunk boundaries depend on the shape alone and chunks are combined in a fixed order,
// so results are bitwise the same for every thread count.
#pragma once

#include "kernel_set.h"
#include "norm_params.h"

// Everything the vector headers need besides themselves, included first so that it is compiled for
// the baseline instruction set like the other translation units (c10::Half's conversions, for one,
// depend on the CPU_CAPABILITY macros: one definition for the whole extension).
#include <limits>
#include <ATen/NumericUtils.h>
#include <ATen/Parallel.h>
#include <ATen/native/Math.h>
#include <ATen/native/cpu/zmath.h>
#include <ATen/native/quantized/AffineQuantizerBase.h>
#include <c10/macros/Macros.h>
#include <c10/util/BFloat16-math.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>
#include <c10/util/Load.h>
#include <c10/util/TypeCast.h>
#include <c10/util/copysign.h>
#include <c10/util/irange.h>
#include <c10/util/qint32.h>
#include <c10/util/qint8.h>
#include <c10/util/quint8.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)) && !defined(FASTNORM_CPU_BASELINE)
#define FASTNORM_SIMD_TARGETED 1
#define FASTNORM_SIMD_TARGET _Pragma("GCC target(\"avx2,fma,f16c\")")
#define CPU_CAPABILITY fastnorm_avx2  // our own namespace for the AVX2 build of at::vec
#define CPU_CAPABILITY_AVX2
#else
#define FASTNORM_SIMD_TARGETED 0
#define FASTNORM_SIMD_TARGET
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(CPU_CAPABILITY_AVX2) && \
    !defined(FASTNORM_CPU_BASELINE)
#define CPU_CAPABILITY_AVX2
#endif
#endif

// GCC fuses a * b + c across statements by default (-ffp-contract=fast): in the backward, dy * w
// fused into g - mean(g) left the rounding of g where n = 1 must give exactly 0 (times rstd = 316).
// FMAs are spelled out (at::vec::fmadd) where wanted. -Wpsabi: GCC notes that 256-bit vectors pass
// differently with AVX on; every such function is ours or at::vec's, inline and compiled under the
// same target (PyTorch builds with -Wno-psabi too).
#if defined(__GNUC__) && !defined(__clang__)
#define FASTNORM_SIMD_BEGIN                                                                   \
  _Pragma("GCC push_options") FASTNORM_SIMD_TARGET _Pragma("GCC optimize(\"fp-contract=off\")") \
      _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#define FASTNORM_SIMD_END _Pragma("GCC diagnostic pop") _Pragma("GCC pop_options")
#else
#define FASTNORM_SIMD_BEGIN
#define FASTNORM_SIMD_END
#endif

namespace fastnorm_cpu {

// False where the vector code cannot run (an x86 CPU without AVX2/FMA/F16C) or FASTNORM_CPU_SIMD=0
// asks for the scalar kernels (a debugging switch, read once).
inline bool simd_available() {
  static const bool available = [] {
    const char* env = std::getenv("FASTNORM_CPU_SIMD");
    if (env && env[0] == '0') return false;
#if FASTNORM_SIMD_TARGETED
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
#else
    return true;
#endif
  }();
  return available;
}

// Compute type of an input type: float for fp32/bf16/fp16, double for float64.
template <class T> struct Compute { using type = float; };
template <> struct Compute<double> { using type = double; };
template <class T> using compute_t = typename Compute<T>::type;

template <class T> constexpr int dtype_of();
template <> constexpr int dtype_of<float>() { return FN_F32; }
template <> constexpr int dtype_of<double>() { return FN_F64; }
template <> constexpr int dtype_of<c10::Half>() { return FN_F16; }
template <> constexpr int dtype_of<c10::BFloat16>() { return FN_BF16; }

template <class T> struct Tag { using type = T; };

// Element i of a per-channel parameter of FastnormDtype `dtype` (the family's weight and bias), as double.
inline double param_at(const void* t, int dtype, int64_t i) {
  switch (dtype) {
    case FN_F32: return static_cast<const float*>(t)[i];
    case FN_F64: return static_cast<const double*>(t)[i];
    case FN_F16: return static_cast<float>(static_cast<const c10::Half*>(t)[i]);
    case FN_BF16: return static_cast<float>(static_cast<const c10::BFloat16*>(t)[i]);
    default: return std::numeric_limits<double>::quiet_NaN();
  }
}

template <class TX, class F>
const char* dispatch_weight(int wdtype, bool affine, F& f) {
  using C = compute_t<TX>;
  if (!affine || wdtype == dtype_of<C>()) f(Tag<TX>{}, Tag<C>{});  // no weights: the type is moot
  else if (wdtype == dtype_of<TX>()) f(Tag<TX>{}, Tag<TX>{});
  else return "fastnorm CPU kernels: weight/bias must have the input's dtype or float32 (float64 for float64 input)";
  return nullptr;
}

// Calls f(Tag<TX>{}, Tag<TW>{}) for the input dtype TX and the weight dtype TW, which is TX or its
// compute type (what the binding passes); an error message for anything else.
template <class F>
const char* dispatch_dtypes(int dtype, int wdtype, bool affine, F&& f) {
  switch (dtype) {
#ifdef FASTNORM_WANT_F32
    case FN_F32: return dispatch_weight<float>(wdtype, affine, f);
#endif
#ifdef FASTNORM_WANT_F64
    case FN_F64: return dispatch_weight<double>(wdtype, affine, f);
#endif
#ifdef FASTNORM_WANT_F16
    case FN_F16: return dispatch_weight<c10::Half>(wdtype, affine, f);
#endif
#ifdef FASTNORM_WANT_BF16
    case FN_BF16: return dispatch_weight<c10::BFloat16>(wdtype, affine, f);
#endif
    default: return fastnorm_dtype_not_built(dtype, "fastnorm CPU kernels: unsupported input dtype");
  }
}

constexpr int64_t kChunk = 2048;             // elements of a row per statistics chunk (L1-resident)
constexpr int64_t kParallelMinWork = 32768;  // elements below which threads cost more than they save

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Corrected two-pass variance, clamped at 0 without swallowing NaN (a row holding Inf or NaN comes
// out NaN, as in PyTorch).
inline double clamp_variance(double m2, int64_t count) {
  const double var = m2 / double(count);
  return var < 0.0 ? 0.0 : var;
}

// Statistics of one row (or channel column) so far: count elements whose mean is ref + off and whose
// squared deviations from it sum to m2. Chunks fold in with add(), always in chunk order.
struct Moments {
  double ref = 0.0;
  double off = 0.0;
  double m2 = 0.0;
  int64_t count = 0;

  // A chunk of `len` elements: `center` (a value of the compute type) is the mean it was centered on,
  // `sq` and `lin` the sums of (x - center)^2 and (x - center).
  void add(int64_t len, double center, double sq, double lin) {
    const double chunk_off = lin / double(len);
    const double chunk_m2 = sq - lin * chunk_off;
    if (count == 0) {
      ref = center;
      off = chunk_off;
      m2 = chunk_m2;
      count = len;
      return;
    }
    const int64_t total = count + len;
    const double frac = double(len) / double(total);
    const double delta = ((center - ref) + chunk_off) - off;
    off += delta * frac;
    m2 += chunk_m2 + delta * delta * double(count) * frac;
    count = total;
  }

  double rstd(double eps) const { return 1.0 / std::sqrt(clamp_variance(m2, count) + eps); }
};

// Statistics of one column (elements `stride` apart) in double, for the scalar kernels:
// x - mean = (x - ref) - off, two passes like the vector code's.
struct ScalarStats {
  double ref, off, rstd;
};

template <class T>
ScalarStats scalar_stats(const T* x, int64_t n, int64_t stride, bool rms, double eps) {
  double ref = 0.0, sq = 0.0, lin = 0.0;
  if (!rms) {
    for (int64_t j = 0; j < n; ++j) ref += static_cast<double>(x[j * stride]);
    ref /= double(n);
  }
  for (int64_t j = 0; j < n; ++j) {
    const double d = static_cast<double>(x[j * stride]) - ref;
    sq += d * d;
    lin += d;
  }
  if (rms) return {0.0, 0.0, 1.0 / std::sqrt(sq / double(n) + eps)};
  Moments m;
  m.add(n, ref, sq, lin);
  return {ref, m.off, m.rstd(eps)};
}

}  // namespace fastnorm_cpu

FASTNORM_SIMD_BEGIN
// GCC's C++ front end does not define the ISA macros for a target pragma; sleef.h (included by the
// AVX2 vectors) declares its AVX2 functions only under them.
#if FASTNORM_SIMD_TARGETED && !defined(__AVX__)
#define __AVX__ 1
#define FASTNORM_DEFINED_AVX
#endif
#if FASTNORM_SIMD_TARGETED && !defined(__AVX2__)
#define __AVX2__ 1
#define FASTNORM_DEFINED_AVX2
#endif
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#ifdef FASTNORM_DEFINED_AVX
#undef __AVX__
#undef FASTNORM_DEFINED_AVX
#endif
#ifdef FASTNORM_DEFINED_AVX2
#undef __AVX2__
#undef FASTNORM_DEFINED_AVX2
#endif

namespace fastnorm_cpu {

using at::BFloat16;
using at::Half;
using at::vec::Vectorized;

// Loads and stores of one "step" of a storage type T: kParts vectors of its compute type (two float
// vectors per bf16/fp16 vector, converted by at::vec).
template <class T> struct Io;
template <> struct Io<float> {
  static constexpr int kParts = 1;
  static void load(const float* p, Vectorized<float>* v) { v[0] = Vectorized<float>::loadu(p); }
  static void store(float* p, const Vectorized<float>* v) { v[0].store(p); }
};
template <> struct Io<double> {
  static constexpr int kParts = 1;
  static void load(const double* p, Vectorized<double>* v) { v[0] = Vectorized<double>::loadu(p); }
  static void store(double* p, const Vectorized<double>* v) { v[0].store(p); }
};
template <> struct Io<BFloat16> {
  static constexpr int kParts = 2;
  static void load(const BFloat16* p, Vectorized<float>* v) { at::vec::load_fp32_from_bf16(p, v[0], v[1]); }
  static void store(BFloat16* p, const Vectorized<float>* v) { at::vec::convert_float_bfloat16(v[0], v[1]).store(p); }
};
template <> struct Io<Half> {
  static constexpr int kParts = 2;
  static void load(const Half* p, Vectorized<float>* v) { at::vec::load_fp32_from_fp16(p, v[0], v[1]); }
  static void store(Half* p, const Vectorized<float>* v) { at::vec::convert_float_half(v[0], v[1]).store(p); }
};

// Step geometry of a storage type: kParts vectors of kWidth lanes, kStep elements.
template <class T> struct Step {
  using C = compute_t<T>;
  using V = Vectorized<C>;
  static constexpr int kParts = Io<T>::kParts;
  static constexpr int64_t kWidth = V::size();
  static constexpr int64_t kStep = kParts * kWidth;
};

// One step of T at p as compute vectors; `count` < kStep elements load zero-padded (row tails, and
// rows that do not start on a vector boundary need nothing special: every load is unaligned).
template <class T>
inline void load_step(const T* p, Vectorized<compute_t<T>>* v) { Io<T>::load(p, v); }

template <class T>
inline void load_step(const T* p, int64_t count, Vectorized<compute_t<T>>* v) {
  T buf[Step<T>::kStep] = {};
  std::memcpy(buf, p, sizeof(T) * count);
  Io<T>::load(buf, v);
}

template <class T>
inline void store_step(T* p, const Vectorized<compute_t<T>>* v) { Io<T>::store(p, v); }

template <class T>
inline void store_step(T* p, int64_t count, const Vectorized<compute_t<T>>* v) {
  T buf[Step<T>::kStep];
  Io<T>::store(buf, v);
  std::memcpy(p, buf, sizeof(T) * count);
}

// Weight / bias vectors for one step of input type TX, from TW (TX itself or the compute type).
template <class TX, class TW>
inline void load_params(const TW* p, Vectorized<compute_t<TX>>* v) {
  static_assert(std::is_same<TW, TX>::value || std::is_same<TW, compute_t<TX>>::value,
                "weight type is the input type or its compute type");
  if constexpr (std::is_same<TW, TX>::value) {
    Io<TX>::load(p, v);
  } else {
    for (int q = 0; q < Step<TX>::kParts; ++q) v[q] = Vectorized<TW>::loadu(p + q * Step<TX>::kWidth);
  }
}

template <class TX, class TW>
inline void load_params(const TW* p, int64_t count, Vectorized<compute_t<TX>>* v) {
  TW buf[Step<TX>::kStep] = {};
  std::memcpy(buf, p, sizeof(TW) * count);
  load_params<TX>(static_cast<const TW*>(buf), v);
}

// Sum of the lanes (a fixed shuffle tree), widened to double.
template <class C>
inline double lane_sum(const Vectorized<C>& v) {
  return double(at::vec::vec_reduce_all<C>([](const Vectorized<C>& a, const Vectorized<C>& b) { return a + b; }, v));
}

// Keeps lanes [first, last) of a step (kParts vectors), zeroes the others; first == 0 or
// last == kStep (a tail is a prefix or a suffix of its step).
template <class T>
inline void keep_lanes(Vectorized<compute_t<T>>* v, int64_t first, int64_t last) {
  using S = Step<T>;
  using V = typename S::V;
  const V zero(compute_t<T>(0));
  for (int q = 0; q < S::kParts; ++q) {
    const int64_t lo = std::max<int64_t>(0, first - q * S::kWidth);
    const int64_t hi = std::min<int64_t>(S::kWidth, last - q * S::kWidth);
    if (hi <= lo) v[q] = zero;
    else if (lo > 0) v[q] = V::set(v[q], zero, lo);                // first lo lanes from zero
    else if (hi < S::kWidth) v[q] = V::set(zero, v[q], hi);        // first hi lanes from v
  }
}

// The last, partial step of a run of len elements, [k, len) with len - k < kStep: when the run holds
// a whole step, the step ending at len (one unaligned load, no copy), whose first lanes the caller
// already saw; otherwise the zero-padded remainder. Sets [first, last), the lanes that are new.
template <class T>
inline void load_tail(const T* x, int64_t k, int64_t len, Vectorized<compute_t<T>>* v, int64_t* first,
                      int64_t* last) {
  constexpr int64_t kStep = Step<T>::kStep;
  if (len >= kStep) {
    load_step(x + len - kStep, v);
    *first = kStep - (len - k);
    *last = kStep;
  } else {
    load_step(x + k, len - k, v);
    *first = 0;
    *last = len - k;
  }
}

// One step of a run at pos: kStep elements, of which the first `count` exist (count < kStep: a run
// shorter than a step, zero-padded) and lanes [first, last) are new (first > 0: the last step of a
// run, shifted back to end at the run's end, whose leading lanes an earlier step covered).
struct StepSpan {
  int64_t pos, count, first, last;
};

// Calls f(StepSpan) for each step of a run of len elements: whole steps, then the tail as above.
template <class T, class F>
C10_ALWAYS_INLINE void for_each_step(int64_t len, F&& f) {
  constexpr int64_t kStep = Step<T>::kStep;
  int64_t e = 0;
  for (; e + kStep <= len; e += kStep) f(StepSpan{e, kStep, 0, kStep});
  if (e == len) return;
  if (len >= kStep) f(StepSpan{len - kStep, kStep, kStep - (len - e), kStep});
  else f(StepSpan{e, len - e, 0, len - e});
}

template <class T>
C10_ALWAYS_INLINE void load_span(const T* p, const StepSpan& s, Vectorized<compute_t<T>>* v) {
  if (s.count == Step<T>::kStep) load_step(p + s.pos, v);
  else load_step(p + s.pos, s.count, v);
}

template <class T>
C10_ALWAYS_INLINE void store_span(T* p, const StepSpan& s, const Vectorized<compute_t<T>>* v) {
  if (s.count == Step<T>::kStep) store_step(p + s.pos, v);
  else store_step(p + s.pos, s.count, v);
}

template <class TX, class TW>
C10_ALWAYS_INLINE void load_params_span(const TW* p, const StepSpan& s, Vectorized<compute_t<TX>>* v) {
  if (s.count == Step<TX>::kStep) load_params<TX>(p + s.pos, v);
  else load_params<TX>(p + s.pos, s.count, v);
}

// ---------------------------------------------------------------------------------------------
// Sums over a contiguous run of elements, four independent accumulator vectors.

// Four vectors' worth of elements at p (kUnroll / kParts steps).
constexpr int kUnroll = 4;

template <class T>
C10_ALWAYS_INLINE void load_unrolled(const T* p, Vectorized<compute_t<T>>* v) {
  for (int s = 0; s < kUnroll / Step<T>::kParts; ++s) load_step(p + s * Step<T>::kStep, v + s * Step<T>::kParts);
}

// Sums of (x - center)^2 and, with kLin, of (x - center) over x[0, len): four accumulator vectors
// of each, then a step at a time, then the tail (see load_tail).
template <bool kLin, class T>
inline void run_centered_sums(const T* x, int64_t len, compute_t<T> center, double* sq, double* lin) {
  using S = Step<T>;
  using V = typename S::V;
  constexpr int64_t kBlock = kUnroll * S::kWidth;
  const V c(center);
  V s0(0), s1(0), s2(0), s3(0), l0(0), l1(0), l2(0), l3(0);
  int64_t k = 0;
  for (; k + kBlock <= len; k += kBlock) {
    V v[kUnroll];
    load_unrolled(x + k, v);
    const V d0 = v[0] - c, d1 = v[1] - c, d2 = v[2] - c, d3 = v[3] - c;
    s0 = at::vec::fmadd(d0, d0, s0);
    s1 = at::vec::fmadd(d1, d1, s1);
    s2 = at::vec::fmadd(d2, d2, s2);
    s3 = at::vec::fmadd(d3, d3, s3);
    if (kLin) {
      l0 = l0 + d0;
      l1 = l1 + d1;
      l2 = l2 + d2;
      l3 = l3 + d3;
    }
  }
  auto add_centered = [&](const V* d) {  // one step of deviations
    s0 = at::vec::fmadd(d[0], d[0], s0);
    if (kLin) l0 = l0 + d[0];
    if (S::kParts == 2) {
      s1 = at::vec::fmadd(d[S::kParts - 1], d[S::kParts - 1], s1);
      if (kLin) l1 = l1 + d[S::kParts - 1];
    }
  };
  for (; k + S::kStep <= len; k += S::kStep) {
    V v[S::kParts];
    load_step(x + k, v);
    for (int q = 0; q < S::kParts; ++q) v[q] = v[q] - c;
    add_centered(v);
  }
  if (k < len) {
    V v[S::kParts];
    int64_t first, last;
    load_tail(x, k, len, v, &first, &last);
    for (int q = 0; q < S::kParts; ++q) v[q] = v[q] - c;
    keep_lanes<T>(v, first, last);  // lanes seen before, or padding, must not count
    add_centered(v);
  }
  *sq = lane_sum((s0 + s1) + (s2 + s3));
  if (kLin) *lin = lane_sum((l0 + l1) + (l2 + l3));
}

// ---------------------------------------------------------------------------------------------
// Row statistics (inner == 1). A row is cut into chunks of kChunk elements; each chunk's partial
// statistics fold into the row's in chunk order, whichever thread computed them.

struct ChunkStats {
  double center, sq, lin;  // see Moments::add (RMSNorm: center = lin = 0, sq = sum of x^2)
  int64_t len;
};

// One pass centered on the chunk's first element (exact differences near it, and no pass to find the
// mean first); the sum of deviations then corrects the variance for the shift. That correction
// cancels when the first element lies far out (the variance's error grows by shift^2 / variance), so
// beyond kMaxShift2 a second pass centers on the mean just found (rare: |x0 - mean| > 4 std).
constexpr double kMaxShift2 = 16.0;

template <class T>
inline ChunkStats chunk_stats(const T* x, int64_t len, bool rms) {
  using C = compute_t<T>;
  ChunkStats c{0.0, 0.0, 0.0, len};
  if (rms) {
    run_centered_sums<false>(x, len, C(0), &c.sq, nullptr);
    return c;
  }
  C center = static_cast<C>(x[0]);
  run_centered_sums<true>(x, len, center, &c.sq, &c.lin);
  const double shift = c.lin / double(len);
  if (shift * shift * double(len) > kMaxShift2 * (c.sq - c.lin * shift)) {  // NaN stays NaN either way
    center = C(double(center) + shift);
    run_centered_sums<true>(x, len, center, &c.sq, &c.lin);
  }
  c.center = double(center);
  return c;
}

// y = ((x - ref) - off) * rstd for LayerNorm, y = x * rstd for RMSNorm (ref = off = 0), before the
// affine parameters; the values of the compute type the output pass broadcasts.
template <class C>
struct NormCoeffs {
  C ref, off, rstd;
};

// Folds chunk statistics given in chunk order (LayerNorm: Chan's formula; RMSNorm: a plain sum).
template <class C>
struct RowAccumulator {
  Moments m;
  double sq = 0.0;
  int64_t count = 0;
  bool rms;

  explicit RowAccumulator(bool is_rms) : rms(is_rms) {}
  void add(const ChunkStats& c) {
    if (rms) {
      sq += c.sq;
      count += c.len;
    } else {
      m.add(c.len, c.center, c.sq, c.lin);
    }
  }
  NormCoeffs<C> finish(double eps) const {
    if (rms) return {C(0), C(0), C(1.0 / std::sqrt(sq / double(count) + eps))};
    return {C(m.ref), C(m.off), C(m.rstd(eps))};
  }
};

// Coefficients of one row of n elements, all on the calling thread.
template <class T>
inline NormCoeffs<compute_t<T>> row_coeffs(const T* x, int64_t n, bool rms, double eps) {
  RowAccumulator<compute_t<T>> acc(rms);
  for (int64_t c = 0; c < n; c += kChunk) acc.add(chunk_stats(x + c, std::min(kChunk, n - c), rms));
  return acc.finish(eps);
}

// The same coefficients for `rows` rows `stride` apart, every chunk of every row a task of one
// parallel region (a few long rows), into coeffs[rows].
template <class T>
inline void rows_coeffs_parallel(const T* x, int64_t rows, int64_t stride, int64_t n, bool rms, double eps,
                                 NormCoeffs<compute_t<T>>* coeffs) {
  const int64_t chunks = ceil_div(n, kChunk);
  std::vector<ChunkStats> parts(rows * chunks);
  at::parallel_for(0, rows * chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = t / chunks, e = (t % chunks) * kChunk;
      parts[t] = chunk_stats(x + r * stride + e, std::min(kChunk, n - e), rms);
    }
  });
  for (int64_t r = 0; r < rows; ++r) {
    RowAccumulator<compute_t<T>> acc(rms);
    for (int64_t c = 0; c < chunks; ++c) acc.add(parts[r * chunks + c]);
    coeffs[r] = acc.finish(eps);
  }
}

// ---------------------------------------------------------------------------------------------
// Channel-axis statistics (inner > 1): a block of NV vectors of consecutive inner positions (lanes)
// is reduced over j together, every access contiguous along the lanes; the block is as narrow as
// inner allows (NV in 1, 2, 4, 8), so a small inner is one block and each slab streams through.
// Chunks of rows j fold into per-lane Moments in chunk order, exactly as rows fold their chunks.

template <class T, int NV>
struct Block {
  using S = Step<T>;
  using C = typename S::C;
  using V = typename S::V;
  static_assert(NV % S::kParts == 0, "a block holds whole steps");
  static constexpr int64_t kSteps = NV / S::kParts;
  static constexpr int64_t kLanes = NV * S::kWidth;
  static constexpr int64_t kRowsPerChunk = kChunk / kLanes > 0 ? kChunk / kLanes : 1;
};

// Asks for the next block's part of the row at p, `ahead` elements after this block's lanes, which
// this thread's next task reads: with one stream per row (64 for 64 channels) the hardware
// prefetchers lose track, and each block waited on its loads.
template <class T, int NV>
C10_ALWAYS_INLINE void prefetch_next_block(const T* p, int64_t ahead, bool write) {
  constexpr int64_t kLanes = Block<T, NV>::kLanes;
#if defined(__GNUC__) || defined(__clang__)
  for (int64_t e = 0; e < ahead; e += 64 / int64_t(sizeof(T))) {
    if (write) __builtin_prefetch(p + kLanes + e, 1);
    else __builtin_prefetch(p + kLanes + e, 0);
  }
#else
  (void)p, (void)ahead, (void)write;
#endif
}

// Loads the block's row at p, `width` lanes valid. When reading kLanes elements at p stays below
// `end` (the end of the input), one load per step, lanes past width holding whatever follows (the
// caller ignores them); otherwise zero padding through a buffer.
template <class T, int NV>
C10_ALWAYS_INLINE void load_block_row(const T* p, int64_t width, const T* end, Vectorized<compute_t<T>>* v) {
  using B = Block<T, NV>;
  constexpr int64_t kStep = B::S::kStep, kParts = B::S::kParts;
  if (width == B::kLanes || p + B::kLanes <= end) {
    for (int s = 0; s < B::kSteps; ++s) load_step(p + s * kStep, v + s * kParts);
    return;
  }
  for (int s = 0; s < B::kSteps; ++s) {
    const int64_t count = std::min(kStep, width - s * kStep);
    if (count >= kStep) load_step(p + s * kStep, v + s * kParts);
    else if (count > 0) load_step(p + s * kStep, count, v + s * kParts);
    else for (int q = 0; q < kParts; ++q) v[s * kParts + q] = typename B::V(0);
  }
}

// Stores the block's row at p, `width` lanes valid: whole (one store per step, lanes past width
// landing on elements that belong to someone who rewrites them later) while p + kLanes stays below
// `end`, otherwise the valid steps only, the last through a buffer.
template <class T, int NV>
C10_ALWAYS_INLINE void store_block_row(T* p, int64_t width, const T* end, const Vectorized<compute_t<T>>* v) {
  using B = Block<T, NV>;
  constexpr int64_t kStep = B::S::kStep, kParts = B::S::kParts;
  if (width == B::kLanes || p + B::kLanes <= end) {
    for (int s = 0; s < B::kSteps; ++s) store_step(p + s * kStep, v + s * kParts);
    return;
  }
  for (int s = 0; s < B::kSteps && s * kStep < width; ++s) {
    const int64_t count = std::min(kStep, width - s * kStep);
    if (count == kStep) store_step(p + s * kStep, v + s * kParts);
    else store_step(p + s * kStep, count, v + s * kParts);
  }
}

// Sums of one chunk of rows [j0, j1) of a block, centered (LayerNorm) on the chunk's first row or
// on its mean when some lane's first row lies far out (see kMaxShift2); RMSNorm: center 0.
template <class T, int NV>
C10_ALWAYS_INLINE void block_chunk_sums(const T* x, int64_t j0, int64_t j1, int64_t inner, int64_t width,
                                        int64_t ahead, const T* end, bool rms, Vectorized<compute_t<T>>* center,
                                        Vectorized<compute_t<T>>* sq, Vectorized<compute_t<T>>* lin) {
  using B = Block<T, NV>;
  using C = typename B::C;
  using V = typename B::V;
  constexpr int64_t W = B::S::kWidth;
  const int64_t len = j1 - j0;
  if (rms) {
    for (int q = 0; q < NV; ++q) center[q] = V(0);
  } else {
    load_block_row<T, NV>(x + j0 * inner, width, end, center);
  }
  for (int pass = 0; pass < 2; ++pass) {
    for (int q = 0; q < NV; ++q) sq[q] = lin[q] = V(0);
    for (int64_t j = j0; j < j1; ++j) {
      V v[NV];
      if (pass == 0) prefetch_next_block<T, NV>(x + j * inner, ahead, false);
      load_block_row<T, NV>(x + j * inner, width, end, v);
      for (int q = 0; q < NV; ++q) {
        const V d = v[q] - center[q];
        sq[q] = at::vec::fmadd(d, d, sq[q]);
        lin[q] = lin[q] + d;
      }
    }
    if (rms || pass == 1) return;
    const V len_v = V(C(len)), inv_len = V(C(1.0 / double(len))), limit = V(C(kMaxShift2)), zero = V(C(0));
    bool far = false;
    for (int q = 0; q < NV && q * W < width; ++q) {
      const V shift = lin[q] * inv_len;
      V slack = limit * (sq[q] - lin[q] * shift) - shift * shift * len_v;
      if (width - q * W < W) slack = V::set(zero, slack, width - q * W);  // unused lanes pass
      far = far || (slack < zero).zero_mask() != (1 << W) - 1;
    }
    if (!far) return;
    for (int q = 0; q < NV; ++q) center[q] = center[q] + lin[q] * inv_len;
  }
}

// Per-lane coefficients of the columns x[j * inner + l], j < n, l < width, as vectors (lanes past
// width hold values nobody uses). `ahead`: see prefetch_next_block; `end`: see load_block_row.
template <class T, int NV>
inline void block_coeffs(const T* x, int64_t n, int64_t inner, int64_t width, int64_t ahead, const T* end, bool rms,
                         double eps, Vectorized<compute_t<T>>* ref, Vectorized<compute_t<T>>* off,
                         Vectorized<compute_t<T>>* rstd) {
  using B = Block<T, NV>;
  using C = typename B::C;
  using V = typename B::V;
  constexpr int64_t W = B::S::kWidth;
  V center[NV], sq[NV], lin[NV];
  if (n <= B::kRowsPerChunk) {  // one chunk: finish in vector registers (compute type), nothing to fold
    block_chunk_sums<T, NV>(x, 0, n, inner, width, ahead, end, rms, center, sq, lin);
    const V inv_n = V(C(1.0 / double(n))), eps_v = V(C(eps)), zero = V(C(0));
    for (int q = 0; q < NV; ++q) {
      if (rms) {
        ref[q] = off[q] = zero;
        rstd[q] = (sq[q] * inv_n + eps_v).sqrt().reciprocal();
      } else {
        ref[q] = center[q];
        off[q] = lin[q] * inv_n;
        const V var = at::vec::maximum((sq[q] - lin[q] * off[q]) * inv_n, zero);
        rstd[q] = (var + eps_v).sqrt().reciprocal();
      }
    }
    return;
  }
  Moments moments[B::kLanes];
  double sq_total[B::kLanes] = {};
  for (int64_t j0 = 0; j0 < n; j0 += B::kRowsPerChunk) {
    const int64_t j1 = std::min(n, j0 + B::kRowsPerChunk);
    block_chunk_sums<T, NV>(x, j0, j1, inner, width, ahead, end, rms, center, sq, lin);
    C c_l[B::kLanes], sq_l[B::kLanes], lin_l[B::kLanes];
    for (int q = 0; q < NV; ++q) {
      center[q].store(c_l + q * W);
      sq[q].store(sq_l + q * W);
      lin[q].store(lin_l + q * W);
    }
    for (int64_t l = 0; l < width; ++l) {
      if (rms) sq_total[l] += double(sq_l[l]);
      else moments[l].add(j1 - j0, double(c_l[l]), double(sq_l[l]), double(lin_l[l]));
    }
  }
  C r_l[B::kLanes] = {}, o_l[B::kLanes] = {}, s_l[B::kLanes] = {};
  for (int64_t l = 0; l < width; ++l) {
    r_l[l] = rms ? C(0) : C(moments[l].ref);
    o_l[l] = rms ? C(0) : C(moments[l].off);
    s_l[l] = rms ? C(1.0 / std::sqrt(sq_total[l] / double(n) + eps)) : C(moments[l].rstd(eps));
  }
  for (int q = 0; q < NV; ++q) {
    ref[q] = V::loadu(r_l + q * W);
    off[q] = V::loadu(o_l + q * W);
    rstd[q] = V::loadu(s_l + q * W);
  }
}

}  // namespace fastnorm_cpu
FASTNORM_SIMD_END
