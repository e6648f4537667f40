"""Bad arguments raise a clear Python exception that names the problem, before any kernel runs."""
import pytest
import torch

import fastnorm
from fastnorm.ops import extension


@pytest.fixture
def no_kernels(monkeypatch):
    """Any attempt to load (and so run) a kernel fails the test: validation must come first."""

    def forbidden(device_type):
        raise AssertionError(f"a {device_type} kernel was reached with invalid arguments")

    monkeypatch.setattr(extension, "load", forbidden)


def raises(exc, match):
    return pytest.raises(exc, match=match)


BAD_SHAPE = (ValueError, RuntimeError)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
@pytest.mark.parametrize("shape,ns", [((4, 8), (7,)), ((4, 8), (4,)), ((4, 8), (2, 4, 8)), ((2, 3, 4), (2, 4)),
                                      ((4, 8), ())], ids=str)
def test_normalized_shape_must_match_trailing_dims(no_kernels, op, shape, ns):
    with raises(BAD_SHAPE, "normalized_shape"):
        getattr(fastnorm, op)(torch.randn(shape), ns)


@pytest.mark.parametrize("op", ["layer_norm", "rms_norm"])
def test_normalized_shape_must_match_dim(no_kernels, op):
    with raises(BAD_SHAPE, "normalized_shape"):
        getattr(fastnorm, op)(torch.randn(2, 5, 3), (3,), dim=1)


@pytest.mark.parametrize("ns", [3.0, None, [[3]]], ids=str)
def test_normalized_shape_of_wrong_type(no_kernels, ns):
    with raises((TypeError, ValueError), "normalized_shape"):
        fastnorm.layer_norm(torch.randn(2, 3), ns)


# torch raises TypeError for these: a string or float elements are not a shape.
@pytest.mark.parametrize("ns", ["3", [3.5], [3.0]], ids=str)
def test_normalized_shape_of_non_int_elements(no_kernels, ns):
    with raises(TypeError, "normalized_shape"):
        fastnorm.layer_norm(torch.randn(2, 3), ns)


@pytest.mark.parametrize("wshape", [(7,), (8, 1), (1, 8), (), (2, 8)], ids=str)
def test_weight_of_wrong_shape(no_kernels, wshape):
    x = torch.randn(4, 8)
    with raises(BAD_SHAPE, "weight"):
        fastnorm.layer_norm(x, (8,), torch.randn(wshape))
    with raises(BAD_SHAPE, "weight"):
        fastnorm.rms_norm(x, (8,), torch.randn(wshape))


def test_bias_of_wrong_shape(no_kernels):
    with raises(BAD_SHAPE, "bias"):
        fastnorm.layer_norm(torch.randn(4, 8), (8,), torch.randn(8), torch.randn(9))


def test_channel_weight_of_wrong_shape(no_kernels):
    x = torch.randn(2, 6, 4, 4)
    with raises(BAD_SHAPE, "weight"):
        fastnorm.rms_norm(x, weight=torch.randn(4), dim=1)  # the last dim's size, not the channels'
    with raises(BAD_SHAPE, "bias"):
        fastnorm.layer_norm(x, None, torch.randn(6), torch.randn(6, 1, 1), dim=1)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64], ids=str)
def test_unsupported_input_dtype(no_kernels, dtype):
    x = torch.zeros(3, 4, dtype=dtype)
    with raises(TypeError, "dtype"):
        fastnorm.layer_norm(x, (4,))
    with raises(TypeError, "dtype"):
        fastnorm.rms_norm(x, dim=1)


def test_integer_weight(no_kernels):
    with raises(TypeError, "weight"):
        fastnorm.layer_norm(torch.randn(3, 4), (4,), torch.ones(4, dtype=torch.int64))


def test_non_tensor_arguments(no_kernels):
    with raises(TypeError, "Tensor"):
        fastnorm.layer_norm([[1.0, 2.0]], (2,))
    with raises(TypeError, "weight"):
        fastnorm.rms_norm(torch.randn(3, 4), (4,), [1.0] * 4)


def test_tensors_on_different_devices(no_kernels):
    x = torch.randn(3, 4)
    with raises(BAD_SHAPE, "device|meta"):
        fastnorm.layer_norm(x, (4,), torch.ones(4, device="meta"))
    with raises(BAD_SHAPE, "device|meta"):
        fastnorm.layer_norm(x, (4,), None, torch.ones(4, device="meta"))
    with raises(BAD_SHAPE, "device|meta"):
        fastnorm.rms_norm(x, (4,), torch.ones(4, device="meta"))


@pytest.mark.cuda
def test_weight_on_cpu_input_on_cuda(no_kernels):
    x = torch.randn(3, 4, device="cuda")
    with raises(BAD_SHAPE, "device|cpu|cuda"):
        fastnorm.layer_norm(x, (4,), torch.ones(4))
    with raises(BAD_SHAPE, "device|cpu|cuda"):
        fastnorm.rms_norm(x.cpu(), (4,), torch.ones(4, device="cuda"))


# torch itself raises IndexError for an out-of-range dim ("Dimension out of range"); accept it too.
@pytest.mark.parametrize("dim", [3, -4, 10, (2, 3), (1, 5)], ids=str)
def test_dim_out_of_range(no_kernels, dim):
    x = torch.randn(2, 3, 4)
    with raises((IndexError, ValueError), "dim"):
        fastnorm.rms_norm(x, dim=dim)
    with raises((IndexError, ValueError), "dim"):
        fastnorm.layer_norm(x, dim=dim)


@pytest.mark.parametrize("dim", [(0, 2), (1, 1), ()], ids=str)
def test_dims_must_be_distinct_and_consecutive(no_kernels, dim):
    with raises(ValueError, "dim"):
        fastnorm.layer_norm(torch.randn(2, 3, 4), dim=dim)


def test_neither_normalized_shape_nor_dim(no_kernels):
    with raises(ValueError, "normalized_shape|dim"):
        fastnorm.layer_norm(torch.randn(2, 3))
    with raises(ValueError, "normalized_shape|dim"):
        fastnorm.rms_norm(torch.randn(2, 3))


def test_scalar_input(no_kernels):
    with raises((ValueError, IndexError), "dim|normalized_shape|scalar"):
        fastnorm.rms_norm(torch.tensor(2.0), dim=0)
    with raises(ValueError, "normalized_shape"):
        fastnorm.layer_norm(torch.tensor(2.0), (1,))


def test_raw_op_rejects_bad_dims():
    """The custom op called directly (no Python validation) still fails cleanly, never crashes."""
    x = torch.randn(2, 3, 4)
    for begin, end in [(2, 1), (0, 4), (-1, 2), (1, 1)]:
        with raises(RuntimeError, "dims"):
            torch.ops.fastnorm.layer_norm(x, begin, end, None, None, 1e-5)
    with raises(RuntimeError, "weight|elements"):
        torch.ops.fastnorm.rms_norm(x, 2, 3, torch.ones(5), 1e-5)


def test_modules_reject_bad_input(no_kernels):
    with raises(BAD_SHAPE, "normalized_shape"):
        fastnorm.LayerNorm(8)(torch.randn(2, 7))
    with raises(BAD_SHAPE, "normalized_shape|weight"):
        fastnorm.RMSNorm(8, dim=1)(torch.randn(2, 7, 3))
