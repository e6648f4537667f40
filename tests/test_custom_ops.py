"""torch.ops.fastnorm.* as custom ops: opcheck, torch.compile without graph breaks, autograd."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fastnorm
from conftest import rms_norm_definition

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _layer_norm_samples():
    g = dict(requires_grad=True)
    yield (torch.randn(3, 7), 1, 2, torch.randn(7), torch.randn(7), 1e-5)
    yield (torch.randn(2, 3, 5, **g), 1, 3, torch.randn(3, 5, **g), torch.randn(3, 5, **g), 1e-5)
    yield (torch.randn(2, 6, 4, 3, **g), 1, 2, torch.randn(6, **g), None, 1e-3)  # channel axis
    yield (torch.randn(4, 9, dtype=torch.float64, **g), 1, 2, None, torch.randn(9, dtype=torch.float64, **g), 1e-5)
    yield (torch.randn(5, 16).bfloat16(), 1, 2, torch.randn(16), torch.randn(16), 1e-5)
    yield (torch.randn(8, 6).t(), 1, 2, None, None, 1e-5)  # non-contiguous


def _rms_norm_samples():
    g = dict(requires_grad=True)
    yield (torch.randn(3, 7), 1, 2, torch.randn(7), 1e-6)
    yield (torch.randn(2, 3, 5, **g), 1, 3, torch.randn(3, 5, **g), 1e-6)
    yield (torch.randn(2, 6, 4, 3, **g), 1, 2, torch.randn(6, **g), 1e-5)  # channel axis
    yield (torch.randn(4, 9, dtype=torch.float64, **g), 0, 2, None, 1e-5)
    yield (torch.randn(5, 16).half(), 1, 2, torch.randn(16), torch.finfo(torch.float16).eps)


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck: torch >= 2.4")
@pytest.mark.parametrize("op,samples", [("layer_norm", _layer_norm_samples), ("rms_norm", _rms_norm_samples),
                                        ("layer_norm_train", _layer_norm_samples),
                                        ("rms_norm_train", _rms_norm_samples)])
def test_opcheck(op, samples):
    for args in samples():
        torch.library.opcheck(getattr(torch.ops.fastnorm, op), args, test_utils=OPCHECK_TESTS)


class _Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.channel_norm = fastnorm.RMSNorm(8, eps=1e-5, dim=1)
        self.proj = nn.Linear(8, 16)
        self.norm = fastnorm.LayerNorm(16)
        self.rms = fastnorm.RMSNorm(16)

    def forward(self, x):
        h = self.channel_norm(self.conv(x)).relu()
        h = self.proj(h.mean((2, 3)))
        return self.rms(self.norm(h) + F.layer_norm(h, (16,)))


def test_compile_inductor_fullgraph():
    """Inductor needs a C++ compiler on CPU (gcc here); fullgraph=True fails on any graph break."""
    torch._dynamo.reset()
    model = _Block().eval()
    x = torch.randn(2, 3, 6, 5)
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(model, fullgraph=True)
        torch.testing.assert_close(compiled(x), expected, rtol=1e-5, atol=1e-5)


def test_compile_training_and_dynamic_shapes_without_graph_break():
    # aot_eager traces forward + backward through the fake (meta) kernels and autograd formula, like
    # inductor would, without the C++ compile time of inductor's CPU backend.
    torch._dynamo.reset()
    model = _Block()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
    for batch, h, w in [(2, 6, 5), (3, 4, 7)]:
        x = torch.randn(batch, 3, h, w)
        out = compiled(x)
        out.sum().backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        expected = model(x)
        expected.sum().backward()
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        for got, want in zip(grads, [p.grad for p in model.parameters()]):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
        model.zero_grad()


def _leaf(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


GRADCHECK_CASES = {
    "ln_trailing_wb": lambda: (lambda x, w, b: fastnorm.layer_norm(x, (5,), w, b), (_leaf(3, 5), _leaf(5), _leaf(5))),
    "ln_two_dims_wb": lambda: (lambda x, w, b: fastnorm.layer_norm(x, (3, 4), w, b),
                               (_leaf(2, 3, 4), _leaf(3, 4), _leaf(3, 4))),
    "ln_trailing_x": lambda: (lambda x: fastnorm.layer_norm(x, (6,)), (_leaf(4, 6).add(3).detach().requires_grad_(),)),
    "ln_dim1_wb": lambda: (lambda x, w, b: fastnorm.layer_norm(x, None, w, b, dim=1),
                           (_leaf(2, 4, 3, 2), _leaf(4), _leaf(4))),
    "ln_dim1_b_only": lambda: (lambda x, b: fastnorm.layer_norm(x, None, None, b, dim=1), (_leaf(2, 4, 3), _leaf(4))),
    "rms_trailing_w": lambda: (lambda x, w: fastnorm.rms_norm(x, (5,), w, 1e-6), (_leaf(3, 5), _leaf(5))),
    "rms_trailing_x": lambda: (lambda x: fastnorm.rms_norm(x, (2, 3)), (_leaf(4, 2, 3),)),
    "rms_dim1_w": lambda: (lambda x, w: fastnorm.rms_norm(x, weight=w, eps=1e-5, dim=1),
                           (_leaf(2, 4, 3, 2), _leaf(4))),
}


@pytest.mark.parametrize("case", list(GRADCHECK_CASES))
def test_gradcheck_float64(case):
    fn, inputs = GRADCHECK_CASES[case]()
    assert torch.autograd.gradcheck(fn, inputs)


def test_gradients_only_for_inputs_that_need_them():
    x = torch.randn(3, 5, requires_grad=True)
    w = torch.randn(5)
    b = torch.randn(5, requires_grad=True)
    fastnorm.layer_norm(x, (5,), w, b).sum().backward()
    assert x.grad is not None and b.grad is not None and w.grad is None


@pytest.mark.parametrize("offset", [0.0, 100.0])
@pytest.mark.parametrize("kind", ["ln_trailing", "ln_dim1", "rms_trailing", "rms_dim1"])
def test_float32_gradients_match_pytorch(kind, offset):
    """fp32 gradients agree with PyTorch's own fp32 ones and with float64 ground truth.

    With a +100 offset, fp32 rounding of x - mean alone costs ~1e-5 relative (PyTorch's own error is
    ~3e-5 at worst there), hence the offset-scaled tolerance.
    """
    channels = kind.endswith("dim1")
    shape = (4, 8, 5, 3) if channels else (6, 32)
    n = shape[1] if channels else shape[-1]
    x0 = torch.randn(shape) + offset
    w0, b0 = torch.randn(n), torch.randn(n)
    grad_out = torch.randn(shape)

    def grads(impl, dtype):
        x, w, b = (t.to(dtype).clone().requires_grad_() for t in (x0, w0, b0))
        if impl == "fastnorm":
            dim = dict(dim=1) if channels else {}
            shape_arg = None if channels else (n,)
            y = (fastnorm.layer_norm(x, shape_arg, w, b, **dim) if kind.startswith("ln")
                 else fastnorm.rms_norm(x, shape_arg, w, 1e-5, **dim))
        else:  # torch's norms work on trailing dims: move the channels last and back
            xt = x.movedim(1, -1) if channels else x
            y = F.layer_norm(xt, (n,), w, b) if kind.startswith("ln") else rms_norm_definition(xt, (n,), w, 1e-5)
            y = y.movedim(-1, 1) if channels else y
        y.backward(grad_out.to(dtype))
        return x.grad, w.grad, b.grad

    ours, theirs, exact = grads("fastnorm", torch.float32), grads("torch", torch.float32), grads("torch", torch.float64)
    tol = 1e-5 * (1 + offset / 10)
    for name, got, want, truth in zip(("x", "weight", "bias"), ours, theirs, exact):
        if truth is None:  # rms_norm has no bias
            assert got is None
            continue
        assert got.dtype == torch.float32
        scale = max(1.0, truth.abs().max().item())
        err_truth = (got.double() - truth).abs().max().item() / scale
        err_torch = (got - want).abs().max().item() / scale
        assert err_truth <= tol, f"grad of {name}: error {err_truth:.3g} vs float64"
        assert err_torch <= 2 * tol, f"grad of {name}: differs from PyTorch's by {err_torch:.3g}"
