// CPU backward of the family's affine members (FamilyBackwardParams: GroupNorm / InstanceNorm, BatchNorm,
// the SiLU epilogue), the CUDA backward's design (family_backward.cuh): per plane (sample, channel) the
// sums of g and g (x - mean) over chunks of kChunk elements (g = dy, or dy * silu'(z)), folded in double
// in order; per set the two dx coefficients; per channel dweight and dbias; then dx = rstd w g + kx (x -
// mean) + k0 per plane. Planes run in parallel; every sum has a fixed order, so results do not depend on
// the thread count. at::vec code where the CPU has the vector units, else double scalar code.
#include <cmath>
#include <vector>

#include "cpu_vec.h"
#include "family_params.h"
#include "kernel_set.h"

namespace {

// What one plane's elements need: the set's mean, rstd * w (z's scale and dx's factor of g), the bias.
struct PlaneTerms {
  double mean, scale, bias;
};

// The derivative's factor of the SiLU epilogue at z: silu'(z) = s (1 + z (1 - s)), s = sigmoid(z).
inline double silu_slope(double z) {
  const double s = 1.0 / (1.0 + std::exp(-z));
  return s * (1.0 + z * (1.0 - s));
}

template <class T>
struct ScalarPlanes {
  static void sums(const T* x, const T* dy, int64_t len, const PlaneTerms& t, bool silu, double* sg, double* sgu) {
    double a = 0.0, b = 0.0;
    for (int64_t e = 0; e < len; ++e) {
      const double u = static_cast<double>(x[e]) - t.mean;
      double g = static_cast<double>(dy[e]);
      if (silu) g *= silu_slope(u * t.scale + t.bias);
      a += g;
      b += g * u;
    }
    *sg += a;
    *sgu += b;
  }
  static void dx(const T* x, const T* dy, T* out, int64_t len, const PlaneTerms& t, bool silu, double kx, double k0) {
    for (int64_t e = 0; e < len; ++e) {
      const double u = static_cast<double>(x[e]) - t.mean;
      double g = static_cast<double>(dy[e]);
      if (silu) g *= silu_slope(u * t.scale + t.bias);
      out[e] = static_cast<T>(t.scale * g + kx * u + k0);
    }
  }
};

}  // namespace

FASTNORM_SIMD_BEGIN
namespace {

using namespace fastnorm_cpu;

template <class T>
struct VectorPlanes {
  using S = Step<T>;
  using V = typename S::V;
  using C = typename S::C;

  // The step's u = x - mean and g: dy, or dy * silu'(z), z = u * scale + bias.
  static C10_ALWAYS_INLINE void step_terms(const T* x, const T* dy, const StepSpan& s, bool silu, const V& mean,
                                           const V& scale, const V& bias, V* u, V* g) {
    load_span(x, s, u);
    load_span(dy, s, g);
    for (int q = 0; q < S::kParts; ++q) u[q] = u[q] - mean;
    if (!silu) return;
    const V one(static_cast<C>(1)), zero(static_cast<C>(0));
    for (int q = 0; q < S::kParts; ++q) {
      const V z = at::vec::fmadd(u[q], scale, bias);
      const V sig = one / (one + (zero - z).exp());
      g[q] = g[q] * sig * at::vec::fmadd(z, one - sig, one);
    }
  }

  static void sums(const T* x, const T* dy, int64_t len, const PlaneTerms& t, bool silu, double* sg, double* sgu) {
    const V mean(static_cast<C>(t.mean)), scale(static_cast<C>(t.scale)), bias(static_cast<C>(t.bias));
    V a[S::kParts], b[S::kParts];
    for (int q = 0; q < S::kParts; ++q) a[q] = b[q] = V(static_cast<C>(0));
    for_each_step<T>(len, [&](const StepSpan& s) {
      V u[S::kParts], g[S::kParts];
      step_terms(x, dy, s, silu, mean, scale, bias, u, g);
      keep_lanes<T>(g, s.first, s.last);  // lanes an earlier step counted add nothing
      for (int q = 0; q < S::kParts; ++q) {
        a[q] = a[q] + g[q];
        b[q] = at::vec::fmadd(g[q], u[q], b[q]);
      }
    });
    for (int q = 0; q < S::kParts; ++q) {
      *sg += lane_sum(a[q]);
      *sgu += lane_sum(b[q]);
    }
  }

  static void dx(const T* x, const T* dy, T* out, int64_t len, const PlaneTerms& t, bool silu, double kx, double k0) {
    const V mean(static_cast<C>(t.mean)), scale(static_cast<C>(t.scale)), bias(static_cast<C>(t.bias));
    const V kxv(static_cast<C>(kx)), k0v(static_cast<C>(k0));
    for_each_step<T>(len, [&](const StepSpan& s) {
      V u[S::kParts], g[S::kParts];
      step_terms(x, dy, s, silu, mean, scale, bias, u, g);
      for (int q = 0; q < S::kParts; ++q) g[q] = at::vec::fmadd(scale, g[q], at::vec::fmadd(kxv, u[q], k0v));
      store_span(out, s, g);
    });
  }
};

// Out-of-line entry points: the driver is compiled for the baseline instruction set.
template <class T>
void vector_sums(const T* x, const T* dy, int64_t len, const PlaneTerms& t, bool silu, double* sg, double* sgu) {
  VectorPlanes<T>::sums(x, dy, len, t, silu, sg, sgu);
}
template <class T>
void vector_dx(const T* x, const T* dy, T* out, int64_t len, const PlaneTerms& t, bool silu, double kx, double k0) {
  VectorPlanes<T>::dx(x, dy, out, len, t, silu, kx, k0);
}

}  // namespace
FASTNORM_SIMD_END

