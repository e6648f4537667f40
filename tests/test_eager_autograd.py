"""fastnorm.layer_norm / rms_norm record the CPU extension's CppNormFunction (C++, kernels/module.cpp) for a
plain CPU call that needs gradients, and the custom op otherwise: both give the same bits, and so does
eager_autograd.NormFunction, its statement in Python."""
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import fastnorm
from conftest import reference_layer_norm, reference_rms_norm
from fastnorm.ops import eager_autograd, extension


def _cpp(grad_fn) -> bool:
    """Whether a grad_fn is CppNormFunction's node."""
    return grad_fn is not None and "CppNormFunction" in grad_fn.name()


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
    assert _cpp(fn1) and not _cpp(fn2) and "NormFunction" not in type(fn2).__name__
    assert torch.equal(y1, y2)
    for a, c in zip(g1, g2):
        assert (a is None) == (c is None) and (a is None or torch.equal(a, c))


def test_dispatch_mode_keeps_the_op():
    x = torch.randn(4, 33, requires_grad=True)
    w = torch.randn(33, requires_grad=True)
    with _Passthrough():
        y = fastnorm.layer_norm(x, (33,), w)
    assert not _cpp(y.grad_fn) and "NormFunction" not in type(y.grad_fn).__name__
    y.sum().backward()
    assert x.grad is not None and w.grad is not None


def test_non_contiguous_grad_and_channel_axis():
    x = torch.randn(3, 8, 5, 6, requires_grad=True)
    w = torch.randn(8, requires_grad=True)
    y = fastnorm.layer_norm(x, dim=1, weight=w)
    assert _cpp(y.grad_fn)
    dy = torch.randn(3, 6, 5, 8).permute(0, 3, 2, 1)  # not contiguous
    y.backward(dy)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.ops.fastnorm.layer_norm(x2, 1, 2, w2, None, 1e-5).backward(dy)
    assert torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)


# ---- CppNormFunction against NormFunction and the op, bit for bit


_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64]


def _leaves(tensors, need):
    return [None if t is None else t.detach().clone().requires_grad_(r) for t, r in zip(tensors, need)]


def _run(path, x, w, b, dy, need, begin, end, eps, rms):
    """(y, grads of x / w / b or None, grad_fn) of one way of computing the norm with autograd."""
    xs, ws, bs = _leaves((x, w, b), need)
    if path == "public":  # try_layer_norm / try_rms_norm: CppNormFunction straight from C++
        shape = tuple(x.shape[begin:end])
        dim = None if end == x.dim() else begin
        if rms:
            y = fastnorm.rms_norm(x=xs, normalized_shape=None if dim is not None else shape, weight=ws, eps=eps,
                                  dim=dim)
        else:
            y = fastnorm.layer_norm(xs, None if dim is not None else shape, ws, bs, eps, dim=dim)
    elif path == "cpp":  # the extension function eager_autograd takes after functional.py's checks
        y = eager_autograd.norm_autograd(xs, ws, bs, begin, end, eps, rms)
    elif path == "python":
        y = eager_autograd.NormFunction.apply(xs, ws, bs, begin, end, eps, rms)
    elif rms:
        y = torch.ops.fastnorm.rms_norm(xs, begin, end, ws, eps)
    else:
        y = torch.ops.fastnorm.layer_norm(xs, begin, end, ws, bs, eps)
    y.backward(dy)
    return y, [None if t is None else t.grad for t in (xs, ws, bs)], y.grad_fn


def _assert_same(first, second):
    (y1, g1, _), (y2, g2, _) = first, second
    assert y1.dtype == y2.dtype and torch.equal(y1, y2)
    for a, c in zip(g1, g2):
        assert (a is None) == (c is None)
        if a is not None:
            assert a.dtype == c.dtype and a.shape == c.shape and torch.equal(a, c)


