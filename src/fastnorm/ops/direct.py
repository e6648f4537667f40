"""When a call may skip the custom op's dispatch and run the kernel directly."""
import torch

_is_wrapped = getattr(torch._C._functorch, "is_functorch_wrapped_tensor", lambda t: False)
_dispatch_modes = getattr(torch._C, "_len_torch_dispatch_stack", None)
if _dispatch_modes is None:  # older torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    def _dispatch_modes():
        return _get_current_dispatch_mode() is not None


# nn.Parameter overrides nothing (its __torch_function__ is the disabled one), so a module's weight and
# bias are as plain as tensors here: without it every family module call went through the dispatcher.
_PLAIN = (torch.Tensor, torch.nn.Parameter)


def direct_call_ok(*tensors) -> bool:
    """True when the custom op's dispatch would add nothing: no autograd to record, no tracing or
    dispatch mode, plain tensors. Then the kernel is called directly, saving microseconds of host
    time per call (what decides small shapes)."""
    if torch.compiler.is_compiling() or _dispatch_modes():  # this order: dynamo must not trace the second
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:
        if t is None:
            continue
        if type(t) not in _PLAIN or (grad and t.requires_grad) or _is_wrapped(t):
            return False
    return True
