// Test-only binding of fastnorm_cpu_backward (the package's binding does not call it yet): the test
// describes the call (sizes, strides, dtype codes) and allocates the outputs; this fills
// NormBackwardParams with the tensors' pointers and reports the kernel's error, if any.
#include <torch/extension.h>

#include "norm_backward_params.h"

const char* fastnorm_cpu_backward(const NormBackwardParams& p);
int64_t fastnorm_cpu_backward_workspace_bytes(const NormBackwardParams& p);

namespace {

void* data_or_null(const c10::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->data_ptr() : nullptr;
}

}  // namespace

// sizes: outer, n, inner, x_outer_stride, dy_outer_stride; codes: dtype, wdtype (FastnormDtype).
// workspace_bytes < 0: no workspace (the kernel allocates); else a garbage-filled buffer of that many
// bytes, or of fastnorm_cpu_backward_workspace_bytes when 0.
void norm_backward(const at::Tensor& x, const at::Tensor& dy, const c10::optional<at::Tensor>& weight,
                   const c10::optional<at::Tensor>& dx, const c10::optional<at::Tensor>& dweight,
                   const c10::optional<at::Tensor>& dbias, const c10::optional<at::Tensor>& mean,
                   const c10::optional<at::Tensor>& rstd, std::vector<int64_t> sizes, std::vector<int64_t> codes,
                   bool rms, double eps, int64_t workspace_bytes) {
  TORCH_CHECK(sizes.size() == 5 && codes.size() == 2, "sizes: 5 numbers, codes: 2");
  NormBackwardParams p{};
  p.x = x.data_ptr();
  p.dy = dy.data_ptr();
  p.weight = data_or_null(weight);
  p.dx = data_or_null(dx);
  p.dweight = data_or_null(dweight);
  p.dbias = data_or_null(dbias);
  p.mean = data_or_null(mean);
  p.rstd = data_or_null(rstd);
  p.outer = sizes[0];
  p.n = sizes[1];
  p.inner = sizes[2];
  p.x_outer_stride = sizes[3];
  p.dy_outer_stride = sizes[4];
  p.dtype = static_cast<int>(codes[0]);
  p.wdtype = static_cast<int>(codes[1]);
  p.rms = rms ? 1 : 0;
  p.eps = eps;
  at::Tensor workspace;
  if (workspace_bytes >= 0) {
    if (workspace_bytes == 0) workspace_bytes = std::max<int64_t>(1, fastnorm_cpu_backward_workspace_bytes(p));
    workspace = at::full({workspace_bytes}, 0xAB, x.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
    p.workspace_bytes = workspace_bytes;
  }
  const char* err = fastnorm_cpu_backward(p);
  TORCH_CHECK(err == nullptr, err);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("norm_backward", &norm_backward);
}