_AFFINE = {"w_b": (True, True), "w": (True, False), "b": (False, True), "none": (False, False)}
_NEEDS = [(True, True, True), (True, False, False), (False, True, False), (False, False, True), (False, True, True),
          (True, False, True)]
# (rms, affine, need): each way of asking for gradients once, RMSNorm without a bias
_CASES = sorted({(rms, affine, tuple(r and has for r, has in zip(need, (True, *_AFFINE[affine]))))
                 for rms in (False, True) for affine in _AFFINE for need in _NEEDS
                 if not (rms and _AFFINE[affine][1]) and any(r and has for r, has in zip(need, (True, *_AFFINE[affine])))})


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("rms, affine, need", _CASES, ids=str)
def test_cpp_function_matches_python_function_and_op(dtype, rms, affine, need):
    has_w, has_b = _AFFINE[affine]
    w_dtype = torch.float32 if dtype in (torch.bfloat16, torch.float16) and affine == "w" else dtype
    x = (torch.randn(6, 517, dtype=torch.float64) * 2 + 3).to(dtype)
    dy = torch.randn(6, 517, dtype=torch.float64).to(dtype)
    w = torch.randn(517, dtype=torch.float64).to(w_dtype) if has_w else None
    b = torch.randn(517, dtype=torch.float64).to(dtype) if has_b else None
    args = (x, w, b, dy, need, 1, 2, 1e-5, rms)
    public, cpp, python, op = (_run(p, *args) for p in ("public", "cpp", "python", "op"))
    assert _cpp(public[2]) and _cpp(cpp[2]) and "NormFunction" in type(python[2]).__name__
    _assert_same(public, python)
    _assert_same(cpp, python)
    _assert_same(public, op)


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_cpp_function_channel_axis_and_strided_input(dtype, rms):
    x = torch.randn(3, 6, 7, 10, dtype=torch.float64).to(dtype).transpose(2, 3)  # not contiguous
    dy = torch.randn(3, 6, 10, 7, dtype=torch.float64).to(dtype)
    w = torch.randn(6, dtype=torch.float64).to(dtype)
    b = None if rms else torch.randn(6, dtype=torch.float64).to(dtype)
    args = (x, w, b, dy, (True, True, b is not None), 1, 2, 1e-5, rms)
    public, python, op = (_run(p, *args) for p in ("public", "python", "op"))
    assert _cpp(public[2])
    _assert_same(public, python)
    _assert_same(public, op)


