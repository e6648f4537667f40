"""The custom ops torch.ops.fastnorm.layer_norm / rms_norm: kernels, fake (meta) functions, autograd.

Registered through torch.library so torch.compile sees one opaque op (no graph break). Backward is
analytic, written with PyTorch ops in float32 (float64 for double), until backward kernels land.
"""
import torch

from fastnorm.ops import extension

_lib = torch.library.Library("fastnorm", "DEF")
_lib.define("layer_norm(Tensor x, int begin_dim, int end_dim, Tensor? weight, Tensor? bias, float eps) -> Tensor")
_lib.define("rms_norm(Tensor x, int begin_dim, int end_dim, Tensor? weight, float eps) -> Tensor")


def layer_norm_kernel(x, begin_dim, end_dim, weight, bias, eps):
    """The kernel call behind the op (and behind fastnorm.layer_norm when no dispatch is needed)."""
    return extension.load(x.device.type).norm_forward(x, weight, bias, begin_dim, end_dim, eps, False, 0, 0)


def rms_norm_kernel(x, begin_dim, end_dim, weight, eps):
    """The kernel call behind the op (and behind fastnorm.rms_norm when no dispatch is needed)."""
    return extension.load(x.device.type).norm_forward(x, weight, None, begin_dim, end_dim, eps, True, 0, 0)


for _key in ("CPU", "CUDA"):
    _lib.impl("layer_norm", layer_norm_kernel, _key)
    _lib.impl("rms_norm", rms_norm_kernel, _key)


@torch.library.register_fake("fastnorm::layer_norm")
def _layer_norm_fake(x, begin_dim, end_dim, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("fastnorm::rms_norm")
def _rms_norm_fake(x, begin_dim, end_dim, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _stats_view(x, begin_dim, end_dim):
    """x in its accumulation dtype, the reduced dims, and the shape that broadcasts a weight."""
    acc = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    dims = tuple(range(begin_dim, end_dim))
    wshape = tuple(x.shape[begin_dim:end_dim]) + (1,) * (x.dim() - end_dim)
    return acc, dims, wshape


def _backward_common(ctx, grad, rms):
    x, weight = ctx.saved_tensors[0], ctx.saved_tensors[1]
    acc, dims, wshape = _stats_view(x, ctx.begin_dim, ctx.end_dim)
    g = grad.to(acc.dtype)
    if rms:
        rstd = torch.rsqrt(acc.pow(2).mean(dims, keepdim=True) + ctx.eps)
        xhat = acc * rstd
    else:
        mean = acc.mean(dims, keepdim=True)
        centered = acc - mean
        rstd = torch.rsqrt(centered.pow(2).mean(dims, keepdim=True) + ctx.eps)
        xhat = centered * rstd
    gy = g * weight.to(acc.dtype).reshape(wshape) if weight is not None else g
    dx = None
    if ctx.needs_input_grad[0]:
        proj = (gy * xhat).mean(dims, keepdim=True)
        inner = gy - xhat * proj if rms else gy - gy.mean(dims, keepdim=True) - xhat * proj
        dx = (rstd * inner).to(x.dtype)
    other = tuple(d for d in range(x.dim()) if d not in dims)
    dw = db = None
    if weight is not None and ctx.needs_input_grad[3]:
        dw = (g * xhat).sum(other).reshape(weight.shape).to(weight.dtype)
    if not rms and ctx.has_bias and ctx.needs_input_grad[4]:
        db = g.sum(other).reshape(ctx.bias_shape).to(ctx.bias_dtype)
    return dx, dw, db


def _setup_context(ctx, inputs, output):
    x, begin_dim, end_dim, weight = inputs[:4]
    ctx.begin_dim, ctx.end_dim, ctx.eps = begin_dim, end_dim, inputs[-1]
    bias = inputs[4] if len(inputs) == 6 else None
    ctx.has_bias = bias is not None
    if bias is not None:
        ctx.bias_shape, ctx.bias_dtype = bias.shape, bias.dtype
    ctx.save_for_backward(x, weight)


def _layer_norm_backward(ctx, grad):
    dx, dw, db = _backward_common(ctx, grad, rms=False)
    return dx, None, None, dw, db, None


def _rms_norm_backward(ctx, grad):
    dx, dw, _ = _backward_common(ctx, grad, rms=True)
    return dx, None, None, dw, None


torch.library.register_autograd("fastnorm::layer_norm", _layer_norm_backward, setup_context=_setup_context)
torch.library.register_autograd("fastnorm::rms_norm", _rms_norm_backward, setup_context=_setup_context)
