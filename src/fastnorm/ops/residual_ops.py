"""The fused residual-add ops torch.ops.fastnorm.add_layer_norm / add_rms_norm: (y, h) with
h = x + residual and y = norm(h), as pre-norm transformer blocks call their norms.

h is kept in x's dtype, or in float32 with residual_in_fp32. The gradient of h (from y through the
norm, plus h's own later uses) flows back to both x and residual; the backward kernels add h's own
gradient to the norm's in the same pass (norm_backward's dx_add).
"""
import torch

from fastnorm.ops import extension, norm_ops  # norm_ops defines the fastnorm library and norm_backward
from fastnorm.ops.library_compat import register_autograd, register_fake

_lib = norm_ops._lib
_lib.define("add_layer_norm(Tensor x, Tensor residual, int begin_dim, int end_dim, Tensor? weight, Tensor? bias, "
            "float eps, bool residual_in_fp32) -> (Tensor, Tensor)")
_lib.define("add_rms_norm(Tensor x, Tensor residual, int begin_dim, int end_dim, Tensor? weight, float eps, "
            "bool residual_in_fp32) -> (Tensor, Tensor)")


def h_dtype(x, residual_in_fp32):
    return torch.float32 if residual_in_fp32 and x.dtype != torch.float64 else x.dtype


def add_layer_norm_kernel(x, residual, begin_dim, end_dim, weight, bias, eps, residual_in_fp32):
    y, h = extension.load(x.device.type).add_norm_forward(x, residual, weight, bias, begin_dim, end_dim, eps,
                                                          False, residual_in_fp32)
    return y, h


def add_rms_norm_kernel(x, residual, begin_dim, end_dim, weight, eps, residual_in_fp32):
    y, h = extension.load(x.device.type).add_norm_forward(x, residual, weight, None, begin_dim, end_dim, eps,
                                                          True, residual_in_fp32)
    return y, h


for _key in ("CPU", "CUDA"):
    _lib.impl("add_layer_norm", add_layer_norm_kernel, _key)
    _lib.impl("add_rms_norm", add_rms_norm_kernel, _key)


def _fake(x, residual_in_fp32):
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    return y, torch.empty_like(x, dtype=h_dtype(x, residual_in_fp32), memory_format=torch.contiguous_format)


@register_fake("fastnorm::add_layer_norm")
def _add_layer_norm_fake(x, residual, begin_dim, end_dim, weight, bias, eps, residual_in_fp32):
    return _fake(x, residual_in_fp32)


@register_fake("fastnorm::add_rms_norm")
def _add_rms_norm_fake(x, residual, begin_dim, end_dim, weight, eps, residual_in_fp32):
    return _fake(x, residual_in_fp32)


def _setup_context(ctx, inputs, output):
    x, residual, begin_dim, end_dim, weight = inputs[:5]
    bias = inputs[5] if len(inputs) == 8 else None
    ctx.begin_dim, ctx.end_dim, ctx.eps = begin_dim, end_dim, inputs[-2]
    ctx.x_dtype, ctx.residual_dtype = x.dtype, residual.dtype
    ctx.save_for_backward(output[1], weight, bias)  # h: the norm's input


def _backward(ctx, dy, dh, rms):
    h, weight, bias = ctx.saved_tensors
    need_dh = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
    need_dw, need_db = weight is not None and ctx.needs_input_grad[4], bias is not None and ctx.needs_input_grad[5]
    if dy is None:
        dy = torch.zeros_like(h)
    dy = dy.to(h.dtype)
    dh_total, dw, db = norm_ops.norm_backward(dy, h, ctx.begin_dim, ctx.end_dim, weight, bias, ctx.eps, rms,
                                              need_dh, need_dw, need_db, dh)
    dx = dh_total.to(ctx.x_dtype) if ctx.needs_input_grad[0] else None
    dr = dh_total.to(ctx.residual_dtype) if ctx.needs_input_grad[1] else None
    return dx, dr, (dw if need_dw else None), (db if need_db else None)


def _add_layer_norm_backward(ctx, dy, dh):
    dx, dr, dw, db = _backward(ctx, dy, dh, rms=False)
    return dx, dr, None, None, dw, db, None, None


def _add_rms_norm_backward(ctx, dy, dh):
    dx, dr, dw, _ = _backward(ctx, dy, dh, rms=True)
    return dx, dr, None, None, dw, None, None


register_autograd(_lib, "fastnorm::add_layer_norm", _add_layer_norm_backward, _setup_context)
register_autograd(_lib, "fastnorm::add_rms_norm", _add_rms_norm_backward, _setup_context)
