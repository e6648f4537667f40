"""The C++ fast entry behind fastnorm.layer_norm / rms_norm: it takes plain calls (those that record
autograd through CppNormFunction), declines (returns None, never raises) everything that needs the
Python path, and gives the same bits as the op."""
import pytest
import torch

import fastnorm
from fastnorm.ops import extension
from fastnorm.ops.validate import default_rms_eps


@pytest.fixture(scope="module")
def ext():
    return extension.load("cpu")


def _inputs(shape=(6, 40), dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g).to(dtype)
    w = (torch.rand(shape[-1:], generator=g) + 0.5).to(dtype)
    b = torch.randn(shape[-1:], generator=g).to(dtype)
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_plain_calls_match_the_op(ext, dtype):
    x, w, b = _inputs(dtype=dtype)
    y = ext.try_layer_norm(x, (40,), None, w, b, 1e-5)
    assert y is not None and torch.equal(y, torch.ops.fastnorm.layer_norm(x, 1, 2, w, b, 1e-5))
    y = ext.try_rms_norm(x, 40, None, w, 1e-6)
    assert y is not None and torch.equal(y, torch.ops.fastnorm.rms_norm(x, 1, 2, w, 1e-6))
    y = ext.try_rms_norm(x, None, -1, None, None)  # eps None: the accumulator's machine epsilon, as in torch
    eps = default_rms_eps(dtype)
    assert y is not None and torch.equal(y, torch.ops.fastnorm.rms_norm(x, 1, 2, None, eps))
    x4 = torch.randn(2, 8, 3, 5, dtype=dtype)
    y = ext.try_layer_norm(x4, [8], 1, w[:8].contiguous(), None, 1e-5)
    assert y is not None and torch.equal(y, torch.ops.fastnorm.layer_norm(x4, 1, 2, w[:8].contiguous(), None, 1e-5))


def spy_on_extension(ext, monkeypatch):
    """The names the Python functions look up on the loaded CPU extension from now on, in order."""
    from fastnorm.ops import functional
    seen = []

    class Spy:
        def __getattr__(self, name):
            seen.append(name)
            return getattr(ext, name)

    monkeypatch.setitem(functional._built, "cpu", Spy())
    return seen


def test_public_functions_use_it(ext, monkeypatch):
    x, w, b = _inputs()
    fastnorm.layer_norm(x, (40,), w, b)  # loads the extension if no test did yet
    seen = spy_on_extension(ext, monkeypatch)
    fastnorm.layer_norm(x, (40,), w, b)
    fastnorm.rms_norm(x, (40,), w, 1e-5)
    assert seen == ["try_layer_norm", "try_rms_norm"]


class _Sub(torch.Tensor):
    pass


def _declined_calls():
    x, w, b = _inputs()
    return {
        "subclass": lambda e: e.try_layer_norm(x.as_subclass(_Sub), (40,), None, w, b, 1e-5),
        "int_eps": lambda e: e.try_layer_norm(x, (40,), None, w, b, 0),
        "str_shape": lambda e: e.try_layer_norm(x, "40", None, w, b, 1e-5),
        "float_shape": lambda e: e.try_layer_norm(x, (40.0,), None, w, b, 1e-5),
        "wrong_shape": lambda e: e.try_layer_norm(x, (39,), None, w, b, 1e-5),
        "empty_shape": lambda e: e.try_layer_norm(x, (), None, w, b, 1e-5),
        "too_many_dims": lambda e: e.try_layer_norm(x, (1, 6, 40), None, None, None, 1e-5),
        "wrong_weight": lambda e: e.try_layer_norm(x, (40,), None, w[:20], b, 1e-5),
        "int_weight": lambda e: e.try_layer_norm(x, (40,), None, w.long(), b, 1e-5),
        "int_input": lambda e: e.try_layer_norm(x.long(), (40,), None, None, None, 1e-5),
        "not_tensors": lambda e: e.try_layer_norm([1.0], (1,), None, "w", None, 1e-5),
        "dim_tuple": lambda e: e.try_rms_norm(x, None, (1,), None, 1e-5),
        "dim_out_of_range": lambda e: e.try_rms_norm(x, None, 2, None, 1e-5),
        "huge_dim": lambda e: e.try_rms_norm(x, None, 2**70, None, 1e-5),
        "shape_and_dim_disagree": lambda e: e.try_rms_norm(x, (6,), 1, None, 1e-5),
        "no_shape_no_dim": lambda e: e.try_rms_norm(x, None, None, None, 1e-5),
        "meta_input": lambda e: e.try_rms_norm(x.to("meta"), (40,), None, None, 1e-5),
    }


@pytest.mark.parametrize("case", list(_declined_calls()))
def test_declines_what_needs_the_python_path(ext, case):
    assert _declined_calls()[case](ext) is None


@pytest.mark.parametrize("which", ["x", "weight", "bias"])
def test_records_autograd_through_the_cpp_function(ext, which):
    x, w, b = _inputs()
    xs, ws, bs = (t.clone().requires_grad_(name == which) for t, name in zip((x, w, b), ("x", "weight", "bias")))
    y = ext.try_layer_norm(xs, (40,), None, ws, bs, 1e-5)
    assert y is not None and "CppNormFunction" in y.grad_fn.name()
    assert torch.equal(y, torch.ops.fastnorm.layer_norm(x, 1, 2, w, b, 1e-5))
    y = ext.try_rms_norm(xs, None, -1, ws, 1e-6)
    assert (y.grad_fn is not None) == (which != "bias")


def test_declines_autograd_under_tracing_or_functorch(ext):
    x, w, b = _inputs()
    xg = x.clone().requires_grad_()
    seen = []

    def traced(t):
        seen.append(ext.try_layer_norm(xg, (40,), None, w, b, 1e-5))
        return t * 2

    torch.jit.trace(traced, (x,), check_trace=False)

    def f(t):
        seen.append(ext.try_layer_norm(xg, (40,), None, w, b, 1e-5))  # plain tensors inside a transform
        return t.sum()

    torch.func.grad(f)(x[0])
    assert seen == [None, None]
    with torch.no_grad():
        assert ext.try_layer_norm(xg, (40,), None, w, b, 1e-5).grad_fn is None  # nothing to record


def test_declines_under_a_dispatch_mode(ext):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x, w, b = _inputs()
    with Passthrough():
        assert ext.try_layer_norm(x, (40,), None, w, b, 1e-5) is None
        assert ext.try_layer_norm(x.clone().requires_grad_(), (40,), None, w, b, 1e-5) is None


def test_declines_functorch_wrappers(ext):
    x, w, b = _inputs()
    seen = []

    def f(row):
        seen.append(ext.try_layer_norm(row, (40,), None, w, b, 1e-5))
        return row.sum()

    torch.func.vmap(f)(x)
    torch.func.grad(f)(x[0])
    assert seen == [None, None]


def test_autograd_still_works_through_the_public_function():
    x, w, b = _inputs()
    x.requires_grad_()
    fastnorm.layer_norm(x, (40,), w, b).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
