// Tensor-level entry point shared by the CPU and the CUDA extension (and by single-file solutions):
// validates what the kernels rely on, describes the call as NormParams, and runs the kernels.
// Compiled with FASTNORM_CUDA defined for the CUDA build; FASTNORM_INLINE drops the pybind module
// (load_inline writes its own).
#include <torch/extension.h>

#include "norm_backward_params.h"
#include "norm_params.h"

#ifdef FASTNORM_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
int64_t fastnorm_cuda_workspace_bytes(const NormParams& p);
const char* fastnorm_cuda_forward(const NormParams& p, void* stream);
int64_t fastnorm_cuda_backward_workspace_bytes(const NormBackwardParams& p);
const char* fastnorm_cuda_backward(const NormBackwardParams& p, void* stream);
#else
const char* fastnorm_cpu_forward(const NormParams& p);
const char* fastnorm_cpu_backward(const NormBackwardParams& p);
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

// What a forward and a backward call share: the (outer, n, inner) view of x, its dtype code, and
// weight / bias as the kernels take them (n contiguous elements of x's dtype or the wide type).
struct NormCall {
  int64_t outer = 1, n = 1, inner = 1;
  int code = FN_NONE;
  at::Tensor w, b;
  at::ScalarType wtype = at::kFloat;
  bool has_params = false;
};

NormCall prepare_call(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                      const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim, bool rms) {
  NormCall c;
  const int64_t ndim = x.dim();
  TORCH_CHECK(0 <= begin_dim && begin_dim < end_dim && end_dim <= ndim, "fastnorm: bad dims [",
              begin_dim, ", ", end_dim, ") for a tensor of rank ", ndim);
  c.code = dtype_code(x.scalar_type());
  TORCH_CHECK(c.code != FN_NONE, "fastnorm: unsupported input dtype ", x.scalar_type(),
              " (float32, float16, bfloat16 or float64)");
#ifdef FASTNORM_CUDA
  TORCH_CHECK(x.is_cuda(), "fastnorm: this build runs CUDA tensors, got one on ", x.device());
#else
  TORCH_CHECK(x.is_cpu(), "fastnorm: this build runs CPU tensors, got one on ", x.device());
#endif
  for (int64_t d = 0; d < ndim; ++d) (d < begin_dim ? c.outer : d < end_dim ? c.n : c.inner) *= x.size(d);

  // Weight and bias: n contiguous elements, both of x's dtype or both float32 (float64 for double x).
  at::Tensor& w = c.w;
  at::Tensor& b = c.b;
  if (weight.has_value() && weight->defined()) w = *weight;
  if (bias.has_value() && bias->defined()) b = *bias;
  TORCH_CHECK(!(rms && b.defined()), "fastnorm: RMSNorm takes no bias");
  for (const at::Tensor* t : {&w, &b}) {
    if (!t->defined()) continue;
    TORCH_CHECK(t->numel() == c.n, "fastnorm: weight/bias has ", t->numel(), " elements, expected ", c.n);
    TORCH_CHECK(t->device() == x.device(), "fastnorm: weight/bias on ", t->device(), ", input on ",
                x.device());
    TORCH_CHECK(dtype_code(t->scalar_type()) != FN_NONE, "fastnorm: unsupported weight/bias dtype ",
                t->scalar_type());
  }
  const at::ScalarType wide = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  c.has_params = w.defined() || b.defined();
  if (c.has_params) {
    const at::Tensor& first = w.defined() ? w : b;
    const bool same = !(w.defined() && b.defined()) || w.scalar_type() == b.scalar_type();
    c.wtype = same && (first.scalar_type() == x.scalar_type() || first.scalar_type() == wide)
                  ? first.scalar_type() : wide;
    // Skip the no-op calls: each costs dispatcher time on every call of a small shape.
    for (at::Tensor* t : {&w, &b}) {
      if (!t->defined()) continue;
      if (t->scalar_type() != c.wtype) *t = t->to(c.wtype);
      if (!t->is_contiguous()) *t = t->contiguous();
    }
  }
  return c;
}

