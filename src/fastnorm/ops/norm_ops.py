"""The custom ops torch.ops.fastnorm.layer_norm / rms_norm / norm_backward: kernels, fake (meta)
functions, autograd.

Registered through torch.library so torch.compile sees opaque ops (no graph break), the backward
included. layer_norm / rms_norm save x and the parameters only: the backward kernels recompute each
row's statistics during their own first read of x, which costs no extra pass over memory.
layer_norm_train / rms_norm_train, which fastnorm.layer_norm / rms_norm take for CUDA calls that record
autograd, also return the rows' statistics (their affine maps, 12 bytes a row) where the row kernel
takes the call: the backward then sums only g and g * xhat instead of recomputing mean and variance
(H100, bf16 16384x4096 LayerNorm backward: see benchmarks/NOTES.md, "saved stats").
"""
import torch

from fastnorm.ops import extension
from fastnorm.ops.direct import direct_call_ok
from fastnorm.ops.library_compat import register_autograd, register_fake

_lib = torch.library.Library("fastnorm", "DEF")
_lib.define("layer_norm(Tensor x, int begin_dim, int end_dim, Tensor? weight, Tensor? bias, float eps) -> Tensor")
_lib.define("rms_norm(Tensor x, int begin_dim, int end_dim, Tensor? weight, float eps) -> Tensor")
# (y, stats): stats is (outer, 3) float32 (float64 for float64 x) for CUDA last-dim calls, else (0,); its
# contents are for norm_backward only (unwritten where the kernel taking the call saves nothing).
_lib.define("layer_norm_train(Tensor x, int begin_dim, int end_dim, Tensor? weight, Tensor? bias, float eps) "
            "-> (Tensor, Tensor)")
_lib.define("rms_norm_train(Tensor x, int begin_dim, int end_dim, Tensor? weight, float eps) -> (Tensor, Tensor)")
# Gradients (dx, dweight, dbias) of either norm; an output not asked for (need_*) is an empty tensor.
# dx_add (optional, like x) is added to dx: the fused residual ops' h also gets its own later gradient.
# stats: the *_train forward's, or None (recomputed).
_lib.define("norm_backward(Tensor dy, Tensor x, int begin_dim, int end_dim, Tensor? weight, Tensor? bias, "
            "float eps, bool rms, bool need_dx, bool need_dweight, bool need_dbias, Tensor? dx_add=None, "
            "Tensor? stats=None) -> (Tensor, Tensor, Tensor)")


def layer_norm_kernel(x, begin_dim, end_dim, weight, bias, eps):
    """The kernel call behind the op (and behind fastnorm.layer_norm when no dispatch is needed)."""
    return extension.load(x.device.type).norm_forward(x, weight, bias, begin_dim, end_dim, eps, False, 0, 0)


def rms_norm_kernel(x, begin_dim, end_dim, weight, eps):
    """The kernel call behind the op (and behind fastnorm.rms_norm when no dispatch is needed)."""
    return extension.load(x.device.type).norm_forward(x, weight, None, begin_dim, end_dim, eps, True, 0, 0)


def layer_norm_train_kernel(x, begin_dim, end_dim, weight, bias, eps):
    y, stats = extension.load(x.device.type).norm_forward_train(x, weight, bias, begin_dim, end_dim, eps, False)
    return y, stats


def rms_norm_train_kernel(x, begin_dim, end_dim, weight, eps):
    y, stats = extension.load(x.device.type).norm_forward_train(x, weight, None, begin_dim, end_dim, eps, True)
    return y, stats


def norm_backward_kernel(dy, x, begin_dim, end_dim, weight, bias, eps, rms, need_dx, need_dweight, need_dbias,
                         dx_add=None, stats=None):
    """The backward kernels: dweight / dbias come back in the dtype and shape of weight / bias."""
    dx, dw, db = extension.load(x.device.type).norm_backward(
        dy, x, weight, bias, begin_dim, end_dim, eps, rms, need_dx, need_dweight, need_dbias, dx_add, stats)
    if need_dweight:
        dw = dw.reshape(weight.shape).to(weight.dtype)
    if need_dbias:
        db = db.reshape(bias.shape).to(bias.dtype)
    return dx, dw, db


