// The extension's Python module: norm_forward, norm_backward, the family's forwards, the fast entries behind
// fastnorm.layer_norm / rms_norm and their eager autograd (CppNormFunction), and the CPU fast entries behind
// fastnorm.group_norm / batch_norm with theirs (CppFamilyFunction). Not part of
// single-file solutions (load_inline writes its own module).
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <tuple>
#include <vector>

#include "binding.h"
#include "family_params.h"

namespace fastnorm {

// Keys of tensors that a call must not skip the dispatcher for: functorch wrappers, Python subclasses
// (__torch_dispatch__), functionalization.
inline c10::DispatchKeySet wrapper_keys() {
  static const c10::DispatchKeySet keys({c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
                                         c10::DispatchKey::Python, c10::DispatchKey::Functionalize});
  return keys;
}

}  // namespace fastnorm

#include <ATen/TracerMode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/autograd/custom_function.h>

namespace fastnorm {

// The autograd of a plain eager call of fastnorm.layer_norm / rms_norm: ops/eager_autograd.py's
// NormFunction in C++, with the same kernels, saved tensors and backward (norm_ops.norm_backward: the
// kernels straight when nothing records or intercepts the backward, else the op fastnorm::norm_backward),
// without the Python autograd.Function's host time (on a 2-core CPU the op's Python autograd took a small
// training step from 35 to 108-124 us; this Function 37). In the CUDA build it also saves the rows'
// statistics, as the *_train ops do. y = norm(x) [* weight + bias] over dims [begin, end).
struct CppNormFunction : public torch::autograd::Function<CppNormFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
                            int64_t begin, int64_t end, double eps, bool rms) {
    ctx->saved_data["begin"] = begin;
    ctx->saved_data["end"] = end;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["rms"] = rms;
#ifdef FASTNORM_CUDA
    std::vector<at::Tensor> y_stats = norm_forward_train(x, weight, bias, begin, end, eps, rms);
    ctx->save_for_backward({x, weight.value_or(at::Tensor()), bias.value_or(at::Tensor()), y_stats[1]});
    return y_stats[0];
#else
    ctx->save_for_backward({x, weight.value_or(at::Tensor()), bias.value_or(at::Tensor()), at::Tensor()});
    return norm_forward(x, weight, bias, begin, end, eps, rms, 0, 0);
#endif
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &b = saved[2], &stats = saved[3], &dy = grads[0];
    // needs_input_grad counts the tensor inputs given (an absent weight has no edge).
    const bool need_dx = ctx->needs_input_grad(0);
    const bool need_dw = w.defined() && ctx->needs_input_grad(1);
    const bool need_db = b.defined() && ctx->needs_input_grad(w.defined() ? 2 : 1);
    const int64_t begin = ctx->saved_data["begin"].toInt(), end = ctx->saved_data["end"].toInt();
    const double eps = ctx->saved_data["eps"].toDouble();
    const bool rms = ctx->saved_data["rms"].toBool();
    const c10::optional<at::Tensor> wo = w.defined() ? c10::optional<at::Tensor>(w) : c10::nullopt;
    const c10::optional<at::Tensor> bo = b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt;
    const c10::optional<at::Tensor> so = stats.defined() ? c10::optional<at::Tensor>(stats) : c10::nullopt;
    at::Tensor dx, dw, db;
    if (direct_backward(dy, x, w, b)) {  // norm_ops.norm_backward_kernel
      std::vector<at::Tensor> g = norm_backward(dy, x, wo, bo, begin, end, eps, rms, need_dx, need_dw, need_db,
                                                c10::nullopt, so);
      dx = std::move(g[0]);
      if (need_dw) dw = as_param(std::move(g[1]), w);
      if (need_db) db = as_param(std::move(g[2]), b);
    } else {  // through the op, as torch.ops.fastnorm.norm_backward
      static const auto op =
          c10::Dispatcher::singleton()
              .findSchemaOrThrow("fastnorm::norm_backward", "")
              .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
                  const at::Tensor&, const at::Tensor&, int64_t, int64_t, const c10::optional<at::Tensor>&,
                  const c10::optional<at::Tensor>&, double, bool, bool, bool, bool,
                  const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&)>();
      std::tie(dx, dw, db) =
          op.call(dy, x, begin, end, wo, bo, eps, rms, need_dx, need_dw, need_db, c10::nullopt, so);
    }
    return {need_dx ? dx : at::Tensor(), need_dw ? dw : at::Tensor(), need_db ? db : at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }

  // g.reshape(param.shape).to(param.dtype), as norm_ops.norm_backward_kernel: without the dispatcher calls
  // (a view's metadata) where they would change nothing.
  static at::Tensor as_param(at::Tensor g, const at::Tensor& param) {
    if (g.sizes() != param.sizes()) g = g.reshape(param.sizes());
    if (g.scalar_type() != param.scalar_type()) g = g.to(param.scalar_type());
    return g;
  }

  // ops/direct.py's direct_call_ok for the backward's tensors: no dispatch mode, and no gradient to record
  // (a double backward) or wrapped tensor to handle.
  static bool direct_backward(const at::Tensor& dy, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    if (c10::impl::TorchDispatchModeTLS::stack_len() > 0) return false;
    const bool grad = at::GradMode::is_enabled();
    for (const at::Tensor* t : {&dy, &x, &w, &b}) {
      if (!t->defined()) continue;
      if ((grad && t->requires_grad()) || t->key_set().has_any(wrapper_keys())) return false;
    }
    return true;
  }
};

