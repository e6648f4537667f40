// CPU backward of LayerNorm / RMSNorm over (outer, n, inner) views (see norm_backward_params.h), in
// double precision, threaded with at::parallel_for.
//
// Each (outer, inner) column's statistics are recomputed (two passes), then dx in a third pass; the
// columns are cut into a fixed number of chunks, each summing dweight / dbias into its own partial
// row, and the partials are added in chunk order: the same result for any thread count.
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "norm_backward_params.h"
#include "norm_params.h"

namespace {

template <typename T>
inline double widen_cpu(T v) { return static_cast<double>(static_cast<float>(v)); }
template <>
inline double widen_cpu<double>(double v) { return v; }

template <typename T>
inline T narrow_cpu(double v) { return static_cast<T>(static_cast<float>(v)); }
template <>
inline double narrow_cpu<double>(double v) { return v; }

// Chunks of columns, each with its own dweight / dbias partial: enough to keep every thread busy, few
// enough that the partials stay small next to the tensor (at most ~64 MB of them).
int64_t column_chunks(int64_t columns, int64_t n) {
  const int64_t cap = std::max<int64_t>(1, (int64_t(64) << 20) / std::max<int64_t>(1, 16 * n));
  return std::max<int64_t>(1, std::min<int64_t>({columns, int64_t(64), cap}));
}

template <typename T, typename W>
void backward_columns(const NormBackwardParams& p) {
  const T* x = static_cast<const T*>(p.x);
  const T* dy = static_cast<const T*>(p.dy);
  const W* w = static_cast<const W*>(p.weight);
  T* dx = static_cast<T*>(p.dx);
  const int64_t n = p.n, inner = p.inner, columns = p.outer * inner;
  const bool rms = p.rms != 0;
  const bool want_dw = p.dweight != nullptr, want_db = p.dbias != nullptr;
  const int64_t chunks = column_chunks(columns, n), per_chunk = (columns + chunks - 1) / chunks;
  std::vector<double> dw_part(want_dw ? static_cast<size_t>(chunks * n) : 0);
  std::vector<double> db_part(want_db ? static_cast<size_t>(chunks * n) : 0);
  const double inv_n = 1.0 / double(n);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    std::vector<double> xs(static_cast<size_t>(n)), gs(static_cast<size_t>(n));
    for (int64_t chunk = c0; chunk < c1; ++chunk) {
      double* dwp = want_dw ? dw_part.data() + chunk * n : nullptr;
      double* dbp = want_db ? db_part.data() + chunk * n : nullptr;
      const int64_t q1 = std::min(columns, (chunk + 1) * per_chunk);
      for (int64_t q = chunk * per_chunk; q < q1; ++q) {
        const int64_t o = q / inner, i = q % inner;
        const T* xc = x + o * p.x_outer_stride + i;
        const T* gc = dy + o * n * inner + i;
        double mean = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          xs[j] = widen_cpu(xc[j * inner]);
          gs[j] = widen_cpu(gc[j * inner]);
          mean += xs[j];
        }
        mean = rms ? 0.0 : mean * inv_n;
        double m2 = 0.0;
        for (int64_t j = 0; j < n; ++j) m2 += (xs[j] - mean) * (xs[j] - mean);
        const double rstd = 1.0 / std::sqrt(m2 * inv_n + p.eps);
        double sum_g = 0.0, sum_gx = 0.0;
        for (int64_t j = 0; j < n; ++j) {
          const double xhat = (xs[j] - mean) * rstd, g = w ? gs[j] * widen_cpu(w[j]) : gs[j];
          sum_g += g;
          sum_gx += g * xhat;
          if (dwp) dwp[j] += gs[j] * xhat;
          if (dbp) dbp[j] += gs[j];
        }
        if (dx == nullptr) continue;
        const double c1 = rms ? 0.0 : sum_g * inv_n, c2 = sum_gx * inv_n;
        T* dxc = dx + o * n * inner + i;
        for (int64_t j = 0; j < n; ++j) {
          const double xhat = (xs[j] - mean) * rstd, g = w ? gs[j] * widen_cpu(w[j]) : gs[j];
          dxc[j * inner] = narrow_cpu<T>(rstd * (g - c1 - xhat * c2));
        }
      }
    }
  });
  for (int which = 0; which < 2; ++which) {
    const std::vector<double>& part = which == 0 ? dw_part : db_part;
    W* out = static_cast<W*>(which == 0 ? p.dweight : p.dbias);
    if (out == nullptr) continue;
    at::parallel_for(0, n, 1024, [&](int64_t j0, int64_t j1) {
      for (int64_t j = j0; j < j1; ++j) {
        double s = 0.0;
        for (int64_t chunk = 0; chunk < chunks; ++chunk) s += part[size_t(chunk * n + j)];
        out[j] = narrow_cpu<W>(s);
      }
    });
  }
}

template <typename T>
const char* backward_weight(const NormBackwardParams& p) {
  if (p.wdtype == FN_NONE || p.wdtype == p.dtype) {
    backward_columns<T, T>(p);
    return nullptr;
  }
  if (p.wdtype == FN_F32) {
    backward_columns<T, float>(p);
    return nullptr;
  }
  return "weight dtype must match the input or be float32";
}

}  // namespace

const char* fastnorm_cpu_backward(const NormBackwardParams& p) {
  if (p.outer == 0 || p.n == 0 || p.inner == 0) return nullptr;
  switch (p.dtype) {
    case FN_F32: return backward_weight<float>(p);
    case FN_F16: return backward_weight<c10::Half>(p);
    case FN_BF16: return backward_weight<c10::BFloat16>(p);
    case FN_F64:
      if (p.wdtype != FN_NONE && p.wdtype != FN_F64) return "float64 input needs float64 weight";
      backward_columns<double, double>(p);
      return nullptr;
    default: return "unsupported dtype";
  }
}
