"""fastnorm.group_norm / instance_norm / batch_norm / normalize and their custom ops against torch's own
functions in float64: every dtype, odd channel counts and groups, offsets, non-contiguous input,
running statistics, gradients, torch.compile, bad input."""
import pytest
import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.ops import family_ops
from conftest import assert_matches_reference
from family_reference import family_kernels  # noqa: F401  (autouse: the extension's kernels or a stand-in)
from family_reference import reference_batch_norm, reference_group_norm, reference_instance_norm

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
DISTS = ["randn", "rand", "offset1000"]
# Gradients: max |got - ref| relative to max(1, max |ref|), per input dtype.
GRAD_TOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 4e-2, torch.float16: 2e-2}


def make_input(shape, dist, dtype, device, contiguous=True):
    """randn, rand or randn + 1000 (statistics must be taken about a shift); non-contiguous: the same
    sizes with reversed strides."""
    sizes = shape if contiguous else shape[::-1]
    x = torch.rand(sizes, dtype=torch.float64) if dist == "rand" else torch.randn(sizes, dtype=torch.float64)
    if dist == "offset1000":
        x += 1000
    x = x.to(device=device, dtype=dtype)
    return x if contiguous else x.permute(*reversed(range(len(shape))))


def make_affine(channels, dtype, device):
    """Per-channel weight and bias in `dtype` (the input's or float32)."""
    weight = (torch.rand(channels, dtype=torch.float64) + 0.5).to(device=device, dtype=dtype)
    return weight, torch.randn(channels, dtype=torch.float64).to(device=device, dtype=dtype)


def assert_grads_close(got, expected, dtype):
    for name, g, e in zip(("dx", "dweight", "dbias"), got, expected):
        err = (g.double() - e).abs().max().item() / max(1.0, e.abs().max().item())
        assert err <= GRAD_TOL[dtype], f"{name}: error {err:.3g} > {GRAD_TOL[dtype]}"


# ---- forward -----------------------------------------------------------------------------------------

# (shape, groups): odd channel counts, C not a multiple of 8, one group, one channel per group (instance),
# 2-d input, spatial size 1.
GROUP_CASES = [((2, 6, 5, 7), 3), ((3, 15, 11), 5), ((2, 12, 9), 12), ((4, 7), 7), ((1, 10, 33, 17), 2),
               ((2, 9, 1), 1), ((2, 24, 3, 5), 6), ((3, 1, 40), 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,groups", GROUP_CASES, ids=str)
def test_group_norm(shape, groups, dtype, device):
    for dist in DISTS:
        for contiguous in (True, False):
            x = make_input(shape, dist, dtype, device, contiguous)
            w, b = make_affine(shape[1], dtype if dist != "rand" else torch.float32, device)
            plain = fastnorm.group_norm(x, groups, eps=1e-5)  # no parameters: the LayerNorm kernels
            assert_matches_reference(plain, reference_group_norm(x, groups, None, None, 1e-5))
            y = fastnorm.group_norm(x, groups, w, b, 1e-5)
            assert y.dtype == dtype and y.is_contiguous()
            assert_matches_reference(y, reference_group_norm(x, groups, w, b, 1e-5))
    assert_matches_reference(fastnorm.group_norm(x, groups), reference_group_norm(x, groups))


BATCH_SHAPES = [(4, 3), (2, 5, 7), (3, 6, 4, 5), (2, 3, 2, 3, 4), (1, 9, 13), (16, 1, 2)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", BATCH_SHAPES, ids=str)
def test_batch_norm_training_and_eval(shape, dtype, device):
    """Training: batch statistics, running statistics updated in place (in float32 buffers for half
    input, as nn.BatchNorm keeps them); eval: the running statistics."""
    stat_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    for dist in DISTS:
        for contiguous in (True, False):
            x = make_input(shape, dist, dtype, device, contiguous)
            w, b = make_affine(shape[1], dtype, device)
            rm, rv = torch.randn(shape[1], dtype=stat_dtype, device=device), torch.rand(shape[1], device=device)
            rv = rv.to(stat_dtype) + 0.5
            rm64, rv64 = rm.double(), rv.double()
            y = fastnorm.batch_norm(x, rm, rv, w, b, True, 0.3, 1e-5)
            assert y.dtype == dtype
            assert_matches_reference(y, reference_batch_norm(x, rm64, rv64, w, b, True, 0.3, 1e-5))
            assert_matches_reference(rm, rm64, torch.float32)
            assert_matches_reference(rv, rv64, torch.float32)
    x = make_input(shape, "randn", dtype, device) * 2 + 1
    assert_matches_reference(fastnorm.batch_norm(x, rm, rv, w, b), reference_batch_norm(x, rm64, rv64, w, b))
    y = fastnorm.batch_norm(x, None, None, None, None, training=True)  # no running statistics, no affine
    assert_matches_reference(y, reference_batch_norm(x, None, None, training=True))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 5), (3, 7, 4, 6), (1, 5, 2, 2, 3), (4, 1, 2)], ids=str)