// The autograd of a plain eager CPU call of fastnorm.group_norm (mode FN_BWD_GROUPS; InstanceNorm is groups
// = C) or batch_norm in training (FN_BWD_BATCH) that records gradients: the op's register_autograd backward
// (ops/family_ops.py) in C++, with the same kernels and results, without its Python host time (on the 2-core
// CPU a 16x32x8x8 GroupNorm step took 462 us through the op against eager's 124). Outputs (y, mean, var), the
// statistics not differentiable. Backward: family_backward straight (the fast entry takes only planes of
// kMinKernelPlane+ elements, where the op's backward takes the kernels too); a backward that is itself
// recorded (double backward) or intercepted goes to family_ops.family_backward_fallback, the op's torch-op
// formula.
struct CppFamilyFunction : public torch::autograd::Function<CppFamilyFunction> {
  static constexpr int64_t kMinKernelPlane = 32;  // family_ops._MIN_KERNEL_PLANE

  // (y, mean, var) of the call, from the forward kernels of its mode.
  static std::vector<at::Tensor> kernels(const at::Tensor& x, const c10::optional<at::Tensor>& weight,
                                         const c10::optional<at::Tensor>& bias, int64_t groups, double eps,
                                         int64_t activation, int64_t mode) {
    return mode == FN_BWD_GROUPS ? group_norm_forward(x, weight, bias, groups, eps, activation)
                                 : batch_norm_forward(x, weight, bias, c10::nullopt, c10::nullopt, eps);
  }

  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const c10::optional<at::Tensor>& weight,
                                                const c10::optional<at::Tensor>& bias, int64_t groups, double eps,
                                                int64_t activation, int64_t mode) {
    std::vector<at::Tensor> out = kernels(x, weight, bias, groups, eps, activation, mode);
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["activation"] = activation;
    ctx->saved_data["mode"] = mode;
    ctx->save_for_backward({x, weight.value_or(at::Tensor()), bias.value_or(at::Tensor()), out[1], out[2]});
    ctx->mark_non_differentiable({out[1], out[2]});
    ctx->set_materialize_grads(false);  // no zero gradients made for the statistics
    return {out[0], out[1], out[2]};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    torch::autograd::variable_list result(7);  // x, weight, bias, groups, eps, activation, mode
    const at::Tensor& dy = grads[0];
    if (!dy.defined()) return result;  // only the statistics were used
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &w = saved[1], &b = saved[2], &mean = saved[3], &var = saved[4];
    const bool need_dx = ctx->needs_input_grad(0);  // indices count the tensors given, as CppNormFunction's
    const bool need_dw = w.defined() && ctx->needs_input_grad(1);
    const bool need_db = b.defined() && ctx->needs_input_grad(w.defined() ? 2 : 1);
    const int64_t groups = ctx->saved_data["groups"].toInt(), activation = ctx->saved_data["activation"].toInt();
    const int64_t mode = ctx->saved_data["mode"].toInt();
    const double eps = ctx->saved_data["eps"].toDouble();
    if (CppNormFunction::direct_backward(dy, x, w, b)) {
      std::vector<at::Tensor> g =
          family_backward(dy, x, w.defined() ? c10::optional<at::Tensor>(w) : c10::nullopt,
                          b.defined() ? c10::optional<at::Tensor>(b) : c10::nullopt, mean, var, groups, eps,
                          activation, mode, need_dx, need_dw, need_db);
      result[0] = std::move(g[0]);
      if (need_dw) result[1] = CppNormFunction::as_param(std::move(g[1]), w);
      if (need_db) result[2] = CppNormFunction::as_param(std::move(g[2]), b);
      return result;
    }
    py::gil_scoped_acquire gil;
    // Leaked on purpose: a static py::object would be released after the interpreter has gone.
    static PyObject* fallback =
        py::object(py::module_::import("fastnorm.ops.family_ops").attr("family_backward_fallback")).release().ptr();
    auto arg = [](const at::Tensor& t) { return t.defined() ? py::cast(t) : py::none(); };
    py::tuple g = py::reinterpret_borrow<py::object>(fallback)(
        dy, x, arg(w), arg(b), mean, var, groups, eps, activation, mode, py::make_tuple(need_dx, need_dw, need_db));
    for (int i = 0; i < 3; ++i) {
      if (!g[i].is_none()) result[i] = g[i].cast<at::Tensor>();
    }
    return result;
  }
};

