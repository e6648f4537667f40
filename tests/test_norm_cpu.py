"""fastnorm.layer_norm / rms_norm on CPU against PyTorch's own, computed in float64."""
import pytest
import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.ops.validate import default_rms_eps
from conftest import assert_matches_reference, reference_layer_norm, reference_rms_norm, rms_norm_definition

DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def make_input(shape, dist, dtype):
    if dist == "randn":
        x = torch.randn(shape, dtype=torch.float64)
    elif dist == "rand":
        x = torch.rand(shape, dtype=torch.float64)
    else:  # a large common offset: naive E[x^2] - E[x]^2 variance loses everything here
        x = torch.randn(shape, dtype=torch.float64) + 1000
    return x.to(dtype)


def make_affine(shape, dtype, weight: bool, bias: bool):
    w = torch.randn(shape, dtype=dtype) if weight else None
    b = torch.randn(shape, dtype=dtype) if bias else None
    return w, b


# (input shape, normalized_shape): ranks 1..5, normalized over 1..3 trailing dims, odd sizes.
TRAILING_CASES = [
    ((1,), (1,)),
    ((3,), (3,)),
    ((7,), (7,)),
    ((5, 1023), (1023,)),
    ((3, 4097), (4097,)),
    ((4, 1), (1,)),
    ((2, 3, 4, 5), (4, 5)),
    ((2, 3, 4, 5), (3, 4, 5)),
    ((2, 1, 3, 2, 9), (2, 9)),
]
AFFINE = [(False, False), (True, False), (False, True), (True, True)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dist", ["randn", "rand", "offset1000"])
@pytest.mark.parametrize("shape,normalized_shape", TRAILING_CASES, ids=str)
@pytest.mark.parametrize("weight,bias", AFFINE, ids=["plain", "w", "b", "wb"])
def test_layer_norm_trailing(shape, normalized_shape, dist, dtype, weight, bias):
    x = make_input(shape, dist, dtype)
    w, b = make_affine(normalized_shape, dtype, weight, bias)
    y = fastnorm.layer_norm(x, normalized_shape, w, b, 1e-5)
    assert y.dtype == dtype
    assert_matches_reference(y, reference_layer_norm(x, normalized_shape, w, b, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dist", ["randn", "rand", "offset1000"])
@pytest.mark.parametrize("shape,normalized_shape", TRAILING_CASES, ids=str)
@pytest.mark.parametrize("weight", [False, True], ids=["plain", "w"])
def test_rms_norm_trailing(shape, normalized_shape, dist, dtype, weight):
    x = make_input(shape, dist, dtype)
    w, _ = make_affine(normalized_shape, dtype, weight, False)
    y = fastnorm.rms_norm(x, normalized_shape, w, 1e-6)
    assert y.dtype == dtype
    assert_matches_reference(y, reference_rms_norm(x, normalized_shape, w, 1e-6))


@pytest.mark.parametrize("dist", ["randn", "offset1000"])
@pytest.mark.parametrize("shape", [(1, 2**20), (3, 2**16 + 1), (4096, 33), (20000, 3)], ids=str)
def test_long_rows_and_many_rows(shape, dist):
    x = make_input(shape, dist, torch.float32)
    w, b = make_affine(shape[-1:], torch.float32, True, True)
    assert_matches_reference(fastnorm.layer_norm(x, shape[-1:], w, b), reference_layer_norm(x, shape[-1:], w, b))
    assert_matches_reference(fastnorm.rms_norm(x, shape[-1:], w), reference_rms_norm(x, shape[-1:], w))


def test_long_row_half_precision():
    x = make_input((2, 2**18 + 3), "offset1000", torch.bfloat16)
    assert_matches_reference(fastnorm.layer_norm(x, x.shape[-1:]), reference_layer_norm(x, x.shape[-1:]))
    x = make_input((2, 2**18 + 3), "randn", torch.float16)
    assert_matches_reference(fastnorm.rms_norm(x, x.shape[-1:]), reference_rms_norm(x, x.shape[-1:]))


def _non_contiguous_input(name, offset):
    def r(*shape):
        return torch.randn(*shape) + offset

    views = {
        "transposed": lambda: r(33, 17).t(),
        "sliced_rows": lambda: r(12, 33)[::2],
        "sliced_cols": lambda: r(8, 66)[:, ::2],
        "narrowed": lambda: r(5, 40)[:, 3:36],
        "expanded": lambda: r(1, 33).expand(7, 33),
        "expanded_inner": lambda: r(5, 1).expand(5, 33),
        "permuted": lambda: r(6, 10, 9).permute(1, 0, 2),
        "offset_storage": lambda: r(100)[7:73].view(2, 33),
    }
    return views[name]()


@pytest.mark.parametrize("name", ["transposed", "sliced_rows", "sliced_cols", "narrowed", "expanded",
                                  "expanded_inner", "permuted", "offset_storage"])
@pytest.mark.parametrize("offset", [0, 1000])
def test_non_contiguous_input(name, offset):
    x = _non_contiguous_input(name, offset)
    assert not x.is_contiguous() or x.storage_offset() > 0
    ns = x.shape[-1:]
    w, b = make_affine(ns, torch.float32, True, True)
    assert_matches_reference(fastnorm.layer_norm(x, ns, w, b), reference_layer_norm(x, ns, w, b))
    assert_matches_reference(fastnorm.rms_norm(x, ns, w), reference_rms_norm(x, ns, w))
    assert_matches_reference(fastnorm.layer_norm(x, dim=0), reference_layer_norm(x, dim=0))


def test_input_is_not_modified():
    x = torch.randn(9, 31)
    before = x.clone()
    fastnorm.layer_norm(x, (31,))
    fastnorm.rms_norm(x, dim=0)
    assert torch.equal(x, before)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("dist", ["randn", "offset1000"])
@pytest.mark.parametrize("shape", [(2, 16, 5, 7), (1, 3, 1, 1), (3, 64, 8, 8), (2, 1, 4, 4), (2, 300, 2, 3)], ids=str)
def test_channel_axis(shape, dist, dtype):
    """dim=1 on NCHW: weight/bias of shape (C,), each (n, h, w) normalized over its C channels."""
    x = make_input(shape, dist, dtype)
    w, b = make_affine(shape[1:2], dtype, True, True)
    y = fastnorm.rms_norm(x, weight=w, eps=1e-5, dim=1)
    assert y.dtype == dtype and y.shape == x.shape
    assert_matches_reference(y, reference_rms_norm(x, None, w, 1e-5, dim=1))
    y = fastnorm.layer_norm(x, None, w, b, 1e-5, dim=1)
    assert_matches_reference(y, reference_layer_norm(x, None, w, b, 1e-5, dim=1))
    assert_matches_reference(fastnorm.rms_norm(x, eps=1e-5, dim=1), reference_rms_norm(x, None, None, 1e-5, dim=1))


@pytest.mark.parametrize("dim", [1, -3, (1, 2), (0,), (2, 3), -1])
def test_other_dims(dim):
    x = make_input((3, 6, 5, 4), "randn", torch.float32)
    dims = (dim,) if isinstance(dim, int) else dim
    shape = tuple(x.shape[d] for d in sorted(d % x.dim() for d in dims))
    w, b = make_affine(shape, torch.float32, True, True)
    assert_matches_reference(fastnorm.layer_norm(x, shape, w, b, dim=dim), reference_layer_norm(x, None, w, b, dim=dim))
    assert_matches_reference(fastnorm.rms_norm(x, shape, w, dim=dim), reference_rms_norm(x, None, w, dim=dim))


def test_channel_axis_non_contiguous():
    x = torch.randn(2, 8, 5, 6).contiguous(memory_format=torch.channels_last)
    w = torch.randn(8)
    assert_matches_reference(fastnorm.rms_norm(x, weight=w, dim=1), reference_rms_norm(x, None, w, dim=1))
    x = torch.randn(2, 16, 5, 6)[:, ::2]
    assert_matches_reference(fastnorm.layer_norm(x, dim=1), reference_layer_norm(x, dim=1))


def test_dim_equals_trailing_normalized_shape():
    x = torch.randn(4, 6, 10)
    assert torch.allclose(fastnorm.layer_norm(x, dim=-1), fastnorm.layer_norm(x, (10,)), rtol=0, atol=0)
    assert torch.allclose(fastnorm.rms_norm(x, dim=(1, 2)), fastnorm.rms_norm(x, (6, 10)), rtol=0, atol=0)


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_float32_weight_with_half_input(x_dtype):
    """Mixed precision as in autocast models: fp32 parameters, half input; output keeps the input dtype."""
    x = make_input((6, 129), "randn", x_dtype)
    w, b = make_affine((129,), torch.float32, True, True)
    y = fastnorm.layer_norm(x, (129,), w, b)
    assert y.dtype == x_dtype
    assert_matches_reference(y, reference_layer_norm(x, (129,), w, b))
    y = fastnorm.rms_norm(x, (129,), w)
    assert y.dtype == x_dtype
    assert_matches_reference(y, reference_rms_norm(x, (129,), w))
    xc = make_input((2, 12, 3, 5), "randn", x_dtype)
    wc = torch.randn(12)
    y = fastnorm.rms_norm(xc, weight=wc, dim=1)
    assert y.dtype == x_dtype
    assert_matches_reference(y, reference_rms_norm(xc, None, wc, dim=1))


@pytest.mark.parametrize("shape,ns", [((0, 8), (8,)), ((2, 0, 3), (3,)), ((4, 0), (0,)), ((0,), (0,)),
                                      ((3, 0, 2), (0, 2))], ids=str)
def test_empty_tensors_like_pytorch(shape, ns):
    x = torch.randn(shape)
    w = torch.randn(ns)
    for ours, theirs in [
        (fastnorm.layer_norm(x, ns, w, w), torch.nn.functional.layer_norm(x, ns, w, w)),
        (fastnorm.rms_norm(x, ns, w), rms_norm_definition(x, ns, w)),
    ]:
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype


@pytest.mark.parametrize("shape,dim", [((0, 3, 4, 4), 1), ((2, 0, 4, 4), 1), ((2, 3, 0, 4), 1)], ids=str)
def test_empty_tensors_channel_axis(shape, dim):
    x = torch.randn(shape)
    assert fastnorm.rms_norm(x, dim=dim).shape == x.shape
    assert fastnorm.layer_norm(x, dim=dim).shape == x.shape


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_rms_norm_default_eps_is_torchs(dtype):
    """eps None: the epsilon of the accumulator type (float32's for the half types), which is what
    F.rms_norm's kernels take, not the finfo(x.dtype).eps its documentation names."""
    # Mean square near eps, so the result depends visibly on it.
    scale = 1e-9 if dtype == torch.float64 else 3e-4
    x = (torch.randn(5, 64, dtype=torch.float64) * scale).to(dtype)
    y = fastnorm.rms_norm(x, (64,))
    assert_matches_reference(y, reference_rms_norm(x, (64,), None, torch.finfo(torch.float32 if dtype != torch.float64
                                                                                else torch.float64).eps))
    if hasattr(F, "rms_norm"):
        assert_matches_reference(y, F.rms_norm(x.double(), (64,), eps=default_rms_eps(dtype)))
        assert_matches_reference(F.rms_norm(x, (64,)), F.rms_norm(x.double(), (64,), eps=default_rms_eps(dtype)))
    assert_matches_reference(fastnorm.rms_norm(x, (64,), eps=None), reference_rms_norm(x, (64,), None, None))
    assert not torch.allclose(y.double(), reference_rms_norm(x, (64,), None, 0.0), rtol=0.05)


def test_eps_is_used():
    x = torch.randn(4, 16) * 0.1
    for eps in (1e-5, 0.1, 1.0):
        assert_matches_reference(fastnorm.layer_norm(x, (16,), eps=eps), reference_layer_norm(x, (16,), eps=eps))
        assert_matches_reference(fastnorm.rms_norm(x, (16,), eps=eps), reference_rms_norm(x, (16,), eps=eps))


def test_constant_rows_give_bias():
    x = torch.full((3, 50), 7.25)
    b = torch.randn(50)
    y = fastnorm.layer_norm(x, (50,), None, b)
    assert torch.equal(y, b.expand(3, 50))


def test_nan_and_inf_rows_like_pytorch():
    x = torch.randn(4, 10)
    x[0, 3] = float("nan")
    x[1, 2] = float("inf")
    y = fastnorm.layer_norm(x, (10,))
    ref = torch.nn.functional.layer_norm(x, (10,))
    assert y[0].isnan().all() and y[1].isnan().all() and ref[1].isnan().all()
    assert_matches_reference(y[2:], reference_layer_norm(x[2:], (10,)))
    y = fastnorm.rms_norm(x, (10,))
    assert y[0].isnan().all()
    assert_matches_reference(y[2:], reference_rms_norm(x[2:], (10,)))


def test_result_does_not_depend_on_thread_count():
    x = torch.randn(3, 2**17 + 5) + 10
    xc = torch.randn(4, 40, 33, 17)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = (fastnorm.layer_norm(x, x.shape[-1:]), fastnorm.rms_norm(xc, dim=1))
        torch.set_num_threads(max(2, threads))
        many = (fastnorm.layer_norm(x, x.shape[-1:]), fastnorm.rms_norm(xc, dim=1))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


def test_output_is_a_new_contiguous_tensor():
    x = torch.randn(5, 8, 3).transpose(0, 1)
    y = fastnorm.layer_norm(x, (3,))
    assert y.shape == x.shape and y.is_contiguous() and y.data_ptr() != x.data_ptr()