def test_instance_norm(shape, dtype, device):
    stat_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    for dist in DISTS:
        x = make_input(shape, dist, dtype, device, contiguous=dist != "rand")
        w, b = make_affine(shape[1], dtype, device)
        rm = torch.randn(shape[1], dtype=stat_dtype, device=device)
        rv = torch.rand(shape[1], dtype=stat_dtype, device=device) + 0.5
        rm64, rv64 = rm.double(), rv.double()
        y = fastnorm.instance_norm(x, rm, rv, w, b, momentum=0.2)
        # float64 planes of 2 at x + 1000 can have rstd in the hundreds: the kernel's mean, rounded once in
        # float64, then costs ulps of x times that (the reference's centered mean does not)
        dims = list(range(2, x.dim()))
        rstd = (x.double().var(dims, unbiased=False) + 1e-5).rsqrt().max().item()
        terms = x.abs().max().item() * rstd * w.abs().max().item() if dtype == torch.float64 else 0.0
        assert_matches_reference(y, reference_instance_norm(x, rm64, rv64, w, b, momentum=0.2), input_terms=terms)
        assert_matches_reference(rm, rm64, torch.float32)
        assert_matches_reference(rv, rv64, torch.float32)
    x = make_input(shape, "randn", dtype, device)
    assert_matches_reference(fastnorm.instance_norm(x), reference_instance_norm(x))
    y = fastnorm.instance_norm(x, rm, rv, w, b, use_input_stats=False)
    assert_matches_reference(y, reference_instance_norm(x, rm64, rv64, w, b, use_input_stats=False))