// x as the kernels read it: in place when its rows (outer indices) are evenly strided over a
// contiguous tail, else a contiguous copy; and the stride between outer indices.
std::pair<at::Tensor, int64_t> strided_input(const at::Tensor& x, int64_t begin_dim, int64_t tail_numel) {
  int64_t outer_stride = tail_contiguous(x, begin_dim) ? collapsed_outer_stride(x, begin_dim, tail_numel) : -1;
  if (outer_stride < 0) return {x.contiguous(), tail_numel};
  return {x, outer_stride};
}

}  // namespace

at::Tensor norm_forward(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                        const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim,
                        double eps, bool rms, int64_t threads, int64_t blocks_per_row) {
  NormCall c = prepare_call(x, weight, bias, begin_dim, end_dim, rms);
#ifdef FASTNORM_CUDA
  const c10::cuda::OptionalCUDAGuard guard(x.device());
#endif
  at::Tensor y = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  if (x.numel() == 0) return y;
  const auto [xc, outer_stride] = strided_input(x, begin_dim, c.n * c.inner);

  NormParams p{};
  p.x = xc.data_ptr();
  p.y = y.data_ptr();
  p.weight = c.w.defined() ? c.w.data_ptr() : nullptr;
  p.bias = c.b.defined() ? c.b.data_ptr() : nullptr;
  p.outer = c.outer;
  p.n = c.n;
  p.inner = c.inner;
  p.x_outer_stride = outer_stride;
  p.dtype = c.code;
  p.wdtype = c.has_params ? dtype_code(c.wtype) : FN_NONE;
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

// Gradients of y = norm(x) [* weight + bias] given dy: (dx, dweight, dbias), each an empty tensor
// where not asked for. dweight / dbias come in the dtype the kernels use for the parameters (the
// caller casts them to the parameters' own). Bias is passed for its presence and dtype only.
std::vector<at::Tensor> norm_backward(const at::Tensor& dy, const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                      const c10::optional<at::Tensor>& bias, int64_t begin_dim, int64_t end_dim,
                                      double eps, bool rms, bool need_dx, bool need_dweight, bool need_dbias) {
  NormCall c = prepare_call(x, weight, bias, begin_dim, end_dim, rms);
  TORCH_CHECK(dy.sizes() == x.sizes(), "fastnorm: grad has shape ", dy.sizes(), ", input ", x.sizes());
  TORCH_CHECK(dy.scalar_type() == x.scalar_type(), "fastnorm: grad dtype ", dy.scalar_type(), ", input ",
              x.scalar_type());
  TORCH_CHECK(dy.device() == x.device(), "fastnorm: grad on ", dy.device(), ", input on ", x.device());
  TORCH_CHECK(!need_dweight || c.w.defined(), "fastnorm: dweight asked for without a weight");
  TORCH_CHECK(!need_dbias || c.b.defined(), "fastnorm: dbias asked for without a bias");
#ifdef FASTNORM_CUDA
  const c10::cuda::OptionalCUDAGuard guard(x.device());
#endif
  const auto contiguous = x.options().memory_format(at::MemoryFormat::Contiguous);
  at::Tensor dx = need_dx ? at::empty(x.sizes(), contiguous) : at::empty({0}, x.options());
  const auto param_options = x.options().dtype(c.wtype);
  at::Tensor dw = need_dweight ? at::empty({c.n}, param_options) : at::empty({0}, param_options);
  at::Tensor db = need_dbias ? at::empty({c.n}, param_options) : at::empty({0}, param_options);
  if (x.numel() == 0 || !(need_dx || need_dweight || need_dbias)) {
    if (need_dweight) dw.zero_();
    if (need_dbias) db.zero_();
    return {dx, dw, db};
  }
  const auto [xc, outer_stride] = strided_input(x, begin_dim, c.n * c.inner);
  const at::Tensor dyc = dy.contiguous();

  NormBackwardParams p{};
  p.x = xc.data_ptr();
  p.dy = dyc.data_ptr();
  p.weight = c.w.defined() ? c.w.data_ptr() : nullptr;
  p.dx = need_dx ? dx.data_ptr() : nullptr;
  p.dweight = need_dweight ? dw.data_ptr() : nullptr;
  p.dbias = need_dbias ? db.data_ptr() : nullptr;
  p.outer = c.outer;
  p.n = c.n;
  p.inner = c.inner;
  p.x_outer_stride = outer_stride;
  p.dtype = c.code;
  p.wdtype = c.has_params ? dtype_code(c.wtype) : FN_NONE;
  p.rms = rms ? 1 : 0;
  p.eps = eps;
#ifdef FASTNORM_CUDA
  at::Tensor workspace;
  const int64_t ws_bytes = fastnorm_cuda_backward_workspace_bytes(p);
  if (ws_bytes > 0) {
    workspace = at::empty({ws_bytes}, x.options().dtype(at::kByte));
    p.workspace = workspace.data_ptr();
    p.workspace_bytes = ws_bytes;
  }
  const char* err = fastnorm_cuda_backward(p, c10::cuda::getCurrentCUDAStream().stream());
#else
  const char* err = fastnorm_cpu_backward(p);
#endif
  TORCH_CHECK(err == nullptr, "fastnorm backward kernel failed: ", err);
  return {dx, dw, db};
}

#ifndef FASTNORM_INLINE
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>

namespace {

// The fast entry behind fastnorm.layer_norm / rms_norm: a plain call (exact tensors, no autograd to
// record, no dispatch mode or functorch wrapper, simple arguments) runs the kernels straight away,
// saving the microseconds of Python checks that decide small shapes. Anything else returns None and
// the caller takes the Python path, which owns every error message: this function never raises for
// bad input, it only declines.
bool plain_tensor(PyObject* obj, bool grad_mode, const at::Tensor** out) {
  if (!THPVariable_CheckExact(obj)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  static const c10::DispatchKeySet needs_dispatch({c10::DispatchKey::FuncTorchBatched,
                                                   c10::DispatchKey::FuncTorchGradWrapper,
                                                   c10::DispatchKey::Python, c10::DispatchKey::Functionalize});
  if (!t.defined() || t.layout() != at::kStrided || (grad_mode && t.requires_grad()) ||
      t.key_set().has_any(needs_dispatch)) {
    return false;
  }
  *out = &t;
  return true;
}

// Sizes from an int or a tuple / list / torch.Size of ints; false for anything else.
bool shape_arg(PyObject* obj, std::vector<int64_t>* shape) {
  if (PyLong_CheckExact(obj)) {
    shape->push_back(PyLong_AsLongLong(obj));
    return !PyErr_Occurred() || (PyErr_Clear(), false);
  }
  if (!PyTuple_Check(obj) && !PyList_CheckExact(obj)) return false;  // torch.Size is a tuple
  const Py_ssize_t k = PySequence_Fast_GET_SIZE(obj);
  for (Py_ssize_t i = 0; i < k; ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(obj, i);
    if (!PyLong_CheckExact(item)) return false;
    shape->push_back(PyLong_AsLongLong(item));
    if (PyErr_Occurred()) return PyErr_Clear(), false;
  }
  return true;
}

bool float_dtype(at::ScalarType t) { return dtype_code(t) != FN_NONE; }

double default_eps(at::ScalarType t) {
  switch (t) {
    case at::kHalf: return 0.0009765625;
    case at::kBFloat16: return 0.0078125;
    case at::kDouble: return 2.220446049250313e-16;
    default: return 1.1920928955078125e-07;
  }
}

py::object try_norm(py::handle x_obj, py::handle shape_obj, py::handle dim_obj, py::handle w_obj,
                    py::handle b_obj, py::handle eps_obj, bool rms) {
  const bool grad_mode = at::GradMode::is_enabled();
  const at::Tensor* x = nullptr;
  if (!plain_tensor(x_obj.ptr(), grad_mode, &x) || c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
    return py::none();
  }
#ifdef FASTNORM_CUDA
  if (!x->is_cuda()) return py::none();
#else
  if (!x->is_cpu()) return py::none();
#endif
  if (!float_dtype(x->scalar_type())) return py::none();
  const int64_t ndim = x->dim();
  int64_t begin = 0, end = ndim;
  std::vector<int64_t> shape;
  const bool has_shape = !shape_obj.is_none();
  if (has_shape && !shape_arg(shape_obj.ptr(), &shape)) return py::none();
  if (dim_obj.is_none()) {
    if (!has_shape || shape.empty() || int64_t(shape.size()) > ndim) return py::none();
    begin = ndim - int64_t(shape.size());
  } else {
    if (!PyLong_CheckExact(dim_obj.ptr()) || ndim == 0) return py::none();
    int64_t d = PyLong_AsLongLong(dim_obj.ptr());
    if (PyErr_Occurred()) return PyErr_Clear(), py::none();
    if (d < -ndim || d >= ndim) return py::none();
    begin = d < 0 ? d + ndim : d;
    end = begin + 1;
    if (has_shape && shape.size() != 1) return py::none();
  }
  const c10::IntArrayRef norm_sizes = x->sizes().slice(begin, end - begin);
  if (has_shape && norm_sizes != c10::IntArrayRef(shape)) return py::none();
  c10::optional<at::Tensor> params[2];
  PyObject* param_objs[2] = {w_obj.ptr(), b_obj.ptr()};
  for (int i = 0; i < 2; ++i) {
    if (param_objs[i] == Py_None) continue;
    const at::Tensor* t = nullptr;
    if (!plain_tensor(param_objs[i], grad_mode, &t) || !float_dtype(t->scalar_type()) ||
        t->sizes() != norm_sizes || t->device() != x->device()) {
      return py::none();
    }
    params[i] = *t;
  }
  double eps;
  if (eps_obj.is_none() && rms) {
    eps = default_eps(x->scalar_type());
  } else if (PyFloat_CheckExact(eps_obj.ptr())) {
    eps = PyFloat_AS_DOUBLE(eps_obj.ptr());
  } else {
    return py::none();
  }
  return py::cast(norm_forward(*x, params[0], params[1], begin, end, eps, rms, 0, 0));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("norm_forward", &norm_forward, "LayerNorm / RMSNorm over dims [begin_dim, end_dim) of x",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("begin_dim"), py::arg("end_dim"),
        py::arg("eps"), py::arg("rms"), py::arg("threads") = 0, py::arg("blocks_per_row") = 0);
  m.def("norm_backward", &norm_backward, "(dx, dweight, dbias) of norm_forward given the output gradient dy",
        py::arg("dy"), py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("begin_dim"), py::arg("end_dim"),
        py::arg("eps"), py::arg("rms"), py::arg("need_dx"), py::arg("need_dweight"), py::arg("need_dbias"));
  m.def("try_layer_norm",
        [](py::handle x, py::handle shape, py::handle dim, py::handle w, py::handle b, py::handle eps) {
          return try_norm(x, shape, dim, w, b, eps, false);
        },
        "fastnorm.layer_norm for a plain call, None when the call needs the full Python path");
  m.def("try_rms_norm",
        [](py::handle x, py::handle shape, py::handle dim, py::handle w, py::handle eps) {
          return try_norm(x, shape, dim, w, py::none(), eps, true);
        },
        "fastnorm.rms_norm for a plain call, None when the call needs the full Python path");
}
#endif