def norm_backward(dy, x, begin_dim, end_dim, weight, bias, eps, rms, need_dx, need_dweight, need_dbias, dx_add=None,
                  stats=None):
    """The backward from an autograd function: straight to the kernels when nothing traces or records it
    (host time is most of a small call), else through the op, which torch.compile sees."""
    args = (dy, x, begin_dim, end_dim, weight, bias, eps, rms, need_dx, need_dweight, need_dbias, dx_add, stats)
    if direct_call_ok(dy, x, weight, bias, dx_add):
        return norm_backward_kernel(*args)
    return torch.ops.fastnorm.norm_backward(*args)


for _key in ("CPU", "CUDA"):
    _lib.impl("layer_norm", layer_norm_kernel, _key)
    _lib.impl("rms_norm", rms_norm_kernel, _key)
    _lib.impl("layer_norm_train", layer_norm_train_kernel, _key)
    _lib.impl("rms_norm_train", rms_norm_train_kernel, _key)
    _lib.impl("norm_backward", norm_backward_kernel, _key)


def _stats_fake(x, begin_dim, end_dim):
    """The *_train ops' stats: (outer, 3) in the accumulator type for CUDA last-dim calls, else (0,)."""
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    shape = x.shape
    inner = 1
    for size in shape[end_dim:]:
        inner = inner * size
    if x.device.type != "cuda" or inner != 1:
        return x.new_empty((0,), dtype=dtype)
    outer = 1
    for size in shape[:begin_dim]:
        outer = outer * size
    return x.new_empty((outer, 3), dtype=dtype)