// True when a call that records autograd may take CppNormFunction in place of the op: not traced by
// torch.jit and inside no functorch transform (the caller checks the tensors and dispatch modes).
inline bool function_context_ok() {
  return !at::tracer::impl::is_dispatch_enabled() &&
         !c10::impl::tls_is_dispatch_key_included(c10::DispatchKey::FuncTorchDynamicLayerFrontMode);
}

}  // namespace fastnorm

namespace {

// The fast entry behind fastnorm.layer_norm / rms_norm: a plain call (exact tensors, no dispatch mode
// or functorch wrapper, simple arguments) runs the kernels straight away, saving the microseconds of
// Python checks that decide small shapes; one that records autograd (outside torch.jit
// tracing and functorch transforms) runs them through CppNormFunction, as ops/eager_autograd.py would.
// Anything else returns None and the caller takes the Python path, which owns every error message:
// this function never raises for bad input, it only declines. *grad: whether the call records autograd.
bool plain_tensor(PyObject* obj, bool grad_mode, const at::Tensor** out, bool* grad) {
  if (!THPVariable_CheckExact(obj)) return false;
  const at::Tensor& t = THPVariable_Unpack(obj);
  if (!t.defined() || t.layout() != at::kStrided || t.key_set().has_any(fastnorm::wrapper_keys())) return false;
  if (grad_mode && t.requires_grad()) *grad = true;
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
    case at::kDouble: return 2.220446049250313e-16;  // half types too take float32's: validate.default_rms_eps
    default: return 1.1920928955078125e-07;
  }
}

