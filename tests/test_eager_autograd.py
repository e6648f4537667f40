"""fastnorm.layer_norm / rms_norm record eager_autograd.NormFunction for a plain CPU call that needs
gradients, and the custom op otherwise: both give the same bits."""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fastnorm


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _grads(fn, x, w, b, dy, need):
    leaves = [t.detach().clone().requires_grad_(r) for t, r in zip((x, w, b), need) if t is not None]
    it = iter(leaves)
    xs, ws = next(it), next(it) if w is not None else None
    bs = next(it) if b is not None else None
    y = fn(xs, ws, bs)
    y.backward(dy)
    return y, [t.grad for t in (xs, ws, bs) if t is not None], y.grad_fn


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("need", [(True, True, True), (True, False, False), (False, True, True)], ids=str)
def test_function_matches_the_op(rms, need, dtype):
    x = (torch.rand(7, 2053, dtype=torch.float64) * 3 + 1000).to(dtype)
    dy = torch.randn(7, 2053, dtype=torch.float64).to(dtype)
    w = torch.randn(2053, dtype=dtype)
    b = None if rms else torch.randn(2053, dtype=dtype)
    if rms:
        public = lambda x_, w_, b_: fastnorm.rms_norm(x_, (2053,), w_, 1e-6)
        op = lambda x_, w_, b_: torch.ops.fastnorm.rms_norm(x_, 1, 2, w_, 1e-6)
    else:
        public = lambda x_, w_, b_: fastnorm.layer_norm(x_, (2053,), w_, b_, 1e-5)
        op = lambda x_, w_, b_: torch.ops.fastnorm.layer_norm(x_, 1, 2, w_, b_, 1e-5)
    y1, g1, fn1 = _grads(public, x, w, b, dy, need)
    y2, g2, fn2 = _grads(op, x, w, b, dy, need)
    assert "NormFunction" in type(fn1).__name__ and "NormFunction" not in type(fn2).__name__
    assert torch.equal(y1, y2)
    for a, c in zip(g1, g2):
        assert (a is None) == (c is None) and (a is None or torch.equal(a, c))


def test_dispatch_mode_keeps_the_op():
    x = torch.randn(4, 33, requires_grad=True)
    w = torch.randn(33, requires_grad=True)
    with _Passthrough():
        y = fastnorm.layer_norm(x, (33,), w)
    assert "NormFunction" not in type(y.grad_fn).__name__
    y.sum().backward()
    assert x.grad is not None and w.grad is not None


def test_non_contiguous_grad_and_channel_axis():
    x = torch.randn(3, 8, 5, 6, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    y = fastnorm.layer_norm(x, dim=1, weight=w)
    assert "NormFunction" in type(y.grad_fn).__name__
    dy = torch.randn(3, 6, 5, 8).permute(0, 3, 2, 1)  # not contiguous
    y.backward(dy)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.ops.fastnorm.layer_norm(x2, 1, 2, w2, None, 1e-5).backward(dy)
    assert torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)
