"""The normalization family's kernels in plain torch (FAMILY_CONTRACT.md), standing in for an extension
that lacks them, and the fixture that puts them in place. Tests check results against torch's own
functions in float64, never against this stand-in.

The stand-in computes in float64, about a shift (an element of each reduction), and rounds once: the
tests hold the kernels to the project's tolerances on x + 1000 inputs, which the contract's float32
version of these functions would not meet.
"""
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from fastnorm.ops import extension, family_ops

KERNEL_NAMES = ("group_norm_forward", "batch_norm_forward", "p_normalize")


def _acc(x):
    return family_ops.accumulator_dtype(x.dtype)


def _channel_shape(x):
    return (1, x.shape[1]) + (1,) * (x.dim() - 2)


def _affine(y, weight, bias, x, activation=0):
    if weight is not None:
        y = y * weight.double().reshape(_channel_shape(x))
    if bias is not None:
        y = y + bias.double().reshape(_channel_shape(x))
    if activation == 1:  # SiLU, before the one rounding, as the kernels apply it
        y = F.silu(y)
    return y.to(x.dtype).contiguous()


def _centered(a, dims, first):
    """a minus its mean over `dims`, taken about `first` (an element of each reduction): a - first is
    exact for close values, so x + 1000 keeps float64 precision, which a rounded mean near 1000 would not."""
    shifted = a - first
    return shifted - shifted.mean(dims, keepdim=True)


def group_norm_forward(x, weight, bias, groups, eps, activation=0):
    xg = x.double().reshape(x.shape[0], groups, math.prod(x.shape[1:]) // groups)  # -1 fails when empty
    centered = _centered(xg, -1, xg[..., :1])
    var = centered.pow(2).mean(-1)
    y = (centered * torch.rsqrt(var[..., None] + eps)).reshape(x.shape)
    return [_affine(y, weight, bias, x, activation), xg.mean(-1).to(_acc(x)), var.to(_acc(x))]


def batch_norm_forward(x, weight, bias, mean, var, eps):
    a, shape = x.double(), _channel_shape(x)
    if mean is None:
        dims = [0] + list(range(2, x.dim()))
        centered = _centered(a, dims, a[(slice(0, 1), slice(None)) + (slice(0, 1),) * (x.dim() - 2)])
        mean, var = a.mean(dims), centered.pow(2).mean(dims)
    else:
        centered = a - mean.double().reshape(shape)
    y = centered * torch.rsqrt(var.double().reshape(shape) + eps)
    return [_affine(y, weight, bias, x), mean.to(_acc(x)), var.to(_acc(x))]


def p_normalize(x, p, begin_dim, end_dim, eps, mean):
    if p not in (1.0, 2.0):
        raise RuntimeError(f"fastnorm: p must be 1 or 2, got {p}")
    dims = list(range(begin_dim, end_dim))
    a = x.double()
    s = a.abs().sum(dims, keepdim=True) if p == 1 else a.pow(2).sum(dims, keepdim=True)
    if mean:
        s = s / math.prod(x.shape[d] for d in dims)
    norm = s if p == 1 else s.sqrt()
    return (a / norm.clamp_min(eps)).to(x.dtype).contiguous()


STAND_IN = SimpleNamespace(group_norm_forward=group_norm_forward, batch_norm_forward=batch_norm_forward,
                           p_normalize=p_normalize)


@pytest.fixture(autouse=True)
def family_kernels(monkeypatch):
    """The family's kernels: the extension's where it has them (after the kernels are merged, the same
    tests run on them), else the stand-in. Yields a function device_type -> 'extension' / 'stand-in'."""
    chosen = {}

    def kernels(device_type):
        if device_type not in chosen:
            ext = extension.load(device_type)
            chosen[device_type] = ext if all(hasattr(ext, n) for n in KERNEL_NAMES) else STAND_IN
        return chosen[device_type]

    monkeypatch.setattr(family_ops, "kernels", kernels)
    yield lambda device_type: "stand-in" if kernels(device_type) is STAND_IN else "extension"


# ---- float64 references: torch's own functions ------------------------------------------------------

def _wide(t):
    return None if t is None else t.double()


def centered(x, dims):
    """float64 x minus its mean over `dims`: the normalizations are shift-invariant, and torch's float64
    functions subtract a rounded mean, which costs ulps of max|x| at x + 1000 (conftest._layer_norm64)."""
    xd = x.double()
    return xd - xd.mean(dims, keepdim=True)


def reference_group_norm(x, groups, weight=None, bias=None, eps=1e-5):
    xg = x.double().reshape(x.shape[0], groups, -1)
    xc = (xg - xg.mean(-1, keepdim=True)).reshape(x.shape)
    return F.group_norm(xc, groups, _wide(weight), _wide(bias), eps)


def reference_batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
                         eps=1e-5):
    """F.batch_norm in float64; running_mean / running_var (float64) are updated in place like torch's."""
    y = F.batch_norm(x.double(), running_mean, running_var, _wide(weight), _wide(bias), training, momentum, eps)
    if not training:
        return y
    xc = centered(x, [0] + list(range(2, x.dim())))
    return F.batch_norm(xc, None, None, _wide(weight), _wide(bias), True, 0.0, eps)


def reference_instance_norm(x, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                            momentum=0.1, eps=1e-5):
    y = F.instance_norm(x.double(), running_mean, running_var, _wide(weight), _wide(bias), use_input_stats,
                        momentum, eps)
    if not use_input_stats:
        return y
    return F.instance_norm(centered(x, list(range(2, x.dim()))), None, None, _wide(weight), _wide(bias), True,
                           0.0, eps)
