"""torch.library's fake-tensor and autograd registration, on every PyTorch fastnorm supports.

torch >= 2.4 has torch.library.register_fake and register_autograd. torch 2.3 has the fake registration
under its older name (impl_abstract) and no register_autograd: there the op gets an Autograd kernel, an
autograd.Function that runs the op below autograd and calls the same setup_context and backward.
"""
import torch

_register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract


def register_fake(qualname: str):
    """Decorator: the op's fake (meta) implementation, which torch.compile and FakeTensor use."""
    return _register_fake(qualname)


def register_autograd(lib: torch.library.Library, qualname: str, backward, setup_context) -> None:
    """backward(ctx, *grads) -> one gradient (or None) per input; setup_context(ctx, inputs, output)."""
    if hasattr(torch.library, "register_autograd"):
        torch.library.register_autograd(qualname, backward, setup_context=setup_context)
        return
    namespace, name = qualname.split("::")
    op = getattr(getattr(torch.ops, namespace), name).default

    class _Function(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            with torch._C._AutoDispatchBelowAutograd():
                output = op(*inputs)
            setup_context(ctx, inputs, output)
            return output

        @staticmethod
        def backward(ctx, *grads):
            return backward(ctx, *grads)

    lib.impl(name, lambda *inputs: _Function.apply(*inputs), "Autograd")