py::object try_norm(py::handle x_obj, py::handle shape_obj, py::handle dim_obj, py::handle w_obj,
                    py::handle b_obj, py::handle eps_obj, bool rms) {
  const bool grad_mode = at::GradMode::is_enabled();
  bool grad = false;
  const at::Tensor* x = nullptr;
  if (!plain_tensor(x_obj.ptr(), grad_mode, &x, &grad) || c10::impl::TorchDispatchModeTLS::stack_len() > 0) {
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
    if (!plain_tensor(param_objs[i], grad_mode, &t, &grad) || !float_dtype(t->scalar_type()) ||
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
  if (grad) {
    if (!fastnorm::function_context_ok()) return py::none();
    return py::cast(fastnorm::CppNormFunction::apply(*x, params[0], params[1], begin, end, eps, rms));
  }
  return py::cast(norm_forward(*x, params[0], params[1], begin, end, eps, rms, 0, 0));
}

// A per-channel tensor (weight, bias, running statistics) of a plain family call: none, or a plain tensor of
// shape (C,) on x's device in x's dtype or its accumulator's (what the kernels take unconverted; ops/
// family_functional.py converts the others).
bool channel_tensor(PyObject* obj, const at::Tensor& x, bool grad_mode, bool* grad, c10::optional<at::Tensor>* out) {
  if (obj == Py_None) return true;
  const at::Tensor* t = nullptr;
  if (!plain_tensor(obj, grad_mode, &t, grad) || t->dim() != 1 || t->size(0) != x.size(1) || t->device() != x.device()) {
    return false;
  }
  const at::ScalarType acc = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  if (t->scalar_type() != x.scalar_type() && t->scalar_type() != acc) return false;
  *out = *t;
  return true;
}

// x of a plain family call, (N, C, *spatial) with at least one element: the checks of try_norm (CPU build
// only: the CUDA build's family calls keep the Python path until this has run on a GPU).
bool family_input(PyObject* obj, bool grad_mode, const at::Tensor** x, bool* grad) {
#ifdef FASTNORM_CUDA
  return false;
#else
  return plain_tensor(obj, grad_mode, x, grad) && c10::impl::TorchDispatchModeTLS::stack_len() == 0 &&
         (*x)->is_cpu() && float_dtype((*x)->scalar_type()) && (*x)->dim() >= 2 && (*x)->numel() > 0;
#endif
}

int64_t plane_size(const at::Tensor& x) {
  int64_t s = 1;
  for (int64_t d = 2; d < x.dim(); ++d) s *= x.size(d);
  return s;
}

// y of group_norm_forward / batch_norm_forward's outputs, through CppFamilyFunction where the call records
// gradients (None where the backward would not take the kernels: short planes, or a context the Function
// must not be recorded in).
py::object family_call(const at::Tensor& x, const c10::optional<at::Tensor>& w, const c10::optional<at::Tensor>& b,
                       int64_t groups, double eps, int64_t activation, int64_t mode, bool grad,
                       std::vector<at::Tensor>* out) {
  if (grad) {
    if (!fastnorm::function_context_ok() || plane_size(x) < fastnorm::CppFamilyFunction::kMinKernelPlane) {
      return py::none();
    }
    *out = fastnorm::CppFamilyFunction::apply(x, w, b, groups, eps, activation, mode);
  } else {
    *out = fastnorm::CppFamilyFunction::kernels(x, w, b, groups, eps, activation, mode);
  }
  return py::cast((*out)[0]);
}

// The fast entry behind fastnorm.group_norm with weight or bias or an activation (try_norm's contract: it
// declines what the Python path must see, and never raises for bad input).
py::object try_group_norm(py::handle x_obj, py::handle groups_obj, py::handle w_obj, py::handle b_obj,
                          py::handle eps_obj, py::handle act_obj) {
  const bool grad_mode = at::GradMode::is_enabled();
  bool grad = false;
  const at::Tensor* x = nullptr;
  if (!family_input(x_obj.ptr(), grad_mode, &x, &grad) || !PyLong_CheckExact(groups_obj.ptr()) ||
      !PyFloat_CheckExact(eps_obj.ptr())) {
    return py::none();
  }
  int64_t activation = FN_ACT_NONE;
  if (!act_obj.is_none()) {
    if (!PyUnicode_CheckExact(act_obj.ptr()) || py::cast<std::string>(act_obj) != "silu") return py::none();
    activation = FN_ACT_SILU;
  }
  const int64_t groups = PyLong_AsLongLong(groups_obj.ptr());
  if (PyErr_Occurred()) return PyErr_Clear(), py::none();
  const int64_t channels = x->size(1);
  if (groups <= 0 || channels % groups != 0 || x->size(0) * (channels / groups) * plane_size(*x) == 1) {
    return py::none();
  }
  c10::optional<at::Tensor> w, b;
  if (!channel_tensor(w_obj.ptr(), *x, grad_mode, &grad, &w) || !channel_tensor(b_obj.ptr(), *x, grad_mode, &grad, &b) ||
      (!w && !b && activation == FN_ACT_NONE)) {  // no parameters: group_norm takes the LayerNorm kernels
    return py::none();
  }
  std::vector<at::Tensor> out;
  return family_call(*x, w, b, groups, PyFloat_AS_DOUBLE(eps_obj.ptr()), activation, FN_BWD_GROUPS, grad, &out);
}

// running <- lerp(running, stat * correction, momentum), as family_functional._update_running does it for
// float32 / float64 buffers (the same operations, so the same bits).
void update_running(const c10::optional<at::Tensor>& running, const at::Tensor& stat, double momentum,
                    double correction) {
  if (!running) return;
  at::NoGradGuard no_grad;
  const at::Tensor s = correction != 1.0 ? stat.mul(correction) : stat;
  running->lerp_(s.to(running->scalar_type()), momentum);
}

// The fast entry behind fastnorm.batch_norm in training (batch statistics; running statistics, when given,
// float32 / float64 buffers updated in place).
py::object try_batch_norm(py::handle x_obj, py::handle rm_obj, py::handle rv_obj, py::handle w_obj, py::handle b_obj,
                          py::handle training_obj, py::handle momentum_obj, py::handle eps_obj) {
  const bool grad_mode = at::GradMode::is_enabled();
  bool grad = false;
  const at::Tensor* x = nullptr;
  if (training_obj.ptr() != Py_True || !family_input(x_obj.ptr(), grad_mode, &x, &grad) ||
      !PyFloat_CheckExact(momentum_obj.ptr()) || !PyFloat_CheckExact(eps_obj.ptr())) {
    return py::none();
  }
  const double eps = PyFloat_AS_DOUBLE(eps_obj.ptr()), momentum = PyFloat_AS_DOUBLE(momentum_obj.ptr());
  const int64_t count = x->size(0) * plane_size(*x);
  if (count <= 1 || !(eps > 0)) return py::none();
  c10::optional<at::Tensor> running[2], w, b;
  bool running_grad = false;  // running statistics that require grad go to the Python path
  PyObject* running_objs[2] = {rm_obj.ptr(), rv_obj.ptr()};
  for (int i = 0; i < 2; ++i) {
    if (!channel_tensor(running_objs[i], *x, true, &running_grad, &running[i]) || running_grad) return py::none();
    if (running[i] && (!running[i]->is_contiguous() || (running[i]->scalar_type() != at::kFloat &&
                                                         running[i]->scalar_type() != at::kDouble))) {
      return py::none();
    }
  }
  if (!channel_tensor(w_obj.ptr(), *x, grad_mode, &grad, &w) || !channel_tensor(b_obj.ptr(), *x, grad_mode, &grad, &b)) {
    return py::none();
  }
  std::vector<at::Tensor> out;
  py::object y = family_call(*x, w, b, 1, eps, FN_ACT_NONE, FN_BWD_BATCH, grad, &out);
  if (!y.is_none()) {
    update_running(running[0], out[1], momentum, 1.0);
    update_running(running[1], out[2], momentum, double(count) / double(count - 1));
  }
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("norm_forward", &norm_forward, "LayerNorm / RMSNorm over dims [begin_dim, end_dim) of x",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("begin_dim"), py::arg("end_dim"),
        py::arg("eps"), py::arg("rms"), py::arg("threads") = 0, py::arg("blocks_per_row") = 0);
  m.def("norm_forward_train", &norm_forward_train,
        "(y, stats): norm_forward, and the rows' statistics for norm_backward where the kernel saves them",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("begin_dim"), py::arg("end_dim"), py::arg("eps"),
        py::arg("rms"));
  m.def("norm_backward", &norm_backward, "(dx, dweight, dbias) of norm_forward given the output gradient dy",
        py::arg("dy"), py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("begin_dim"), py::arg("end_dim"),
        py::arg("eps"), py::arg("rms"), py::arg("need_dx"), py::arg("need_dweight"), py::arg("need_dbias"),
        py::arg("dx_add") = py::none(), py::arg("stats") = py::none());
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
  m.def("family_backward", &family_backward,
        "(dx, dweight, dbias) of group_norm_forward / batch_norm_forward (mode 0 groups, 1 batch statistics, "
        "2 given statistics), each None where not needed; dweight, dbias in the accumulator dtype",
        py::arg("dy"), py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("mean"), py::arg("var"),
        py::arg("groups"), py::arg("eps"), py::arg("activation"), py::arg("mode"), py::arg("need_dx"),
        py::arg("need_dweight"), py::arg("need_dbias"));
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
  m.def("try_group_norm", &try_group_norm,
        "fastnorm.group_norm for a plain CPU call with weight, bias or an activation, None when the call needs "
        "the full Python path");
  m.def("try_batch_norm", &try_batch_norm,
        "fastnorm.batch_norm for a plain CPU call in training, None when the call needs the full Python path");
  m.def("norm_forward_autograd",
        [](const at::Tensor& x, const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bias,
           int64_t begin_dim, int64_t end_dim, double eps, bool rms) {
          return fastnorm::CppNormFunction::apply(x, weight, bias, begin_dim, end_dim, eps, rms);
        },
        "norm_forward recording CppNormFunction (ops/eager_autograd.py's NormFunction in C++) for autograd",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("begin_dim"), py::arg("end_dim"),
        py::arg("eps"), py::arg("rms"));
#ifdef FASTNORM_CUDA
  m.def("cross_entropy_forward", &cross_entropy_forward,
        "(out, lse, valid): softmax cross-entropy of logits (rows, classes) against int64 target classes, "
        "reduced (0 none, 1 sum, 2 mean), the rows' log-sum-exp and the count of rows not ignored",
        py::arg("logits"), py::arg("target"), py::arg("ignore_index"), py::arg("reduction"));
  m.def("cross_entropy_backward", &cross_entropy_backward,
        "the gradient of the logits of cross_entropy_forward given the gradient dloss of its out",
        py::arg("dloss"), py::arg("logits"), py::arg("target"), py::arg("lse"), py::arg("valid"),
        py::arg("ignore_index"), py::arg("reduction"));
#endif
}
