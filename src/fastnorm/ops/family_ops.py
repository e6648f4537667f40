"""The custom ops of the normalization family: torch.ops.fastnorm.group_norm, batch_norm,
batch_norm_eval and p_normalize, with their kernels, fake (meta) functions and autograd.

- group_norm(x, weight, bias, groups, eps, activation=None) -> (y, mean, var): statistics per (sample,
  group), shape (N, groups); InstanceNorm is groups = C. activation "silu" makes y = silu(GroupNorm(x)),
  applied by the kernels' output pass (no extra pass over y).
- batch_norm(x, weight, bias, eps) -> (y, mean, var): batch statistics per channel, shape (C,)
  (BatchNorm in training); mean and the biased var feed the running statistics.
- batch_norm_eval(x, weight, bias, mean, var, eps) -> y: given per-channel statistics (BatchNorm in
  eval mode, InstanceNorm with use_input_stats=False). A separate op because an op may not return its
  inputs, which the statistics would be here.
- p_normalize(x, p, begin_dim, end_dim, eps, mean) -> y = x / max(norm, eps), p 1 or 2, over the
  dims [begin_dim, end_dim); mean=True divides the sum by the count first.

Statistics are float32 (float64 for float64 x) and not differentiable. The affine members' backward is
fused kernels (kernels/family_backward.cuh on CUDA, norm_cpu_family_backward.cpp on the CPU: two passes over
x and dy, deterministic dweight / dbias) where the call is plain (no tracing or dispatch mode) and planes hold
at least _MIN_KERNEL_PLANE elements; shorter planes on the CPU take ATen's own GroupNorm / BatchNorm backward
given the saved statistics. The rest (short planes on CUDA, a recorded backward (double backward),
p_normalize) is written with torch ops.
"""
import math

import torch

from fastnorm.ops import extension, norm_ops  # noqa: F401  (norm_ops defines the fastnorm library)
from fastnorm.ops.norm_ops import accumulator_dtype  # noqa: F401  (family_functional's and the tests' too)
from fastnorm.ops.direct import direct_call_ok
from fastnorm.ops.library_compat import register_autograd, register_fake

_lib = torch.library.Library("fastnorm", "FRAGMENT")
_lib.define("group_norm(Tensor x, Tensor? weight, Tensor? bias, int groups, float eps, str? activation=None) "
            "-> (Tensor, Tensor, Tensor)")
_lib.define("batch_norm(Tensor x, Tensor? weight, Tensor? bias, float eps) -> (Tensor, Tensor, Tensor)")
_lib.define("batch_norm_eval(Tensor x, Tensor? weight, Tensor? bias, Tensor mean, Tensor var, float eps) -> Tensor")
_lib.define("p_normalize(Tensor x, float p, int begin_dim, int end_dim, float eps, bool mean) -> Tensor")


def kernels(device_type: str):
    """The compiled module holding the family's kernels for a device type (the tests put a plain-torch
    stand-in here while an extension lacks them)."""
    return extension.load(device_type)


# Activations the family's output pass applies, by name -> the kernels' FamilyActivation code.
ACTIVATIONS = {None: 0, "silu": 1}


def activation_code(activation, op: str = "group_norm") -> int:
    if not (activation is None or (isinstance(activation, str) and activation in ACTIVATIONS)):
        allowed = ", ".join(repr(a) for a in ACTIVATIONS)
        raise ValueError(f"fastnorm.{op}: activation must be one of {allowed}, got {activation!r}")
    return ACTIVATIONS[activation]


def group_norm_kernel(x, weight, bias, groups, eps, activation=None):
    ext = kernels(x.device.type)
    if activation is None:  # the 5-argument call: stand-ins and builds from before the activation take it
        return tuple(ext.group_norm_forward(x, weight, bias, groups, eps))
    y, mean, var = ext.group_norm_forward(x, weight, bias, groups, eps, activation_code(activation))
    return y, mean, var


