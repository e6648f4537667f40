"""The CPU fast entries behind fastnorm.group_norm / batch_norm / instance_norm (kernels/module.cpp's
try_group_norm and try_batch_norm): they take plain calls (those that record autograd through CppFamilyFunction), give the
same bits as the op path (outputs, gradients, running statistics), decline (return None, never raise)
everything that needs the Python path, and a double backward through the C++ Function still works."""
import pytest
import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.ops import extension, family_ops

from test_fast_entry import _Sub, spy_on_extension


@pytest.fixture(scope="module")
def ext():
    return extension.load("cpu")


def _inputs(shape=(3, 8, 6, 7), dtype=torch.float32, param_dtype=None):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(shape, generator=g, dtype=torch.float64) + 3).to(dtype)
    c = shape[1]
    w = (torch.rand(c, generator=g, dtype=torch.float64) + 0.5).to(param_dtype or dtype)
    b = torch.randn(c, generator=g, dtype=torch.float64).to(param_dtype or dtype)
    return x, w, b


def _op_grads(name, x, w, b, dy, *args):
    """y and (dx, dw, db) through the op (its register_autograd backward), the path before the fast entry."""
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    y = getattr(torch.ops.fastnorm, name)(*leaves, *args)[0]
    y.backward(dy)
    return y.detach(), [t.grad for t in leaves]


@pytest.mark.parametrize("dtype,param_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                               (torch.bfloat16, torch.float32), (torch.float64, None),
                                               (torch.float16, torch.float32)], ids=str)
@pytest.mark.parametrize("activation", [None, "silu"])
def test_group_norm_matches_the_op(ext, dtype, param_dtype, activation):
    x, w, b = _inputs(dtype=dtype, param_dtype=param_dtype)
    y = ext.try_group_norm(x, 4, w, b, 1e-5, activation)
    assert y is not None and torch.equal(y, torch.ops.fastnorm.group_norm(x, w, b, 4, 1e-5, activation)[0])
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    y = ext.try_group_norm(*leaves[:1], 4, *leaves[1:], 1e-5, activation)
    assert "CppFamilyFunction" in y.grad_fn.name()
    y.backward(dy)
    y_op, grads_op = _op_grads("group_norm", x, w, b, dy, 4, 1e-5, activation)
    assert torch.equal(y.detach(), y_op)
    for name, got, expected in zip(("dx", "dweight", "dbias"), (t.grad for t in leaves), grads_op):
        assert got.dtype == expected.dtype and torch.equal(got, expected), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_batch_norm_matches_the_op_and_updates_the_running_statistics(ext, dtype):
    x, w, b = _inputs(dtype=dtype)
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(1)).to(dtype)
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    rm, rv = torch.linspace(-1, 1, 8), torch.linspace(0.5, 2, 8)
    rm_py, rv_py = rm.clone(), rv.clone()
    y = ext.try_batch_norm(leaves[0], rm, rv, leaves[1], leaves[2], True, 0.1, 1e-5)
    assert y is not None
    y.backward(dy)
    y_op, grads_op = _op_grads("batch_norm", x, w, b, dy, 1e-5)
    assert torch.equal(y.detach(), y_op)
    for got, expected in zip((t.grad for t in leaves), grads_op):
        assert torch.equal(got, expected)
    with torch.no_grad():  # the Python path's update of the running statistics
        mean, var = torch.ops.fastnorm.batch_norm(x, w, b, 1e-5)[1:]
    count = x.numel() // x.shape[1]
    rm_py.lerp_(mean, 0.1)
    rv_py.lerp_(var * (count / (count - 1)), 0.1)
    assert torch.equal(rm, rm_py) and torch.equal(rv, rv_py)
    # against torch's own BatchNorm (its running statistics take the same update)
    rm_t, rv_t = torch.linspace(-1, 1, 8, dtype=torch.float64), torch.linspace(0.5, 2, 8, dtype=torch.float64)
    F.batch_norm(x.double(), rm_t, rv_t, w.double(), b.double(), True, 0.1, 1e-5)
    torch.testing.assert_close(rm.double(), rm_t, rtol=1e-5, atol=1e-5)  # the same x: only the sums' precision
    torch.testing.assert_close(rv.double(), rv_t, rtol=1e-5, atol=1e-5)


def test_no_grad_calls_take_the_kernels(ext):
    x, w, b = _inputs()
    with torch.no_grad():
        wg = w.clone().requires_grad_()
        y = ext.try_group_norm(x, 2, wg, b, 1e-5, None)
        assert y is not None and y.grad_fn is None
        assert torch.equal(y, torch.ops.fastnorm.group_norm(x, w, b, 2, 1e-5)[0])
        y = ext.try_batch_norm(x, None, None, wg, b, True, 0.1, 1e-5)
        assert y is not None and torch.equal(y, torch.ops.fastnorm.batch_norm(x, w, b, 1e-5)[0])


