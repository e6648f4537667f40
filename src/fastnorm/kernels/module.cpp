// The extension's Python module: norm_forward, norm_backward, the family's forwards, and the fast entries behind
// fastnorm.layer_norm / rms_norm. Not part of single-file solutions (load_inline writes its own module).
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <vector>

#include "binding.h"

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
        py::arg("eps"), py::arg("rms"), py::arg("need_dx"), py::arg("need_dweight"), py::arg("need_dbias"),
        py::arg("dx_add") = py::none());
  m.def("add_norm_forward", &add_norm_forward, "(y, h): h = x + residual, y = norm(h) over dims [begin_dim, end_dim)",
        py::arg("x"), py::arg("residual"), py::arg("weight"), py::arg("bias"), py::arg("begin_dim"),
        py::arg("end_dim"), py::arg("eps"), py::arg("rms"), py::arg("residual_in_fp32"));
  m.def("group_norm_forward", &group_norm_forward,
        "(y, mean, var): GroupNorm of x (N, C, *) with per-channel weight / bias, then the activation "
        "(0 none, 1 SiLU) in the same pass; mean, var (N, groups)",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("groups"), py::arg("eps"), py::arg("activation") = 0);
  m.def("batch_norm_forward", &batch_norm_forward,
        "(y, mean, var): BatchNorm of x (N, C, *) with the given per-channel mean / var, or the batch's",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("mean"), py::arg("var"), py::arg("eps"));
  m.def("p_normalize", &p_normalize, "x / max(norm, eps), the 1- or 2-norm over dims [begin_dim, end_dim)",
        py::arg("x"), py::arg("p"), py::arg("begin_dim"), py::arg("end_dim"), py::arg("eps"), py::arg("mean"));
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
