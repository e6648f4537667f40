// Test-only binding of fastnorm_cpu_backward (the package's binding does not call it yet): tensors in,
// NormBackwardParams out, dx / dweight / dbias back. Dims [begin_dim, end_dim) are normalized, as in
// binding.cpp's norm_forward; x and dy keep their outer stride when their normalized and trailing
// dims are contiguous and the outer dims collapse to one stride (else they are made contiguous).
#include <torch/extension.h>

#include "norm_backward_params.h"

const char* fastnorm_cpu_backward(const NormBackwardParams& p);
int64_t fastnorm_cpu_backward_workspace_bytes(const NormBackwardParams& p);

namespace {

int dtype_code(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return FN_F32;
    case at::kHalf: return FN_F16;
    case at::kBFloat16: return FN_BF16;
    case at::kDouble: return FN_F64;
    default: return FN_NONE;
  }
}

// x itself and its outer stride when usable as is, else a contiguous copy.
std::pair<at::Tensor, int64_t> with_outer_stride(const at::Tensor& x, int64_t begin, int64_t tail) {
  int64_t expected = 1;
  for (int64_t d = x.dim() - 1; d >= begin; --d) {
    if (x.size(d) != 1 && x.stride(d) != expected) return {x.contiguous(), tail};
    expected *= x.size(d);
  }
  int64_t stride = -1, span = 1;
  for (int64_t d = begin - 1; d >= 0; --d) {
    if (x.size(d) == 1) continue;
    if (stride < 0) stride = x.stride(d);
    else if (x.stride(d) != stride * span) return {x.contiguous(), tail};
    span *= x.size(d);
  }
  if (stride < 0) stride = tail;
  return stride >= tail ? std::make_pair(x, stride) : std::make_pair(x.contiguous(), tail);
}

}  // namespace

std::vector<at::Tensor> norm_backward(const at::Tensor& x, const at::Tensor& dy, const c10::optional<at::Tensor>& weight,
                                      bool want_dx, bool want_dweight, bool want_dbias, int64_t begin_dim,
                                      int64_t end_dim, double eps, bool rms, const c10::optional<at::Tensor>& mean,
                                      const c10::optional<at::Tensor>& rstd, bool external_workspace,
                                      const at::Tensor& param_like) {
  const at::ScalarType param_dtype = param_like.scalar_type();  // dtype of dweight / dbias
  TORCH_CHECK(x.sizes() == dy.sizes() && x.scalar_type() == dy.scalar_type(), "x and dy differ");
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t d = 0; d < x.dim(); ++d) (d < begin_dim ? outer : d < end_dim ? n : inner) *= x.size(d);
  auto [xc, xs] = with_outer_stride(x, begin_dim, n * inner);
  auto [dyc, dys] = with_outer_stride(dy, begin_dim, n * inner);
  at::Tensor w = weight.has_value() ? weight->contiguous() : at::Tensor();
  at::Tensor dx = want_dx ? at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous)) : at::Tensor();
  at::Tensor dw = want_dweight ? at::full({n}, 12345.0, x.options().dtype(param_dtype)) : at::Tensor();
  at::Tensor db = want_dbias ? at::full({n}, 12345.0, x.options().dtype(param_dtype)) : at::Tensor();
  at::Tensor m = mean.has_value() ? mean->contiguous() : at::Tensor();
  at::Tensor r = rstd.has_value() ? rstd->contiguous() : at::Tensor();
  NormBackwardParams p{};
  p.x = xc.data_ptr();
  p.dy = dyc.data_ptr();
  p.weight = w.defined() ? w.data_ptr() : nullptr;
  p.dx = dx.defined() ? dx.data_ptr() : nullptr;
  p.dweight = dw.defined() ? dw.data_ptr() : nullptr;
  p.dbias = db.defined() ? db.data_ptr() : nullptr;
  p.mean = m.defined() ? m.data_ptr() : nullptr;
  p.rstd = r.defined() ? r.data_ptr() : nullptr;
  p.outer = outer;
  p.n = n;
  p.inner = inner;
  p.x_outer_stride = xs;
  p.dy_outer_stride = dys;
  p.dtype = dtype_code(x.scalar_type());
  p.wdtype = (w.defined() || dw.defined() || db.defined()) ? dtype_code(param_dtype) : FN_NONE;
  p.rms = rms ? 1 : 0;
  p.eps = eps;
  at::Tensor workspace;
  if (external_workspace) {
    workspace = at::full({std::max<int64_t>(1, fastnorm_cpu_backward_workspace_bytes(p))}, 0xAB,
                         x.options().dtype(at::kByte));  // content must not matter
    p.workspace = workspace.data_ptr();
    p.workspace_bytes = workspace.numel();
  }
  const char* err = fastnorm_cpu_backward(p);
  TORCH_CHECK(err == nullptr, err);
  return {dx, dw, db};
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("norm_backward", &norm_backward);
}