def test_running_statistics_in_low_precision_buffers():
    """bf16 buffers (a model cast with .bfloat16()) are updated in their own dtype, as torch does."""
    x = torch.randn(8, 4, 6).bfloat16()
    rm, rv = torch.zeros(4, dtype=torch.bfloat16), torch.ones(4, dtype=torch.bfloat16)
    rm_ref, rv_ref = rm.clone(), rv.clone()
    fastnorm.batch_norm(x, rm, rv, training=True)
    F.batch_norm(x, rm_ref, rv_ref, training=True)
    assert rm.dtype == torch.bfloat16
    torch.testing.assert_close(rm, rm_ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(rv, rv_ref, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_large_and_tiny_reductions(dtype, device):
    x = make_input((2, 4, 256, 257), "offset1000", dtype, device)
    w, b = make_affine(4, dtype, device)
    assert_matches_reference(fastnorm.group_norm(x, 1, w, b), reference_group_norm(x, 1, w, b))
    y = fastnorm.batch_norm(x, None, None, w, b, training=True)
    assert_matches_reference(y, reference_batch_norm(x, None, None, w, b, training=True))
    assert_matches_reference(fastnorm.normalize(x, dim=None, eps=0.0), x.double() / x.double().norm())
    tiny = make_input((2, 3, 1), "randn", dtype, device)  # group / batch of 2 values, instance of 1
    assert_matches_reference(fastnorm.group_norm(tiny, 3), reference_group_norm(tiny, 3))
    y = fastnorm.batch_norm(tiny, None, None, training=True)
    assert_matches_reference(y, reference_batch_norm(tiny, None, None, training=True))


def reference_normalize(x, p, dim, eps, mean):
    xd = x.double()
    if not mean:
        return F.normalize(xd, p, dim, eps)
    dims = tuple(range(x.dim())) if dim is None else dim
    norm = xd.abs().mean(dims, keepdim=True) if p == 1 else xd.pow(2).mean(dims, keepdim=True).sqrt()
    return xd / norm.clamp_min(eps)


NORMALIZE_CASES = [((4, 9), 1), ((3, 5, 7), 1), ((3, 5, 7), -1), ((3, 5, 7), 0), ((2, 3, 4, 5), (1, 2)),
                   ((2, 3, 4, 5), (2, 3)), ((2, 3, 4, 5), (0, 1, 2, 3)), ((6, 11), None), ((1000, 3), 1),
                   ((3, 4097), 1)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,dim", NORMALIZE_CASES, ids=str)
def test_normalize(shape, dim, dtype, device):
    for dist in DISTS:
        x = make_input(shape, dist, dtype, device, contiguous=dist != "randn")
        for p in (1, 2.0):
            for mean in (False, True):
                y = fastnorm.normalize(x, p, dim, mean=mean)
                assert y.dtype == dtype
                assert_matches_reference(y, reference_normalize(x, p, dim, 1e-12, mean))


@pytest.mark.parametrize("p", [1, 2])
def test_normalize_eps(p):
    """Rows whose norm is below eps are divided by eps; eps=0 is the plain division (KernelBench's
    x / torch.norm(x, p, dim=1, keepdim=True))."""
    x = torch.randn(6, 10) * torch.tensor([1e-3, 1e-6, 1.0, 5.0, 0.0, 1e-2])[:, None]
    assert_matches_reference(fastnorm.normalize(x, p, eps=1e-2), F.normalize(x.double(), p, eps=1e-2))
    y = fastnorm.normalize(x[:4], p, eps=0.0)
    assert_matches_reference(y, x[:4].double() / torch.norm(x[:4].double(), p=p, dim=1, keepdim=True))
    assert fastnorm.normalize(x, p, eps=0.0)[4].isnan().all()  # 0 / 0, like torch


def test_normalize_other_p_falls_back_to_torch():
    x = torch.randn(4, 6)
    torch.testing.assert_close(fastnorm.normalize(x, 3.0, 0), F.normalize(x, 3.0, 0))
    torch.testing.assert_close(fastnorm.normalize(x, float("inf")), F.normalize(x, float("inf")))
    with pytest.raises(ValueError, match="mean=True needs p=1 or p=2"):
        fastnorm.normalize(x, 3.0, mean=True)


def test_empty_input():
    assert fastnorm.group_norm(torch.randn(0, 4, 3), 2).shape == (0, 4, 3)
    rm, rv = torch.zeros(3), torch.ones(3)
    assert fastnorm.batch_norm(torch.randn(0, 3, 2), rm, rv, training=True).shape == (0, 3, 2)
    assert torch.equal(rm, torch.zeros(3)) and torch.equal(rv, torch.ones(3))  # untouched, as torch
    assert fastnorm.normalize(torch.randn(0, 5)).shape == (0, 5)


# ---- gradients ---------------------------------------------------------------------------------------

def _double(*shapes):
    return [torch.randn(s, dtype=torch.float64, requires_grad=True) for s in shapes]


_MEAN64, _VAR64 = torch.linspace(-1, 1, 4, dtype=torch.float64), torch.linspace(0.5, 2, 4, dtype=torch.float64)


GRADCHECK_CASES = {
    "group_norm": lambda: (lambda x, w, b: fastnorm.group_norm(x, 3, w, b), _double((2, 6, 5), 6, 6)),
    "group_norm_4d": lambda: (lambda x: fastnorm.group_norm(x, 2), _double((2, 4, 3, 2))),
    "instance_norm": lambda: (lambda x, w, b: fastnorm.instance_norm(x, weight=w, bias=b), _double((2, 3, 4), 3, 3)),
    "instance_norm_eval": lambda: (lambda x, w: fastnorm.instance_norm(x, _MEAN64, _VAR64, w, use_input_stats=False),
                                   _double((2, 4, 3), 4)),
    "batch_norm_train": lambda: (lambda x, w, b: fastnorm.batch_norm(x, None, None, w, b, training=True),
                                 _double((3, 4, 5), 4, 4)),
    "batch_norm_train_2d": lambda: (lambda x, b: fastnorm.batch_norm(x, None, None, None, b, training=True),
                                    _double((5, 3), 3)),
    "batch_norm_eval": lambda: (lambda x, w, b: fastnorm.batch_norm(x, _MEAN64, _VAR64, w, b),
                                _double((3, 4, 2, 3), 4, 4)),
    "normalize_l2": lambda: (lambda x: fastnorm.normalize(x), _double((3, 5, 2))),
    "normalize_l1": lambda: (lambda x: fastnorm.normalize(x, 1, (1, 2)), _double((3, 5, 2))),
    "normalize_l2_mean": lambda: (lambda x: fastnorm.normalize(x, 2, -1, mean=True), _double((4, 6))),
    "normalize_l1_mean": lambda: (lambda x: fastnorm.normalize(x, 1, None, mean=True), _double((4, 6))),
    # the norm of rows scaled by 1e-3 is below eps: those rows are x / eps, others x / norm
    "normalize_eps_clamp": lambda: (lambda x: fastnorm.normalize(x * torch.tensor([[1e-3], [1.0], [1e-3]],
                                                                                  dtype=torch.float64), 2, 1, 1e-2),
                                    _double((3, 5))),
    "normalize_l1_eps_clamp": lambda: (lambda x: fastnorm.normalize(x * torch.tensor([[1e-3], [1.0]],
                                                                                     dtype=torch.float64), 1, 1, 1e-2),
                                       _double((2, 5))),
}


@pytest.mark.parametrize("case", list(GRADCHECK_CASES))
def test_gradcheck(case):
    fn, inputs = GRADCHECK_CASES[case]()
    assert torch.autograd.gradcheck(fn, inputs)


# Planes of 32+ elements: the fused backward kernels (C++ on the CPU, CUDA), not ATen's or torch ops.
FUSED_BACKWARD_CASES = {
    "group_norm": lambda x, w, b: fastnorm.group_norm(x, 2, w, b),
    "group_norm_silu": lambda x, w, b: fastnorm.group_norm(x, 2, w, b, activation="silu"),
    "instance_norm": lambda x, w, b: fastnorm.instance_norm(x, weight=w, bias=b),
    "batch_norm_train": lambda x, w, b: fastnorm.batch_norm(x, None, None, w, b, training=True),
    "batch_norm_eval": lambda x, w, b: fastnorm.batch_norm(x, _MEAN64.to(x.device), _VAR64.to(x.device), w, b),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(FUSED_BACKWARD_CASES))
def test_gradcheck_fused_backward(case, device):
    x = torch.randn(2, 4, 40, dtype=torch.float64, device=device, requires_grad=True)
    w, b = (torch.randn(4, dtype=torch.float64, device=device, requires_grad=True) for _ in range(2))
    assert torch.autograd.gradcheck(FUSED_BACKWARD_CASES[case], (x, w, b))


def test_family_backward_rejects_bad_arguments():
    ext = family_ops.kernels("cpu")
    if not hasattr(ext, "family_backward"):
        pytest.skip("the stand-in kernels have no family_backward")
    x = torch.randn(2, 4, 64)
    mean, var = torch.zeros(2, 2), torch.ones(2, 2)
    call = lambda *a: ext.family_backward(*a, 1e-5, 0, 0, True, False, False)  # noqa: E731
    with pytest.raises(RuntimeError, match=r"dy has shape \[1, 4, 64\], x \[2, 4, 64\]"):
        call(x[:1], x, None, None, mean, var, 2)
    with pytest.raises(RuntimeError, match="mean and var need 4 values, got 2 and 2"):
        call(x, x, None, None, mean[:1], var[:1], 2)
    with pytest.raises(RuntimeError, match="3 groups do not divide 4 channels"):
        call(x, x, None, None, mean, var, 3)
    with pytest.raises(RuntimeError, match="mean and var on meta"):
        call(x, x, None, None, mean.to("meta"), var, 2)


def test_cpu_backward_does_not_depend_on_the_thread_count():
    x = torch.randn(4, 8, 3000, requires_grad=True)
    w = torch.rand(8, requires_grad=True)
    dy = torch.randn_like(x)
    runs, before = [], torch.get_num_threads()
    try:
        for threads in (1, max(2, before)):
            torch.set_num_threads(threads)
            runs.append(torch.autograd.grad(fastnorm.group_norm(x, 4, w, w, activation="silu"), (x, w), dy))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


# The statistics' own gradient matters here: the first backward must be a function of x through them.
GRADGRADCHECK_CASES = ("group_norm", "group_norm_4d", "instance_norm", "instance_norm_eval", "batch_norm_train",
                       "batch_norm_eval")


@pytest.mark.parametrize("case", GRADGRADCHECK_CASES)
def test_gradgradcheck(case):
    fn, inputs = GRADCHECK_CASES[case]()
    assert torch.autograd.gradgradcheck(fn, inputs)


def _grads(fn, x, w, b, dy):
    leaves = [t.detach().requires_grad_() for t in (x, w, b)]
    fn(*leaves).backward(dy)
    return [t.grad for t in leaves]


GRAD_FUNCTIONS = {
    "group_norm": (lambda x, w, b: fastnorm.group_norm(x, 3, w, b), lambda x, w, b: F.group_norm(x, 3, w, b)),
    "instance_norm": (lambda x, w, b: fastnorm.instance_norm(x, weight=w, bias=b),
                      lambda x, w, b: F.instance_norm(x, weight=w, bias=b)),
    # without parameters: the LayerNorm kernels and their fused backward take these
    "group_norm_no_params": (lambda x, w, b: fastnorm.group_norm(x, 3) * w[:, None, None] + b[:, None, None],
                             lambda x, w, b: F.group_norm(x, 3) * w[:, None, None] + b[:, None, None]),
    "instance_norm_no_params": (lambda x, w, b: fastnorm.instance_norm(x) * w[:, None, None] + b[:, None, None],
                                lambda x, w, b: F.instance_norm(x) * w[:, None, None] + b[:, None, None]),
    "batch_norm_train": (lambda x, w, b: fastnorm.batch_norm(x, None, None, w, b, True),
                         lambda x, w, b: F.batch_norm(x, None, None, w, b, True)),
    "batch_norm_eval": (lambda x, w, b: fastnorm.batch_norm(x, torch.ones(6, device=x.device) * 0.3,
                                                            torch.ones(6, device=x.device) * 2, w, b),
                        lambda x, w, b: F.batch_norm(x, torch.ones(6, dtype=x.dtype, device=x.device) * 0.3,
                                                     torch.ones(6, dtype=x.dtype, device=x.device) * 2, w, b)),
    "normalize": (lambda x, w, b: fastnorm.normalize(x, 2, (2, 3)) * w[:, None, None] + b[:, None, None],
                  lambda x, w, b: F.normalize(x, 2, (2, 3)) * w[:, None, None] + b[:, None, None]),
    "normalize_l1_mean": (lambda x, w, b: fastnorm.normalize(x, 1, 1, mean=True) * w[:, None, None] + b[:, None, None],
                          lambda x, w, b: x / x.abs().mean(1, keepdim=True) * w[:, None, None] + b[:, None, None]),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(GRAD_FUNCTIONS))
def test_gradients_against_float64(name, dtype, device):
    ours, theirs = GRAD_FUNCTIONS[name]
    for dist in ("randn", "rand"):
        x = make_input((4, 6, 5, 7), dist, dtype, device, contiguous=dist == "randn")
        w, b = make_affine(6, dtype, device)
        dy = torch.randn(x.shape, device=device).to(dtype)
        got = _grads(ours, x, w, b, dy)
        assert [g.dtype for g in got] == [dtype] * 3
        assert_grads_close(got, _grads(theirs, x.double(), w.double(), b.double(), dy.double()), dtype)


def test_statistics_carry_no_gradient():
    x = torch.randn(4, 3, 5, requires_grad=True)
    y, mean, var = torch.ops.fastnorm.batch_norm(x, None, None, 1e-5)
    assert y.requires_grad and not mean.requires_grad and not var.requires_grad
    rm = torch.zeros(3)
    fastnorm.batch_norm(x, rm, torch.ones(3), training=True)
    assert not rm.requires_grad


# ---- custom ops: opcheck, torch.compile --------------------------------------------------------------

OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def _op_samples():
    g = dict(requires_grad=True)
    yield "group_norm", (torch.randn(2, 6, 5, **g), torch.randn(6, **g), torch.randn(6, **g), 3, 1e-5)
    yield "group_norm", (torch.randn(3, 4).bfloat16(), None, torch.randn(4), 4, 1e-5)
    yield "batch_norm", (torch.randn(4, 3, 2, 2, **g), torch.randn(3, **g), None, 1e-5)
    yield "batch_norm", (torch.randn(5, 3, dtype=torch.float64, **g), None, None, 1e-3)
    yield "batch_norm_eval", (torch.randn(4, 3, 7, **g), torch.randn(3, **g), torch.randn(3, **g), torch.randn(3),
                              torch.rand(3) + 0.5, 1e-5)
    yield "p_normalize", (torch.randn(3, 4, 5, **g), 2.0, 1, 3, 1e-12, False)
    yield "p_normalize", (torch.randn(8, 6).t(), 1.0, 1, 2, 1e-12, True)  # non-contiguous


@pytest.mark.skipif(not hasattr(torch.library, "opcheck"), reason="torch.library.opcheck: torch >= 2.4")
def test_opcheck():
    for name, args in _op_samples():
        torch.library.opcheck(getattr(torch.ops.fastnorm, name), args, test_utils=OPCHECK_TESTS)


def _family_step(x, rm, rv, w):
    y = fastnorm.batch_norm(x, rm, rv, w, None, training=True)
    y = fastnorm.group_norm(y, 2, w) + fastnorm.instance_norm(x, weight=w)
    return fastnorm.normalize(y, 1, (2, 3)) + fastnorm.normalize(y, mean=True)


def test_compile_fullgraph():
    """aot_eager traces forward and backward through the fake functions and autograd formulas (as
    inductor would, without its C++ compile time); in-place running statistics included."""
    torch._dynamo.reset()
    compiled = torch.compile(_family_step, fullgraph=True, backend="aot_eager")
    x, w = torch.randn(3, 4, 5, 6), torch.rand(4, requires_grad=True)
    stats, stats_ref = (torch.zeros(4), torch.ones(4)), (torch.zeros(4), torch.ones(4))
    out = compiled(x, *stats, w)
    out.sum().backward()
    grad, w.grad = w.grad, None
    expected = _family_step(x, *stats_ref, w)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(grad, w.grad)
    for got, want in zip(stats, stats_ref):
        torch.testing.assert_close(got, want)
        assert not torch.equal(got, torch.zeros(4)) and not torch.equal(got, torch.ones(4))


# ---- bad input -----------------------------------------------------------------------------------------

X = torch.randn(2, 6, 4)
BAD_CALLS = [
    (lambda: fastnorm.group_norm(X, 4), ValueError, "num_groups=4 must be positive and divide the 6 channels"),
    (lambda: fastnorm.group_norm(X, 0), ValueError, "num_groups=0"),
    (lambda: fastnorm.group_norm(X, 2.0), TypeError, "num_groups must be an int"),
    (lambda: fastnorm.group_norm(X, 3, torch.ones(4)), ValueError, r"weight has shape \[4\], expected \[6\]"),
    (lambda: fastnorm.group_norm(X, 3, None, torch.ones(6, 1)), ValueError, "bias has shape"),
    (lambda: fastnorm.group_norm(torch.randn(6), 3), ValueError, r"expected input of shape \(N, C, \*spatial\)"),
    (lambda: fastnorm.group_norm(X.int(), 3), TypeError, "dtype torch.int32 is not supported"),
    (lambda: fastnorm.group_norm(X.numpy(), 3), TypeError, "expected a torch.Tensor"),
    (lambda: fastnorm.group_norm(torch.randn(1, 2), 2), ValueError, "more than 1 value per channel"),
    (lambda: fastnorm.batch_norm(X, torch.zeros(5), torch.ones(6)), ValueError, "running_mean has shape"),
    (lambda: fastnorm.batch_norm(X, None, None), ValueError, "running_mean and running_var must be given"),
    (lambda: fastnorm.batch_norm(torch.randn(1, 6), None, None, training=True), ValueError,
     "more than 1 value per channel when training"),
    (lambda: fastnorm.batch_norm(X, None, None, training=True, eps=0.0), ValueError, "eps must be positive"),
    (lambda: fastnorm.batch_norm(X, torch.zeros(6), torch.ones(6), eps=-1.0), ValueError, "non-negative"),
    (lambda: fastnorm.batch_norm(X, torch.zeros(6).long(), torch.ones(6)), TypeError, "running_mean dtype"),
    (lambda: fastnorm.batch_norm(X, None, None, torch.ones(6, device="meta"), training=True), ValueError,
     "weight is on meta"),
    (lambda: fastnorm.instance_norm(torch.randn(2, 6, 1)), ValueError, "more than 1 spatial element"),
    (lambda: fastnorm.instance_norm(X, use_input_stats=False), ValueError, "must be given with use_input_stats"),
    (lambda: fastnorm.normalize(X, 2, 3), IndexError, "dim 3 is out of range"),
    (lambda: fastnorm.normalize(torch.randn(2, 3, 4, 5), 2, (1, 3)), ValueError, "consecutive"),
    (lambda: fastnorm.normalize(X.long(), 1), TypeError, "not supported"),
]


@pytest.mark.parametrize("call,error,message", BAD_CALLS, ids=[m for _, _, m in BAD_CALLS])
def test_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_backward_gets_no_zero_gradients_for_the_statistics():
    """mean / var (GroupNorm, BatchNorm) and lse / valid (cross_entropy) take no gradient: autograd passes
    None for them instead of allocating and filling zero tensors on every step."""
    import fastnorm
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    w, b = torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
    logits, target = torch.randn(6, 10, requires_grad=True), torch.randint(0, 10, (6,))
    steps = {"group_norm": lambda: fastnorm.group_norm(x, 4, w, b),
             "batch_norm": lambda: fastnorm.batch_norm(x, None, None, w, b, training=True),
             "cross_entropy": lambda: fastnorm.cross_entropy(logits, target)}
    for name, step in steps.items():
        out = step()
        grad_out = torch.randn_like(out)
        leaves = [logits] if name == "cross_entropy" else [x, w, b]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            grads = torch.autograd.grad(out, leaves, grad_out)
        assert all(g is not None for g in grads)
        # autograd materializes a missing gradient with aten::zeros (the kernels' own buffers use other calls)
        assert not [e for e in prof.key_averages() if e.key == "aten::zeros"], name