@register_fake("fastnorm::layer_norm")
def _layer_norm_fake(x, begin_dim, end_dim, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@register_fake("fastnorm::rms_norm")
def _rms_norm_fake(x, begin_dim, end_dim, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@register_fake("fastnorm::layer_norm_train")
def _layer_norm_train_fake(x, begin_dim, end_dim, weight, bias, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format), _stats_fake(x, begin_dim, end_dim)


@register_fake("fastnorm::rms_norm_train")
def _rms_norm_train_fake(x, begin_dim, end_dim, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format), _stats_fake(x, begin_dim, end_dim)


@register_fake("fastnorm::norm_backward")
def _norm_backward_fake(dy, x, begin_dim, end_dim, weight, bias, eps, rms, need_dx, need_dweight, need_dbias,
                        dx_add=None, stats=None):
    dx = torch.empty_like(x, memory_format=torch.contiguous_format) if need_dx else x.new_empty(0)
    dw = torch.empty_like(weight, memory_format=torch.contiguous_format) if need_dweight else x.new_empty(0)
    db = torch.empty_like(bias, memory_format=torch.contiguous_format) if need_dbias else x.new_empty(0)
    return dx, dw, db


def _setup_context(ctx, inputs, output):
    x, begin_dim, end_dim, weight = inputs[:4]
    bias = inputs[4] if len(inputs) == 6 else None
    ctx.begin_dim, ctx.end_dim, ctx.eps = begin_dim, end_dim, inputs[-1]
    stats = None
    if isinstance(output, tuple):  # the *_train ops: (y, stats)
        stats = output[1]
        ctx.mark_non_differentiable(stats)
        ctx.set_materialize_grads(False)
    ctx.save_for_backward(x, weight, bias, stats)


def _backward(ctx, grad, rms):
    if grad is None:  # the *_train ops do not materialize gradients: none reached y
        return None, None, None
    x, weight, bias, stats = ctx.saved_tensors
    need_dx, need_dw = ctx.needs_input_grad[0], weight is not None and ctx.needs_input_grad[3]
    need_db = bias is not None and ctx.needs_input_grad[4]
    dx, dw, db = norm_backward(grad, x, ctx.begin_dim, ctx.end_dim, weight, bias, ctx.eps, rms, need_dx, need_dw,
                               need_db, None, stats)
    return (dx if need_dx else None), (dw if need_dw else None), (db if need_db else None)


def _layer_norm_backward(ctx, grad, _grad_stats=None):
    dx, dw, db = _backward(ctx, grad, rms=False)
    return dx, None, None, dw, db, None


def _rms_norm_backward(ctx, grad, _grad_stats=None):
    dx, dw, _ = _backward(ctx, grad, rms=True)
    return dx, None, None, dw, None


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the kernels' statistics and sums: float64 for float64 input, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def reference_forward(x, begin_dim, end_dim, weight, bias, eps, rms):
    """The norm written with differentiable torch ops (weight and bias shaped like x's dims [begin, end))."""
    dims = tuple(range(begin_dim, end_dim))
    shape = tuple(x.shape[begin_dim:end_dim]) + (1,) * (x.dim() - end_dim)
    if rms:
        y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    else:
        y = (x - x.mean(dims, keepdim=True)) * torch.rsqrt(x.var(dims, unbiased=False, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.reshape(shape)
    return y if bias is None else y + bias.reshape(shape)


def _setup_norm_backward(ctx, inputs, output):
    dy, x, ctx.begin_dim, ctx.end_dim, weight, bias, ctx.eps, ctx.rms, *needs, dx_add, stats = inputs
    ctx.needs, ctx.has_dx_add = needs, dx_add is not None
    ctx.save_for_backward(dy, x, weight, bias)


def _norm_backward_backward(ctx, gdx, gdw, gdb):
    """Double backward: norm_backward's own gradients, by differentiating the first backward of the norm
    written in torch ops (in the accumulator dtype) against the incoming gradients. Without it the
    kernels' backward would be a constant to autograd: create_graph=True would give silently wrong
    second derivatives (gradient penalties, Hessian-vector products)."""
    dy, x, weight, bias = ctx.saved_tensors
    acc = accumulator_dtype(x.dtype)
    with torch.enable_grad():
        leaves = [None if t is None else t.detach().requires_grad_() for t in (dy, x, weight, bias)]
        ldy, lx, lw, lb = leaves
        wide = [None if t is None else t.to(acc) for t in (lx, lw, lb)]
        y = reference_forward(wide[0], ctx.begin_dim, ctx.end_dim, wide[1], wide[2], ctx.eps, ctx.rms)
        outs, grads = [], []
        for need, leaf, g in zip(ctx.needs, (lx, lw, lb), (gdx, gdw, gdb)):
            if need and leaf is not None and g is not None:
                outs.append(leaf)
                grads.append(g)
        if not outs:
            return (None,) * 13
        firsts = torch.autograd.grad(y, outs, ldy.to(acc), create_graph=True)
        wrt = [t for t in leaves if t is not None]
        seconds = iter(torch.autograd.grad(firsts, wrt, [g.to(acc) for g in grads], allow_unused=True))
    ddy, dx, dw, db = [None if t is None else next(seconds) for t in leaves]
    cast = [None if d is None else d.to(t.dtype) for d, t in zip((ddy, dx, dw, db), (dy, x, weight, bias))]
    return (cast[0], cast[1], None, None, cast[2], cast[3], None, None, None, None, None,
            gdx if ctx.has_dx_add else None, None)


register_autograd(_lib, "fastnorm::norm_backward", _norm_backward_backward, _setup_norm_backward)
register_autograd(_lib, "fastnorm::layer_norm", _layer_norm_backward, _setup_context)
register_autograd(_lib, "fastnorm::rms_norm", _rms_norm_backward, _setup_context)
register_autograd(_lib, "fastnorm::layer_norm_train", _layer_norm_backward, _setup_context)
register_autograd(_lib, "fastnorm::rms_norm_train", _rms_norm_backward, _setup_context)