def test_public_functions_and_modules_use_it(ext, monkeypatch):
    x, w, b = _inputs()
    fastnorm.group_norm(x, 2, w, b)  # loads the extension if no test did yet
    seen = spy_on_extension(ext, monkeypatch)
    fastnorm.group_norm(x, 2, w, b)
    fastnorm.batch_norm(x, None, None, w, b, training=True)
    gn, bn = fastnorm.GroupNorm(2, 8), fastnorm.BatchNorm2d(8)
    gn(x).sum().backward()
    bn(x).sum().backward()
    assert seen == ["try_group_norm", "try_batch_norm"] * 2
    seen.clear()
    y = fastnorm.instance_norm(x, weight=w, bias=b)  # a group a channel
    assert seen == ["try_group_norm"] and torch.equal(y, torch.ops.fastnorm.group_norm(x, w, b, 8, 1e-5)[0])
    seen.clear()
    fastnorm.instance_norm(x, torch.zeros(8), torch.ones(8), w, b)  # running statistics: the Python path
    with pytest.raises(ValueError, match="more than 1 spatial element"):
        fastnorm.instance_norm(torch.randn(4, 8, 1), weight=w)
    assert "try_group_norm" not in seen
    assert bn.num_batches_tracked.item() == 1 and not torch.equal(bn.running_mean, torch.zeros(8))


def test_modules_match_torch_in_training():
    """A BatchNorm2d / GroupNorm training step through the fast entry against torch's modules (float64)."""
    torch.manual_seed(0)
    x = torch.randn(4, 6, 9, 5) * 2 + 1
    for ours, theirs in [(fastnorm.BatchNorm2d(6, momentum=0.3), torch.nn.BatchNorm2d(6, momentum=0.3)),
                         (fastnorm.GroupNorm(3, 6), torch.nn.GroupNorm(3, 6))]:
        theirs = theirs.double()
        with torch.no_grad():
            for p, q in zip(ours.parameters(), theirs.parameters()):
                p.copy_(torch.randn_like(p))
                q.copy_(p)
        for _ in range(2):
            xa, xb = x.clone().requires_grad_(), x.double().requires_grad_()
            ours(xa).square().sum().backward()
            theirs(xb).square().sum().backward()
            torch.testing.assert_close(xa.grad.double(), xb.grad, rtol=1e-4, atol=1e-4)
        for p, q in zip(ours.parameters(), theirs.parameters()):
            torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-4, atol=1e-3)
        for p, q in zip(ours.buffers(), theirs.buffers()):
            torch.testing.assert_close(p.double(), q.double(), rtol=1e-5, atol=1e-5)


def _decline_cases():
    x, w, b = _inputs()
    yield "short planes with grad", lambda e: e.try_group_norm(x.reshape(3, 8, 42)[:, :, :5].contiguous()
                                                              .requires_grad_(), 2, w, b, 1e-5, None)
    yield "batch_norm short planes", lambda e: e.try_batch_norm(torch.randn(6, 8, requires_grad=True), None, None,
                                                                 w, b, True, 0.1, 1e-5)
    yield "groups do not divide", lambda e: e.try_group_norm(x, 3, w, b, 1e-5, None)
    yield "groups not an int", lambda e: e.try_group_norm(x, 2.0, w, b, 1e-5, None)
    yield "groups a bool", lambda e: e.try_group_norm(x, True, w, b, 1e-5, None)
    yield "zero groups", lambda e: e.try_group_norm(x, 0, w, b, 1e-5, None)
    yield "eps an int", lambda e: e.try_group_norm(x, 2, w, b, 1, None)
    yield "unknown activation", lambda e: e.try_group_norm(x, 2, w, b, 1e-5, "relu")
    yield "no parameters", lambda e: e.try_group_norm(x, 2, None, None, 1e-5, None)
    yield "weight shape", lambda e: e.try_group_norm(x, 2, w[:4], b, 1e-5, None)
    yield "weight float64", lambda e: e.try_group_norm(x, 2, w.double(), b, 1e-5, None)
    yield "bias a list", lambda e: e.try_group_norm(x, 2, w, [0.0] * 8, 1e-5, None)
    yield "one value a group", lambda e: e.try_group_norm(torch.randn(1, 4, 1), 4, torch.ones(4), None, 1e-5, None)
    yield "empty", lambda e: e.try_group_norm(torch.randn(0, 8, 5), 2, w, b, 1e-5, None)
    yield "one dim", lambda e: e.try_group_norm(torch.randn(8), 2, w, b, 1e-5, None)
    yield "integer input", lambda e: e.try_group_norm(torch.ones(2, 8, 4, dtype=torch.int32), 2, w, b, 1e-5, None)
    yield "subclass", lambda e: e.try_group_norm(x.as_subclass(_Sub), 2, w, b, 1e-5, None)
    yield "eval batch_norm", lambda e: e.try_batch_norm(x, torch.zeros(8), torch.ones(8), w, b, False, 0.1, 1e-5)
    yield "training a number", lambda e: e.try_batch_norm(x, None, None, w, b, 1, 0.1, 1e-5)
    yield "zero eps", lambda e: e.try_batch_norm(x, None, None, w, b, True, 0.1, 0.0)
    yield "momentum None", lambda e: e.try_batch_norm(x, None, None, w, b, True, None, 1e-5)
    yield "half running statistics", lambda e: e.try_batch_norm(x, torch.zeros(8).half(), None, w, b, True, 0.1, 1e-5)
    yield "running mean requires grad", lambda e: e.try_batch_norm(x, torch.zeros(8, requires_grad=True), None, w, b,
                                                                    True, 0.1, 1e-5)
    yield "one value a channel", lambda e: e.try_batch_norm(torch.randn(1, 8), None, None, w, b, True, 0.1, 1e-5)