namespace {

using fastnorm_cpu::kChunk;
using fastnorm_cpu::kParallelMinWork;
using fastnorm_cpu::param_at;

template <class T>
const char* family_backward(const FamilyBackwardParams& p) {
  using A = fastnorm_cpu::compute_t<T>;
  const bool simd = fastnorm_cpu::simd_available(), silu = p.activation == FN_ACT_SILU;
  const auto sums = simd ? &vector_sums<T> : &ScalarPlanes<T>::sums;
  const auto dx_of = simd ? &vector_dx<T> : &ScalarPlanes<T>::dx;
  const bool groups = p.mode == FN_BWD_GROUPS;
  const int64_t planes = p.n * p.channels, len = p.spatial, per_group = p.channels / p.groups;
  const int64_t sets = groups ? p.n * p.groups : p.channels;
  const auto set_of = [&](int64_t plane) {
    const int64_t c = plane % p.channels;
    return groups ? (plane / p.channels) * p.groups + c / per_group : c;
  };
  std::vector<double> rstd(sets);
  for (int64_t k = 0; k < sets; ++k) rstd[k] = 1.0 / std::sqrt(double(static_cast<const A*>(p.var)[k]) + p.eps);
  const auto terms = [&](int64_t plane) {
    const int64_t c = plane % p.channels, k = set_of(plane);
    const double w = p.weight ? param_at(p.weight, p.wdtype, c) : 1.0;
    const double b = silu && p.bias ? param_at(p.bias, p.wdtype, c) : 0.0;
    return PlaneTerms{double(static_cast<const A*>(p.mean)[k]), rstd[k] * w, b};
  };
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  const int64_t grain = std::max<int64_t>(1, kParallelMinWork / std::max<int64_t>(1, len));

  // 1. Per plane: the sums of g and g u, chunk by chunk in order.
  const bool set_terms = p.dx != nullptr && p.mode != FN_BWD_GIVEN;
  std::vector<double> sg(planes, 0.0), sgu(planes, 0.0);
  if (set_terms || p.dweight || p.dbias) {
    at::parallel_for(0, planes, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const PlaneTerms t = terms(r);
        for (int64_t lo = 0; lo < len; lo += kChunk) {
          sums(x + r * len + lo, dy + r * len + lo, std::min(kChunk, len - lo), t, silu, &sg[r], &sgu[r]);
        }
      }
    });
  }
  // 2. Per set its coefficients (given statistics: none); per channel dweight and dbias.
  std::vector<double> kx(sets, 0.0), k0(sets, 0.0);
  if (set_terms) {
    std::vector<double> wg(sets, 0.0), wgu(sets, 0.0);
    for (int64_t r = 0; r < planes; ++r) {  // planes in order: the same sums for any thread count
      const double w = p.weight ? param_at(p.weight, p.wdtype, r % p.channels) : 1.0;
      wg[set_of(r)] += w * sg[r];
      wgu[set_of(r)] += w * sgu[r];
    }
    const double count = double(groups ? per_group : p.n) * double(len);
    for (int64_t k = 0; k < sets; ++k) {
      kx[k] = -rstd[k] * rstd[k] * rstd[k] * wgu[k] / count;
      k0[k] = -rstd[k] * wg[k] / count;
    }
  }
  for (int64_t c = 0; c < p.channels && (p.dweight || p.dbias); ++c) {
    double dw = 0.0, db = 0.0;
    for (int64_t n = 0; n < p.n; ++n) {
      const int64_t r = n * p.channels + c;
      dw += rstd[set_of(r)] * sgu[r];
      db += sg[r];
    }
    if (p.dweight) static_cast<A*>(p.dweight)[c] = static_cast<A>(dw);
    if (p.dbias) static_cast<A*>(p.dbias)[c] = static_cast<A>(db);
  }
  // 3. dx per plane.
  if (p.dx != nullptr) {
    T* out = static_cast<T*>(p.dx);
    at::parallel_for(0, planes, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const PlaneTerms t = terms(r);
        const int64_t k = set_of(r);
        dx_of(x + r * len, dy + r * len, out + r * len, len, t, silu, kx[k], k0[k]);
      }
    });
  }
  return nullptr;
}

}  // namespace

const char* fastnorm_cpu_family_backward(const FamilyBackwardParams& p) {
  if (p.n < 0 || p.channels < 0 || p.spatial < 0) return "fastnorm_cpu_family_backward: negative size";
  if (p.n * p.channels * p.spatial == 0) return nullptr;
  if (!p.x || !p.dy || !p.mean || !p.var || p.groups <= 0 || p.channels % p.groups != 0 ||
      (p.mode != FN_BWD_GROUPS && p.mode != FN_BWD_BATCH && p.mode != FN_BWD_GIVEN)) {
    return "fastnorm_cpu_family_backward: inconsistent parameters";
  }
  if (p.activation != FN_ACT_NONE && p.activation != FN_ACT_SILU) return "fastnorm_cpu_family_backward: unknown activation";
  switch (p.dtype) {
#ifdef FASTNORM_WANT_F32
    case FN_F32: return family_backward<float>(p);
#endif
#ifdef FASTNORM_WANT_F64
    case FN_F64: return family_backward<double>(p);
#endif
#ifdef FASTNORM_WANT_F16
    case FN_F16: return family_backward<c10::Half>(p);
#endif
#ifdef FASTNORM_WANT_BF16
    case FN_BF16: return family_backward<c10::BFloat16>(p);
#endif
    default: return fastnorm_dtype_not_built(p.dtype, "fastnorm_cpu_family_backward: unsupported dtype");
  }
}
