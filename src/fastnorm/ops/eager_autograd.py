"""Autograd of a plain eager call without the custom op's dispatch.

torch.ops.fastnorm.layer_norm / rms_norm record their backward through torch.library's Python
autograd wrapper: the dispatcher calls into Python twice (the Autograd kernel, then the CPU kernel
through redispatch) and fills the schema's defaults, about 70 us of a forward + backward on a 2-core
CPU, where eager's F.layer_norm spends 30: more than the kernels of a small shape. A plain call (plain
tensors, no compile, trace, dispatch mode or functorch transform, on the CPU or CUDA) instead records the
extension's CppNormFunction (kernels/module.cpp), a C++ torch::autograd::Function around the same
kernels with the op's backward: the same bits, less host time (on CUDA it saves the rows' statistics
as the *_train ops do). The extension's try_layer_norm /
try_rms_norm record it without any Python for the calls they take; the others come here after
functional.py's checks. NormFunction below is the same autograd in Python: the statement of what the
C++ one does, which the tests compare it against (on the CPU, where neither saves statistics).
"""
import torch

from fastnorm.ops import extension, norm_ops
from fastnorm.ops.direct import _dispatch_modes, _is_wrapped  # with their fallbacks for older torch

_is_compiling = torch.compiler.is_compiling
_tracing = torch._C._get_tracing_state
_functorch_active = getattr(torch._C, "_are_functorch_transforms_active", lambda: False)
_Tensor = torch.Tensor
_DEVICES = ("cpu", "cuda")  # those with an extension build


def function_call_ok(x, *params) -> bool:
    """True when a call that records autograd may take CppNormFunction (norm_autograd) in place of the op.
    Not inside a functorch transform: a C++ autograd Function refuses them, the op takes them."""
    if _is_compiling() or _tracing() or _dispatch_modes() or type(x) is not _Tensor or x.device.type not in _DEVICES:
        return False
    if _is_wrapped(x) or _functorch_active():
        return False
    return all(t is None or (type(t) is _Tensor and not _is_wrapped(t)) for t in params)


def norm_autograd(x, weight, bias, begin, end, eps, rms):
    """norm(x) [* weight + bias] over dims [begin, end), recording CppNormFunction: for a call that
    function_call_ok accepts, after functional.py's checks (float eps, bool rms)."""
    return extension.load(x.device.type).norm_forward_autograd(x, weight, bias, begin, end, eps, rms)


class NormFunction(torch.autograd.Function):
    """y = norm(x) [* weight + bias] over dims [begin, end): saves x and the parameters, as the op does.
    CppNormFunction's reference in Python (the tests compare them bit for bit)."""

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