@pytest.mark.parametrize("case", [name for name, _ in _decline_cases()])
def test_declines_what_needs_the_python_path(ext, case):
    call = dict(_decline_cases())[case]
    assert call(ext) is None


def test_declines_under_a_dispatch_mode_tracing_or_functorch(ext):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x, w, b = _inputs()
    with Passthrough():
        assert ext.try_group_norm(x, 2, w, b, 1e-5, None) is None
        assert ext.try_batch_norm(x, None, None, w, b, True, 0.1, 1e-5) is None
    wg = w.clone().requires_grad_()
    seen = []

    def traced(t):
        seen.append(ext.try_group_norm(x, 2, wg, b, 1e-5, None))
        return t * 2

    torch.jit.trace(traced, (x,), check_trace=False)

    def f(t):  # plain tensors inside a transform
        seen.append(ext.try_group_norm(x, 2, wg, b, 1e-5, None))
        seen.append(ext.try_group_norm(t, 2, w, b, 1e-5, None))  # a functorch wrapper
        return t.sum()

    torch.func.grad(f)(x)
    assert seen == [None, None, None]


def test_bad_input_still_raises_the_python_errors():
    x, w, b = _inputs()
    with pytest.raises(ValueError, match="num_groups=3 must be positive and divide"):
        fastnorm.group_norm(x, 3, w, b)
    with pytest.raises(ValueError, match="weight has shape"):
        fastnorm.group_norm(x, 2, w[:4], b)
    with pytest.raises(ValueError, match="activation must be one of"):
        fastnorm.group_norm(x, 2, w, b, activation="relu")
    with pytest.raises(ValueError, match="eps must be positive when training"):
        fastnorm.batch_norm(x, None, None, w, b, training=True, eps=0.0)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        fastnorm.batch_norm(torch.randn(1, 8), None, None, w, b, training=True)


@pytest.mark.parametrize("which", ["group_norm", "group_norm_silu", "batch_norm"])
def test_double_backward_through_the_cpp_function(ext, which):
    """Planes of 40 elements: the fast entry records CppFamilyFunction, whose backward, itself recorded here,
    goes to family_ops.family_backward_fallback (the torch-op formula)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 40, generator=g, dtype=torch.float64, requires_grad=True)
    w, b = (torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    calls = {
        "group_norm": lambda x, w, b: ext.try_group_norm(x, 2, w, b, 1e-5, None),
        "group_norm_silu": lambda x, w, b: ext.try_group_norm(x, 2, w, b, 1e-5, "silu"),
        "batch_norm": lambda x, w, b: ext.try_batch_norm(x, None, None, w, b, True, 0.1, 1e-5),
    }
    fn = calls[which]
    assert "CppFamilyFunction" in fn(x, w, b).grad_fn.name()
    assert torch.autograd.gradcheck(fn, (x, w, b))
    assert torch.autograd.gradgradcheck(fn, (x, w, b))


def test_fallback_names_the_backward_modes():
    """family_backward_fallback maps the C++ Function's codes back to the op backward's arguments."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 40, generator=g, dtype=torch.float64)
    w, b = torch.rand(4, generator=g, dtype=torch.float64) + 0.5, torch.randn(4, generator=g, dtype=torch.float64)
    dy = torch.randn(x.shape, generator=g, dtype=torch.float64)
    y, mean, var = torch.ops.fastnorm.group_norm(x, w, b, 2, 1e-5, "silu")
    got = family_ops.family_backward_fallback(dy, x, w, b, mean, var, 2, 1e-5, 1, 0, (True, True, True))
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    ref = F.silu(F.group_norm(leaves[0], 2, leaves[1], leaves[2], 1e-5))
    expected = torch.autograd.grad(ref, leaves, dy)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e, rtol=1e-9, atol=1e-9)
