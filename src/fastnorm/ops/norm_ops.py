"""The custom ops torch.ops.fastnorm.layer_norm / rms_norm / norm_backward: kernels, fake (meta)
functions, autograd.

Registered through torch.library so torch.compile sees opaque ops (no graph break), the backward
included. Autograd saves x and the parameters only: the backward kernels recompute each row's
statistics during their own first read of x, which costs no extra pass over memory.
"""
import torch

from fastnorm.ops import extension
from fastnorm.ops.direct import direct_call_ok
from fastnorm.ops.library_compat import register_autograd, register_fake

_lib = torch.library.Library("fastnorm", "DEF")
_lib.define("layer_norm(Tensor x, int begin_dim, int end_dim, Tensor? weight, Tensor? bias, float eps) -> Tensor")
_lib.define("rms_norm(Tensor x, int begin_dim, int end_dim, Tensor? weight, float eps) -> Tensor")
# Gradients (dx, dweight, dbias) of either norm; an output not asked for (need_*) is an empty tensor.
# dx_add (optional, like x) is added to dx: the fused residual ops' h also gets its own later gradient.
_lib.define("norm_backward(Tensor dy, Tensor x, int begin_dim, int end_dim, Tensor? weight, Tensor? bias, "
            "float eps, bool rms, bool need_dx, bool need_dweight, bool need_dbias, Tensor? dx_add=None) "
            "-> (Tensor, Tensor, Tensor)")


def layer_norm_kernel(x, begin_dim, end_dim, weight, bias, eps):
    """The kernel call behind the op (and behind fastnorm.layer_norm when no dispatch is needed)."""
    return extension.load(x.device.type).norm_forward(x, weight, bias, begin_dim, end_dim, eps, False, 0, 0)


def rms_norm_kernel(x, begin_dim, end_dim, weight, eps):
    """The kernel call behind the op (and behind fastnorm.rms_norm when no dispatch is needed)."""
    return extension.load(x.device.type).norm_forward(x, weight, None, begin_dim, end_dim, eps, True, 0, 0)


def norm_backward_kernel(dy, x, begin_dim, end_dim, weight, bias, eps, rms, need_dx, need_dweight, need_dbias,
                         dx_add=None):
    """The backward kernels: dweight / dbias come back in the dtype and shape of weight / bias."""
    dx, dw, db = extension.load(x.device.type).norm_backward(
        dy, x, weight, bias, begin_dim, end_dim, eps, rms, need_dx, need_dweight, need_dbias, dx_add)
    if need_dweight:
        dw = dw.reshape(weight.shape).to(weight.dtype)
    if need_dbias:
        db = db.reshape(bias.shape).to(bias.dtype)
    return dx, dw, db


def norm_backward(dy, x, begin_dim, end_dim, weight, bias, eps, rms, need_dx, need_dweight, need_dbias, dx_add=None):
    """The backward from an autograd function: straight to the kernels when nothing traces or records it
    (host time is most of a small call), else through the op, which torch.compile sees."""
    args = (dy, x, begin_dim, end_dim, weight, bias, eps, rms, need_dx, need_dweight, need_dbias, dx_add)
    if direct_call_ok(dy, x, weight, bias, dx_add):
        return norm_backward_kernel(*args)
    return torch.ops.fastnorm.norm_backward(*args)


for _key in ("CPU", "CUDA"):
    _lib.impl("layer_norm", layer_norm_kernel, _key)
    _lib.impl("rms_norm", rms_norm_kernel, _key)
    _lib.impl("norm_backward", norm_backward_kernel, _key)


@register_fake("fastnorm::layer_norm")
def _layer_norm_fake(x, begin_dim, end_dim, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@register_fake("fastnorm::rms_norm")
def _rms_norm_fake(x, begin_dim, end_dim, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@register_fake("fastnorm::norm_backward")
def _norm_backward_fake(dy, x, begin_dim, end_dim, weight, bias, eps, rms, need_dx, need_dweight, need_dbias,
                        dx_add=None):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else x.new_empty(0)
    dw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dweight else x.new_empty(0)
    db = torch.empty_like(bias, memory_format=torch.contiguous_format) if need_dbias else x.new_empty(0)
    return dx, dw, db


def _setup_context(ctx, inputs, output):
    x, begin_dim, end_dim, weight = inputs[:4]
    bias = inputs[4] if len(inputs) == 6 else None
    ctx.begin_dim, ctx.end_dim, ctx.eps = begin_dim, end_dim, inputs[-1]
    ctx.save_for_backward(x, weight, bias)


def _backward(ctx, grad, rms):
    x, weight, bias = ctx.saved_tensors
    need_dx, need_dw = ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[3]
    need_db = bias is not None and ctx.needs_input_grad[4]
    dx, dw, db = norm_backward(grad, x, ctx.begin_dim, ctx.end_dim, weight, bias, ctx.eps, rms, need_dx, need_dw,
                               need_db)
    return (dx if need_dx else None), (dw if need_dw else None), (db if need_db else None)


def _layer_norm_backward(ctx, grad):
    dx, dw, db = _backward(ctx, grad, rms=False)
    return dx, None, None, dw, db, None


def _rms_norm_backward(ctx, grad):
    dx, dw, _ = _backward(ctx, grad, rms=True)
    return dx, None, None, dw, None


register_autograd(_lib, "fastnorm::layer_norm", _layer_norm_backward, _setup_context)
register_autograd(_lib, "fastnorm::rms_norm", _rms_norm_backward, _setup_context)
