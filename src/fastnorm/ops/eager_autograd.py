"""Autograd of a plain eager CPU call without the custom op's dispatch.

torch.ops.fastnorm.layer_norm / rms_norm record their backward through torch.library's Python
autograd wrapper: the dispatcher calls into Python twice (the Autograd kernel, then the CPU kernel
through redispatch) and fills the schema's defaults, about 70 us of a forward + backward on a 2-core
CPU, where eager's F.layer_norm spends 30: more than the kernels of a small shape. A plain call (plain
tensors, no compile, trace, dispatch mode or functorch transform, on the CPU) instead records this
autograd.Function around the same kernels, with the op's backward: the same bits, less host time.
"""
import torch

from fastnorm.ops import extension, norm_ops
from fastnorm.ops.direct import _dispatch_modes, _is_wrapped  # with their fallbacks for older torch

_is_compiling = torch.compiler.is_compiling
_tracing = torch._C._get_tracing_state
_Tensor = torch.Tensor


def function_call_ok(x, *params) -> bool:
    """True when a call that records autograd may take NormFunction in place of the op."""
    if _is_compiling() or _tracing() or _dispatch_modes() or type(x) is not _Tensor or x.device.type != "cpu":
        return False
    if _is_wrapped(x):
        return False
    return all(t is None or (type(t) is _Tensor and not _is_wrapped(t)) for t in params)


class NormFunction(torch.autograd.Function):
    """y = norm(x) [* weight + bias] over dims [begin, end): saves x and the parameters, as the op does."""

    @staticmethod
    def forward(ctx, x, weight, bias, begin, end, eps, rms):
        ctx.dims, ctx.eps, ctx.rms = (begin, end), eps, rms
        ctx.save_for_backward(x, weight, bias)
        return extension.load("cpu").norm_forward(x, weight, bias, begin, end, eps, rms, 0, 0)

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias = ctx.saved_tensors
        need = ctx.needs_input_grad
        need_dw, need_db = weight is not None and need[1], bias is not None and need[2]
        dx, dw, db = norm_ops.norm_backward(grad, x, *ctx.dims, weight, bias, ctx.eps, ctx.rms, need[0], need_dw,
                                            need_db)
        return (dx if need[0] else None), (dw if need_dw else None), (db if need_db else None), None, None, None, None
