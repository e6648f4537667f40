// Tensor-level entry point shared by the CPU and the CUDA extension (and by single-file solutions):
// validates what the kernels rely on, describes the call as NormParams, and runs the kernels.
// Compiled with FASTNORM_CUDA defined for the CUDA build; FASTNORM_INLINE drops the pybind module
// (load_inline writes its own).
#include <torch/extension.h>

#include "norm_params.h"

#ifdef FASTNORM_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
int64_t fastnorm_cuda_workspace_bytes(const NormParams& p);
const char* fastnorm_cuda_forward(const NormParams& p, void* stream);
#else
const char* fastnorm_cpu_forward(const NormParams& p);
#endif

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

// True when dims [begin, ndim) of x are laid out contiguously (size-1 dims may have any stride).
bool tail_contiguous(const at::Tensor& x, int64_t begin) {
  int64_t expected = 1;
  for (int64_t d = x.dim() - 1; d >= begin; --d) {
    if (x.size(d) != 1 && x.stride(d) != expected) return false;
    expected *= x.size(d);
  }
  return true;
}

// Stride between consecutive outer indices when dims [0, begin) collapse into one; -1 otherwise.
int64_t collapsed_outer_stride(const at::Tensor& x, int64_t begin, int64_t tail_numel) {
  int64_t stride = -1, span = 1;  // span: outer indices covered by dims inside the current one
  for (int64_t d = begin - 1; d >= 0; --d) {
    if (x.size(d) == 1) continue;
    if (stride < 0) {
      stride = x.stride(d);
    } else if (x.stride(d) != stride * span) {
      return -1;
    }
    span *= x.size(d);
  }
  if (stride < 0) stride = tail_numel;     // a single outer index
  return stride >= tail_numel ? stride : -1;  // overlapping rows are not supported in place
}

}  // namespace

at::Tensor norm_forward(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                        const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim,
                        double eps, bool rms, int64_t threads, int64_t blocks_per_row) {
  const int64_t ndim = x.dim();
  TORCH_CHECK(0 <= begin_dim && begin_dim < end_dim && end_dim <= ndim, "fastnorm: bad dims [",
              begin_dim, ", ", end_dim, ") for a tensor of rank ", ndim);
  const int code = dtype_code(x.scalar_type());
  TORCH_CHECK(code != FN_NONE, "fastnorm: unsupported input dtype ", x.scalar_type(),
              " (float32, float16, bfloat16 or float64)");
#ifdef FASTNORM_CUDA
  TORCH_CHECK(x.is_cuda(), "fastnorm: this build runs CUDA tensors, got one on ", x.device());
  const c10::cuda::OptionalCUDAGuard guard(x.device());
#else
  TORCH_CHECK(x.is_cpu(), "fastnorm: this build runs CPU tensors, got one on ", x.device());
#endif
  int64_t outer = 1, n = 1, inner = 1;
  for (int64_t d = 0; d < ndim; ++d) (d < begin_dim ? outer : d < end_dim ? n : inner) *= x.size(d);

  // Weight and bias: n contiguous elements, both of x's dtype or both float32 (float64 for double x).
  at::Tensor w, b;
  if (weight.has_value() && weight->defined()) w = *weight;
  if (bias.has_value() && bias->defined()) b = *bias;
  TORCH_CHECK(!(rms && b.defined()), "fastnorm: RMSNorm takes no bias");
  at::ScalarType wtype = at::kFloat;
  for (const at::Tensor* t : {&w, &b}) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->numel() == n, "fastnorm: weight/bias has ", t->numel(), " elements, expected ", n);
    TORCH_CHECK(t->device() == x.device(), "fastnorm: weight/bias on ", t->device(), ", input on ",
                x.device());
    TORCH_CHECK(dtype_code(t->scalar_type()) != FN_NONE, "fastnorm: unsupported weight/bias dtype ",
                t->scalar_type());
  }
  const at::ScalarType wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (w.defined() || b.defined()) {
    const at::Tensor& first = w.defined() ? w : b;
    const bool same = !(w.defined() && b.defined()) || w.scalar_type() == b.scalar_type();
    wtype = same && (first.scalar_type() == x.scalar_type() || first.scalar_type() == wide)
                ? first.scalar_type() : wide;
    if (w.defined()) w = w.to(wtype).contiguous();
    if (b.defined()) b = b.to(wtype).contiguous();
  }

  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.numel() == 0) return y;

  at::Tensor xc = x;
  int64_t outer_stride = tail_contiguous(x, begin_dim) ? collapsed_outer_stride(x, begin_dim, n * inner) : -1;
  if (outer_stride < 0) {
    xc = x.contiguous();
    outer_stride = n * inner;
  }

  NormParams p{};
  p.x = xc.data_ptr();
  p.y = y.data_ptr();
  p.weight = w.defined() ? w.data_ptr() : nullptr;
  p.bias = b.defined() ? b.data_ptr() : nullptr;
  p.outer = outer;
  p.n = n;
  p.inner = inner;
  p.x_outer_stride = outer_stride;
  p.dtype = code;
  p.wdtype = (w.defined() || b.defined()) ? dtype_code(wtype) : FN_NONE;
  p.rms = rms ? 1 : 0;
  p.eps = eps;
  p.threads = static_cast<int>(threads);
  p.blocks_per_row = static_cast<int>(blocks_per_row);
#ifdef FASTNORM_CUDA
  at::Tensor workspace;
  const int64_t ws_bytes = fastnorm_cuda_workspace_bytes(p);
  if (ws_bytes > 0) {
    workspace = at::zeros({ws_bytes}, x.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
    p.workspace_bytes = ws_bytes;
  }
  const char* err = fastnorm_cuda_forward(p, c10::cuda::getCurrentCUDAStream().stream());
#else
  const char* err = fastnorm_cpu_forward(p);
#endif
  TORCH_CHECK(err == nullptr, "fastnorm kernel failed: ", err);
  return y;
}

#ifndef FASTNORM_INLINE
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("norm_forward", &norm_forward, "LayerNorm / RMSNorm over dims [begin_dim, end_dim) of x",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("begin_dim"), py::arg("end_dim"),
        py::arg("eps"), py::arg("rms"), py::arg("threads") = 0, py::arg("blocks_per_row") = 0);
}
#endif
