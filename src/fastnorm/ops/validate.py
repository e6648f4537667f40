"""Argument checks run before any kernel: bad input gets a clear Python exception, never a crash."""
import numbers

import torch

from fastnorm.ops.norm_ops import accumulator_dtype

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _as_shape(normalized_shape) -> tuple:
    if type(normalized_shape) is int:  # exact-type fast paths first: this runs on every call
        return (normalized_shape,)
    if type(normalized_shape) in (tuple, list, torch.Size) and all(type(s) is int for s in normalized_shape):
        return tuple(normalized_shape)
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        return (int(normalized_shape),)
    if isinstance(normalized_shape, (str, bytes)) or not hasattr(normalized_shape, "__iter__"):
        raise TypeError(f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    shape = tuple(normalized_shape)
    if not all(isinstance(s, numbers.Integral) and not isinstance(s, bool) for s in shape):
        raise TypeError(f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    return tuple(int(s) for s in shape)


def default_rms_eps(dtype: torch.dtype) -> float:
    """RMSNorm's eps when none is given: the epsilon of the type PyTorch computes in, float32's for the half
    types too. F.rms_norm's documentation says torch.finfo(x.dtype).eps, but its kernels (torch 2.4-2.13)
    take their accumulator type's: 1.2e-7 for bfloat16, not 0.0078, which moves rows of rms near 0.1 by 6%."""
    return torch.finfo(accumulator_dtype(dtype)).eps


def check_input(x, op: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"fastnorm.{op}: expected a torch.Tensor input, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"fastnorm.{op}: input dtype {x.dtype} is not supported "
                        "(float32, float16, bfloat16 or float64)")


def norm_dims(x: torch.Tensor, normalized_shape, dim, op: str):
    """The dims [begin, end) to normalize over, from `normalized_shape` (trailing) or `dim`."""
    check_input(x, op)
    if dim is None:
        if normalized_shape is None:
            raise ValueError(f"fastnorm.{op}: give normalized_shape (trailing dims) or dim")
        shape = _as_shape(normalized_shape)
        nd, k = x.dim(), len(shape)
        if k == 0 or k > nd or x.shape[nd - k:] != shape:
            raise ValueError(f"fastnorm.{op}: given normalized_shape={list(shape)}, expected input with "
                             f"shape [*, {', '.join(map(str, shape))}], but got input of size {list(x.shape)}")
        return nd - k, nd
    dims = (dim,) if isinstance(dim, numbers.Integral) else tuple(dim)
    if not dims or x.dim() == 0:
        raise ValueError(f"fastnorm.{op}: dim={dim!r} is empty or the input is a scalar")
    resolved = []
    for d in dims:
        if not isinstance(d, numbers.Integral) or not -x.dim() <= d < x.dim():
            raise IndexError(f"fastnorm.{op}: dim {d!r} is out of range for a tensor of rank {x.dim()}")
        resolved.append(int(d) % x.dim())
    begin, end = min(resolved), max(resolved) + 1
    if sorted(resolved) != list(range(begin, end)):
        raise ValueError(f"fastnorm.{op}: dims {dims} must be distinct and consecutive")
    if normalized_shape is not None and _as_shape(normalized_shape) != tuple(x.shape[begin:end]):
        raise ValueError(f"fastnorm.{op}: normalized_shape={list(_as_shape(normalized_shape))} does not match "
                         f"the sizes {list(x.shape[begin:end])} of dims {dims}")
    return begin, end


def check_affine(x: torch.Tensor, begin: int, end: int, op: str, **params) -> None:
    """Weight and bias must have the normalized shape, a float dtype and x's device."""
    expected = x.shape[begin:end]
    for name, t in params.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"fastnorm.{op}: {name} must be a tensor or None, got {type(t).__name__}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"fastnorm.{op}: {name} dtype {t.dtype} is not supported")
        if t.shape != expected:
            raise ValueError(f"fastnorm.{op}: {name} has shape {list(t.shape)}, expected {list(expected)}")
        if t.device != x.device:
            raise ValueError(f"fastnorm.{op}: {name} is on {t.device} but the input is on {x.device}")


def check_residual(x: torch.Tensor, residual, residual_in_fp32: bool, op: str) -> None:
    """The residual of a fused add: a tensor like x, of x's dtype (or float32 with residual_in_fp32)."""
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"fastnorm.{op}: residual must be a torch.Tensor, got {type(residual).__name__}")
    if residual.shape != x.shape:
        raise ValueError(f"fastnorm.{op}: residual has shape {tuple(residual.shape)}, input {tuple(x.shape)}")
    if residual.device != x.device:
        raise ValueError(f"fastnorm.{op}: residual is on {residual.device}, input on {x.device}")
    allowed = {x.dtype} | ({torch.float32} if residual_in_fp32 else set())
    if residual.dtype not in allowed:
        raise TypeError(f"fastnorm.{op}: residual dtype {residual.dtype} must be the input's ({x.dtype})"
                        + (" or float32" if residual_in_fp32 else ""))


def check_channel_input(x, op: str, **params) -> None:
    """x of shape (N, C, *spatial), and per-channel tensors (weight, bias, statistics) of shape (C,)."""
    check_input(x, op)
    if x.dim() < 2:
        raise ValueError(f"fastnorm.{op}: expected input of shape (N, C, *spatial), got size {list(x.shape)}")
    check_affine(x, 1, 2, op, **params)