def batch_norm_kernel(x, weight, bias, eps):
    y, mean, var = kernels(x.device.type).batch_norm_forward(x, weight, bias, None, None, eps)
    return y, mean, var


def batch_norm_eval_kernel(x, weight, bias, mean, var, eps):
    return kernels(x.device.type).batch_norm_forward(x, weight, bias, mean, var, eps)[0]


def p_normalize_kernel(x, p, begin_dim, end_dim, eps, mean):
    return kernels(x.device.type).p_normalize(x, p, begin_dim, end_dim, eps, mean)


_KERNELS = {"group_norm": group_norm_kernel, "batch_norm": batch_norm_kernel,
            "batch_norm_eval": batch_norm_eval_kernel, "p_normalize": p_normalize_kernel}

for _name, _kernel in _KERNELS.items():
    for _key in ("CPU", "CUDA"):
        _lib.impl(_name, _kernel, _key)


def call(name: str, *args):
    """torch.ops.fastnorm.<name>(*args); straight to the kernel when nothing traces or records the call
    (host time is most of a small call)."""
    if direct_call_ok(*(a for a in args if isinstance(a, torch.Tensor))):
        return _KERNELS[name](*args)
    return getattr(torch.ops.fastnorm, name)(*args)


def _like(x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _stats(x, shape):
    mean = x.new_empty(shape, dtype=accumulator_dtype(x.dtype))
    return mean, torch.empty_like(mean)


@register_fake("fastnorm::group_norm")
def _group_norm_fake(x, weight, bias, groups, eps, activation=None):
    activation_code(activation)
    return (_like(x),) + _stats(x, (x.shape[0], groups))


@register_fake("fastnorm::batch_norm")
def _batch_norm_fake(x, weight, bias, eps):
    return (_like(x),) + _stats(x, (x.shape[1],))


@register_fake("fastnorm::batch_norm_eval")
def _batch_norm_eval_fake(x, weight, bias, mean, var, eps):
    return _like(x)


@register_fake("fastnorm::p_normalize")
def _p_normalize_fake(x, p, begin_dim, end_dim, eps, mean):
    return _like(x)


# ---- autograd -------------------------------------------------------------------------------------

def _save_affine_norm(ctx, x, weight, bias, mean, var, groups, eps, activation=None):
    ctx.groups, ctx.eps, ctx.activation = groups, eps, activation
    ctx.bias_dtype = None if bias is None else bias.dtype
    # bias (a per-channel vector) only where the backward recomputes the activation's input
    ctx.save_for_backward(x, weight, mean, var, bias if activation is not None else None)


def _statistics_take_no_gradient(ctx, output):
    """The statistics outputs (mean, var) carry no gradient, and the backward gets None for them instead
    of two zero tensors autograd would allocate and fill on every step (two launches and allocations:
    ~10% of a small GroupNorm's backward call on the host)."""
    ctx.mark_non_differentiable(*output[1:])
    ctx.set_materialize_grads(False)


def _setup_group_norm(ctx, inputs, output):
    x, weight, bias, groups, eps = inputs[:5]
    ctx.n_inputs = len(inputs)
    _statistics_take_no_gradient(ctx, output)
    _save_affine_norm(ctx, x, weight, bias, output[1], output[2], groups, eps, inputs[5] if len(inputs) > 5 else None)


def _setup_batch_norm(ctx, inputs, output):
    x, weight, bias, eps = inputs
    _statistics_take_no_gradient(ctx, output)
    _save_affine_norm(ctx, x, weight, bias, output[1], output[2], 1, eps)


def _setup_batch_norm_eval(ctx, inputs, output):
    x, weight, bias, mean, var, eps = inputs
    _save_affine_norm(ctx, x, weight, bias, mean, var, 1, eps)


def _affine_norm_backward(ctx, dy, per_sample: bool, batch_stats: bool):
    """(dx, dweight, dbias) of y = (x - mean) * rstd * weight + bias. x is viewed as (N, G, C/G, S):
    per-sample statistics (group/instance norm) have shape (N, G) and reduce over the last two dims;
    per-channel ones (batch norm, G = 1) have shape (C,) and reduce over N and S. With batch_stats the
    statistics depend on x; given ones (eval) do not: dx = dy * weight * rstd."""
    x, weight, mean, var, bias = ctx.saved_tensors
    if dy is None:  # grads are not materialized (_statistics_take_no_gradient): y's was never asked for
        return None, None, None
    grads = _affine_norm_backward_kernel(ctx, dy, x, weight, mean, var, bias, per_sample, batch_stats)
    if grads is None and x.device.type == "cpu" and not torch.is_grad_enabled() and x.numel() > 0:
        grads = _affine_norm_backward_aten(ctx, dy, x, weight, mean, var, bias, per_sample, batch_stats)
    if grads is not None:
        return grads
    n, c, groups = x.shape[0], x.shape[1], ctx.groups
    view = (n, groups, c // groups, math.prod(x.shape[2:]))
    stat_shape, stat_dims = ((n, groups, 1, 1), (2, 3)) if per_sample else ((1, 1, c, 1), (0, 3))
    acc = accumulator_dtype(x.dtype)
    x4, dy4 = x.reshape(view).to(acc), dy.reshape(view).to(acc)
    if batch_stats and torch.is_grad_enabled():
        # A recorded backward (double backward): the saved statistics carry no gradient, so take them
        # from x again, as functions of it.
        mean, var = x4.mean(stat_dims, keepdim=True), x4.var(stat_dims, unbiased=False, keepdim=True)
    rstd = torch.rsqrt(var.to(acc).reshape(stat_shape) + ctx.eps)
    xhat = (x4 - mean.to(acc).reshape(stat_shape)) * rstd
    if ctx.activation == "silu":
        # y = silu(z), z = xhat * weight + bias recomputed from x and the statistics (nothing more saved):
        # dy becomes dz = dy * silu'(z), silu'(z) = s * (1 + z * (1 - s)), s = sigmoid(z).
        param_shape = (1, groups, c // groups, 1)
        z = xhat if weight is None else xhat * weight.to(acc).reshape(param_shape)
        if bias is not None:
            z = z + bias.to(acc).reshape(param_shape)
        s = torch.sigmoid(z)
        dy4 = dy4 * (s * (1 + z * (1 - s)))
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    dx = dw = db = None
    if need_dx:
        g = dy4 if weight is None else dy4 * weight.to(acc).reshape(1, groups, c // groups, 1)
        if batch_stats:
            g = g - g.mean(stat_dims, keepdim=True) - xhat * (g * xhat).mean(stat_dims, keepdim=True)
        dx = (g * rstd).reshape(x.shape).to(x.dtype)
    if need_dw:
        dw = (dy4 * xhat).sum((0, 3)).reshape(c).to(weight.dtype)
    if need_db:
        db = dy4.sum((0, 3)).reshape(c).to(ctx.bias_dtype)
    return dx, dw, db


def _grads_asked(ctx, weight):
    """(need_dx, need_dweight, need_dbias) of an affine family op's backward."""
    need_dx, need_dw, need_db = ctx.needs_input_grad[:3]
    return need_dx, need_dw and weight is not None, need_db and ctx.bias_dtype is not None


def _as_inputs(ctx, x, weight, needs, dx, dw, db):
    """The gradients in the dtypes (and x's shape) of what they belong to, None where not asked for."""
    need_dx, need_dw, need_db = needs
    return (dx.reshape(x.shape).to(x.dtype) if need_dx else None, dw.to(weight.dtype) if need_dw else None,
            db.to(ctx.bias_dtype) if need_db else None)


def _affine_norm_backward_aten(ctx, dy, x, weight, mean, var, bias, per_sample, batch_stats):
    """(dx, dweight, dbias) from ATen's own GroupNorm / BatchNorm backward kernels, given the forward's
    statistics, in the accumulator dtype: CPU calls the fused kernels do not take (planes under
    _MIN_KERNEL_PLANE elements: BatchNorm1d). CUDA's take the torch-op backward until this has run on a GPU.
    x goes in centered (and the mean as 0): ATen sums dy * x and subtracts mean * sum(dy), which at x + 1000
    cancels to 5% errors in dweight. The SiLU epilogue's derivative is applied to dy first (z recomputed
    from x and the statistics)."""
    acc = accumulator_dtype(x.dtype)
    n, c, hw = x.shape[0], x.shape[1], math.prod(x.shape[2:])
    needs = _grads_asked(ctx, weight)
    # ATen sizes dweight / dbias after the weight: ones stand in for none
    w = torch.ones(c, dtype=acc, device=x.device) if weight is None else weight.to(acc)
    mean, rstd = mean.to(acc), torch.rsqrt(var.to(acc) + ctx.eps)
    per = c // ctx.groups

    def per_channel(t):  # statistics as (n or 1, c, 1), to broadcast over (n, c, hw)
        return t.repeat_interleave(per, dim=1)[..., None] if per_sample else t.reshape(1, c, 1)

    xc = x.reshape(n, c, hw).to(acc) - per_channel(mean)
    g = dy.reshape(n, c, hw).to(acc)
    if ctx.activation == "silu":  # dy becomes dz = dy * silu'(z), z = (x - mean) * rstd * w + b per channel
        z = xc * (per_channel(rstd) * w[:, None])
        if bias is not None:
            z = z + bias.to(acc)[:, None]
        sig = torch.sigmoid(z)
        g = g * (sig * (1 + z * (1 - sig)))
    # contiguous: ATen's kernels walk both as (n, c, hw) (an elementwise result keeps x's permuted strides)
    xc, g, zero, mask = xc.contiguous(), g.contiguous(), torch.zeros_like(mean), list(needs)
    if per_sample:
        dx, dw, db = torch.ops.aten.native_group_norm_backward(g, xc, zero, rstd, w, n, c, hw, ctx.groups, mask)
    elif batch_stats:
        dx, dw, db = torch.ops.aten.native_batch_norm_backward(g, xc, w, None, None, zero, rstd, True, ctx.eps, mask)
    else:  # given statistics: ATen takes them as the running ones
        dx, dw, db = torch.ops.aten.native_batch_norm_backward(g, xc, w, zero, var.to(acc), None, None, False,
                                                               ctx.eps, mask)
    return _as_inputs(ctx, x, weight, needs, dx, dw, db)


# Planes (the elements of one sample and channel) shorter than this take the torch-op backward: a warp a
# plane would idle most lanes (BatchNorm1d's planes are one element).
_MIN_KERNEL_PLANE = 32
# family_backward's modes (FamilyBackwardMode): per-sample sets, batch statistics, given statistics.
_BWD_MODES = {(True, True): 0, (False, True): 1, (False, False): 2}


def _affine_norm_backward_kernel(ctx, dy, x, weight, mean, var, bias, per_sample, batch_stats):
    """(dx, dweight, dbias) from the fused kernels (CUDA, or their C++ twins on the CPU), or None where they
    do not run: short planes, a backward that is itself recorded (double backward) or traced."""
    if x.device.type not in ("cuda", "cpu") or x.dim() < 2 or math.prod(x.shape[2:]) < _MIN_KERNEL_PLANE:
        return None
    if not direct_call_ok(dy, x, weight, mean, var, bias):
        return None
    ext = kernels(x.device.type)
    if not hasattr(ext, "family_backward"):  # a stand-in or an older build
        return None
    needs = _grads_asked(ctx, weight)
    dx, dw, db = ext.family_backward(dy, x, weight, bias, mean, var, ctx.groups, ctx.eps,
                                     activation_code(ctx.activation), _BWD_MODES[per_sample, batch_stats], *needs)
    return _as_inputs(ctx, x, weight, needs, dx, dw, db)


def _group_norm_backward(ctx, dy, dmean, dvar):
    return _affine_norm_backward(ctx, dy, per_sample=True, batch_stats=True) + (None,) * (ctx.n_inputs - 3)


def _batch_norm_backward(ctx, dy, dmean, dvar):
    return _affine_norm_backward(ctx, dy, per_sample=False, batch_stats=True) + (None,)


def _batch_norm_eval_backward(ctx, dy):
    return _affine_norm_backward(ctx, dy, per_sample=False, batch_stats=False) + (None, None, None)


class _FamilyCall:
    """What _affine_norm_backward reads of an autograd ctx, for a call that the extension's CppFamilyFunction
    recorded (kernels/module.cpp)."""

    def __init__(self, x, weight, bias, mean, var, groups, eps, activation, needs):
        self.groups, self.eps, self.activation = groups, eps, activation
        self.bias_dtype = None if bias is None else bias.dtype
        self.saved_tensors = (x, weight, mean, var, bias)
        self.needs_input_grad = needs


def family_backward_fallback(dy, x, weight, bias, mean, var, groups, eps, activation_code_, mode, needs):
    """(dx, dweight, dbias) of a CppFamilyFunction whose backward does not take the kernels straight (a double
    backward, a dispatch mode): the op's own backward, the torch-op formula where the kernels decline."""
    activation = next(name for name, code in ACTIVATIONS.items() if code == activation_code_)
    ctx = _FamilyCall(x, weight, bias, mean, var, groups, eps, activation, needs)
    per_sample, batch_stats = next(key for key, value in _BWD_MODES.items() if value == mode)
    return _affine_norm_backward(ctx, dy, per_sample, batch_stats)


def _setup_p_normalize(ctx, inputs, output):
    x, ctx.p, ctx.begin_dim, ctx.end_dim, ctx.eps, ctx.mean = inputs
    ctx.save_for_backward(x)


def _p_normalize_backward(ctx, dy):
    """y = x / d, d = max(norm, eps): dx = (dy - [norm >= eps] * dnorm/dx * sum(dy * y)) / d, with
    dnorm/dx = sign(x) / k (p=1) or y / k (p=2, where norm = d); k is the count with mean, else 1.
    The norm is recomputed from x (one more reduction; the op returns only y)."""
    (x,) = ctx.saved_tensors
    dims = tuple(range(ctx.begin_dim, ctx.end_dim))
    k = math.prod(x.shape[d] for d in dims) if ctx.mean else 1
    a, g = x.to(accumulator_dtype(x.dtype)), dy.to(accumulator_dtype(x.dtype))
    if ctx.p == 1:
        norm = a.abs().sum(dims, keepdim=True) / k
    else:
        norm = (a * a).sum(dims, keepdim=True).div(k).sqrt()
    d = norm.clamp_min(ctx.eps)
    y = a / d
    slope = a.sign() if ctx.p == 1 else y
    inner = (g * y).sum(dims, keepdim=True) / k
    dx = (g - torch.where(norm >= ctx.eps, slope * inner, 0)) / d
    return dx.to(x.dtype), None, None, None, None, None


register_autograd(_lib, "fastnorm::group_norm", _group_norm_backward, _setup_group_norm)
register_autograd(_lib, "fastnorm::batch_norm", _batch_norm_backward, _setup_batch_norm)
register_autograd(_lib, "fastnorm::batch_norm_eval", _batch_norm_eval_backward, _setup_batch_norm_eval)
register_autograd(_lib, "fastnorm::p_normalize", _p_normalize_backward, _setup_p_normalize)