@pytest.mark.parametrize("w_dtype, b_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                                              (torch.float64, torch.float64)], ids=str)
def test_cpp_function_mixed_parameter_dtypes_and_shapes(w_dtype, b_dtype):
    """Gradients cast back to each parameter's dtype and shape (several normalized dims)."""
    x = torch.randn(5, 6, 8, dtype=torch.float64).to(torch.bfloat16)
    dy = torch.randn(5, 6, 8, dtype=torch.float64).to(torch.bfloat16)
    w = torch.randn(6, 8, dtype=torch.float64).to(w_dtype)
    b = torch.randn(6, 8, dtype=torch.float64).to(b_dtype)
    args = (x, w, b, dy, (True, True, True), 1, 3, 1e-5, False)
    public, python, op = (_run(p, *args) for p in ("public", "python", "op"))
    assert _cpp(public[2])
    assert public[1][1].dtype == w_dtype and public[1][2].dtype == b_dtype and public[1][1].shape == (6, 8)
    _assert_same(public, python)
    _assert_same(public, op)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
@pytest.mark.parametrize("dim", [None, 1], ids=["last", "dim1"])
def test_cpp_function_gradcheck(rms, dim):
    x = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    n = 5 if dim == 1 else 4
    w = torch.randn(n, dtype=torch.float64, requires_grad=True)
    b = torch.randn(n, dtype=torch.float64, requires_grad=True)
    shape = None if dim == 1 else (n,)
    if rms:
        fn = lambda x_, w_: fastnorm.rms_norm(x_, shape, w_, 1e-6, dim=dim)
        inputs = (x, w)
    else:
        fn = lambda x_, w_, b_: fastnorm.layer_norm(x_, shape, w_, b_, 1e-5, dim=dim)
        inputs = (x, w, b)
    assert _cpp(fn(*inputs).grad_fn)
    assert torch.autograd.gradcheck(fn, inputs)


@pytest.mark.parametrize("rms", [False, True], ids=["layer", "rms"])
def test_cpp_function_gradients_match_float64(rms):
    x = torch.randn(16, 300, requires_grad=True)
    w = (torch.rand(300) + 0.5).requires_grad_()
    b = torch.randn(300, requires_grad=True)
    dy = torch.randn(16, 300)
    if rms:
        y = fastnorm.rms_norm(x, (300,), w, 1e-6)
        ref = lambda x_, w_, b_: reference_rms_norm(x_, (300,), w_, 1e-6)
    else:
        y = fastnorm.layer_norm(x, (300,), w, b, 1e-5)
        ref = lambda x_, w_, b_: reference_layer_norm(x_, (300,), w_, b_, 1e-5)
    assert _cpp(y.grad_fn)
    y.backward(dy)
    x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
    ref(x64, w64, None if rms else b64).backward(dy.double())
    for got, want in [(x.grad, x64.grad), (w.grad, w64.grad)] + ([] if rms else [(b.grad, b64.grad)]):
        scale = max(1.0, want.abs().max().item())
        assert (got.double() - want).abs().max().item() / scale < 1e-5


def test_cpp_function_after_the_python_checks():
    """A call the C++ entry declines (an int eps, a dim tuple) records it too, through norm_autograd."""
    x = torch.randn(4, 6, 8, requires_grad=True)
    w = torch.randn(6, 8, requires_grad=True)
    ref = torch.ops.fastnorm.layer_norm(x, 1, 3, w, None, 1.0)
    for y in (fastnorm.layer_norm(x, (6, 8), w, eps=1), fastnorm.layer_norm(x, weight=w, eps=1.0, dim=(1, 2))):
        assert _cpp(y.grad_fn) and torch.equal(y, ref)
    y = fastnorm.rms_norm(x, (8,), None, 1)
    assert _cpp(y.grad_fn) and torch.equal(y, torch.ops.fastnorm.rms_norm(x, 2, 3, None, 1.0))


def test_cpp_function_bad_input_keeps_the_messages():
    x = torch.randn(4, 8, requires_grad=True)
    with pytest.raises(ValueError, match="has shape"):
        fastnorm.layer_norm(x, (8,), torch.randn(7, requires_grad=True))
    with pytest.raises(ValueError, match="expected input with shape"):
        fastnorm.rms_norm(x, (7,))
    with pytest.raises(TypeError, match="not supported"):
        fastnorm.layer_norm(x, (8,), torch.ones(8, dtype=torch.int32))


def test_cpp_function_double_backward_as_python_function():
    """create_graph: the backward goes through the op fastnorm::norm_backward, which has no autograd (a
    warning, no second-order gradient), for CppNormFunction as for NormFunction."""
    outcomes = []
    for path in ("public", "python"):
        x = torch.randn(4, 9, dtype=torch.float64, requires_grad=True)
        w = torch.randn(9, dtype=torch.float64, requires_grad=True)
        torch.manual_seed(0)
        x.data.copy_(torch.randn(4, 9, dtype=torch.float64))
        w.data.copy_(torch.randn(9, dtype=torch.float64))
        if path == "public":
            y = fastnorm.layer_norm(x, (9,), w)
            assert _cpp(y.grad_fn)
        else:
            y = eager_autograd.NormFunction.apply(x, w, None, 1, 2, 1e-5, False)
        gx, gw = torch.autograd.grad((y * y).sum(), (x, w), create_graph=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (gx.sum() + gw.sum()).backward()
        outcomes.append((gx.detach(), gw.detach(), gx.requires_grad, x.grad is None, w.grad is None,
                         any("norm_backward" in str(c.message) for c in caught)))
    (gx1, gw1, *rest1), (gx2, gw2, *rest2) = outcomes
    assert torch.equal(gx1, gx2) and torch.equal(gw1, gw2) and rest1 == rest2


def test_cpp_function_backward_through_a_dispatch_mode():
    """A dispatch mode around the backward sees the op fastnorm::norm_backward, as with NormFunction."""
    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(str(func))
            return func(*args, **(kwargs or {}))

    x = torch.randn(4, 33, requires_grad=True)
    w = torch.randn(33, requires_grad=True)
    y = fastnorm.layer_norm(x, (33,), w)
    assert _cpp(y.grad_fn)
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.ops.fastnorm.layer_norm(x2, 1, 2, w2, None, 1e-5).sum().backward()
    with Record():
        y.sum().backward()
    assert any("fastnorm.norm_backward" in s for s in seen)
    assert torch.equal(x.grad, x2.grad) and torch.equal(w.grad, w2.grad)


def test_cpp_function_saved_tensors_and_retain_graph():
    x = torch.randn(4, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    y = fastnorm.layer_norm(x, (16,), w)
    assert _cpp(y.grad_fn)
    y.sum().backward(retain_graph=True)
    first = x.grad.clone()
    y.sum().backward()
    assert torch.equal(x.grad, 2 * first)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.sum().backward()
    x2 = torch.randn(4, 16, requires_grad=True)
    h = x2 * 1
    y = fastnorm.layer_norm(h, (16,), w)
    h.add_(1)  # a saved tensor modified in place
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_functorch_and_tracing_keep_the_op():
    """Inside a functorch transform the call takes the op (which torch.library's autograd does not support
    there yet: the same error as the op's), wrapped tensors or plain; a torch.jit trace records the op."""
    w = torch.randn(8, requires_grad=True)
    x = torch.randn(3, 8)
    x_ = x.clone().requires_grad_()
    s = torch.tensor(2.0)
    for public, op in [
        (lambda t: fastnorm.layer_norm(t, (8,), w).sum(), lambda t: torch.ops.fastnorm.layer_norm(t, 1, 2, w, None, 1e-5).sum()),
        (lambda t: (fastnorm.layer_norm(x_, (8,), w) * t).sum(),
         lambda t: (torch.ops.fastnorm.layer_norm(x_, 1, 2, w, None, 1e-5) * t).sum()),
    ]:
        arg = x if public.__code__.co_argcount and "x_" not in public.__code__.co_names else s
        outcomes = []
        for fn in (public, op):
            try:
                outcomes.append(("ok", torch.func.grad(fn)(arg)))
            except RuntimeError as e:
                outcomes.append(("error", str(e)))
        assert outcomes[0][0] == outcomes[1][0]
        if outcomes[0][0] == "ok":
            assert torch.allclose(outcomes[0][1], outcomes[1][1])
        else:
            assert outcomes[0][1] == outcomes[1][1] and "CppNormFunction" not in outcomes[0][1]
    traced = torch.jit.trace(lambda t, w_: fastnorm.layer_norm(t, (8,), w_), (x_, w), check_trace=False)
    assert "fastnorm::layer_norm" in str(traced.graph)


def test_no_grad_and_inference_keep_the_plain_kernel():
    x = torch.randn(4, 16, requires_grad=True)
    w = torch.randn(16, requires_grad=True)
    with torch.no_grad():
        assert fastnorm.layer_norm(x, (16,), w).grad_fn is None
    with torch.inference_mode():
        assert fastnorm.layer_norm(x, (16,), w).grad_fn is None
    assert hasattr(extension.load("cpu"), "norm_forward_autograd")
