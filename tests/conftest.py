"""Shared test helpers: CUDA auto-skip, a logged seed per test, float64 reference comparisons."""
import os
import random
import zlib

import pytest
import torch
import torch.nn.functional as F

from fastnorm.ops.validate import default_rms_eps

# Worst error allowed, relative to the output's scale (max |reference|, at least 1), per output dtype.
TOLERANCE = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def input_seed(request):
    """Seeded random inputs: by default a seed of the test's own id, so every run (CI's included) draws
    the same; FASTNORM_TEST_SEED=random draws fresh ones, an integer takes that seed. Printed so a
    failure can be replayed."""
    choice = os.environ.get("FASTNORM_TEST_SEED", "")
    if choice == "random":
        seed = random.randrange(2**31)
    elif choice:
        seed = int(choice)
    else:
        seed = zlib.crc32(request.node.nodeid.encode()) & 0x7FFFFFFF
    torch.manual_seed(seed)
    print(f"torch seed {seed}")
    yield seed


def _channels_last(fn, x, dims, *args):
    """Apply a trailing-dims reference `fn` over the consecutive `dims` of x by moving them last."""
    begin, end = dims
    moved = x.movedim(tuple(range(begin, end)), tuple(range(x.dim() - (end - begin), x.dim())))
    return fn(moved, *args).movedim(tuple(range(x.dim() - (end - begin), x.dim())), tuple(range(begin, end)))


def _wide(t):
    return None if t is None else t.double()


def _layer_norm64(t, shape, weight, bias, eps):
    """F.layer_norm of float64 `t` over its trailing `shape`, t first centered on its own mean. Layer
    norm is shift-invariant, and F.layer_norm subtracts a rounded mean, which costs ulps of max |x|:
    up to 3e-11 off the exact result on 3 values at x + 1000 (3000 seeds), where fastnorm's float64
    CPU path is within 6e-16. Centered, the reference is as exact."""
    dims = tuple(range(t.dim() - len(shape), t.dim()))
    return F.layer_norm(t - t.mean(dims, keepdim=True), tuple(shape), _wide(weight), _wide(bias), eps)


def reference_layer_norm(x, normalized_shape=None, weight=None, bias=None, eps=1e-5, dim=None):
    """PyTorch's layer_norm computed in float64 (over trailing dims, or over the consecutive dims `dim`)."""
    if dim is None:
        return _layer_norm64(x.double(), tuple(normalized_shape), weight, bias, eps)
    begin, end = _dim_range(x, dim)
    return _channels_last(lambda t: _layer_norm64(t, x.shape[begin:end], weight, bias, eps), x.double(), (begin, end))


# torch < 2.4 has no F.rms_norm / nn.RMSNorm: tests comparing with those modules skip there, and
# numerical references use the definition below.
HAS_TORCH_RMS_NORM = hasattr(F, "rms_norm")
needs_torch_rms_norm = pytest.mark.skipif(not HAS_TORCH_RMS_NORM, reason="nn.RMSNorm / F.rms_norm: torch >= 2.4")


def needs_torch_rms_norm_for(*texts):
    """pytest marks for a case whose code (problem text, forward, init) uses torch's RMSNorm."""
    uses = any(s in t for t in texts for s in ("nn.RMSNorm", "F.rms_norm", "torch.rms_norm"))
    return [needs_torch_rms_norm] if uses else []


def rms_norm_definition(x, normalized_shape, weight=None, eps=None):
    """F.rms_norm written out (computed in x's dtype, eps None = the epsilon of the type torch computes in:
    float32's for half types), for any torch."""
    eps = default_rms_eps(x.dtype) if eps is None else eps
    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    y = x * torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    return y if weight is None else y * weight


def reference_rms_norm(x, normalized_shape=None, weight=None, eps=None, dim=None):
    """PyTorch's rms_norm computed in float64; eps None as the real thing takes it (default_rms_eps)."""
    eps = default_rms_eps(x.dtype) if eps is None else eps
    if dim is None:
        return rms_norm_definition(x.double(), tuple(normalized_shape), _wide(weight), eps)
    begin, end = _dim_range(x, dim)
    return _channels_last(lambda t: rms_norm_definition(t, x.shape[begin:end], _wide(weight), eps),
                          x.double(), (begin, end))


def _dim_range(x, dim):
    dims = sorted(d % x.dim() for d in ((dim,) if isinstance(dim, int) else dim))
    return dims[0], dims[-1] + 1


def assert_matches_reference(actual, expected, dtype=None, input_terms=0.0):
    """`actual` (any float dtype) equals the float64 `expected` within TOLERANCE of its dtype, NaN for NaN.
    input_terms: the largest |x| * |dy/dx| of the map, where the kernel's statistics are rounded once in the
    input's own precision (float64): a few ulps of the input on top (backward stable) is all a float64 mean
    near 1000 can give when a tiny set's rstd amplifies it."""
    dtype = dtype or actual.dtype
    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if expected.numel() == 0:
        return
    a, e = actual.double(), expected.double()
    assert torch.equal(a.isnan(), e.isnan()), "NaN positions differ"
    finite = ~e.isnan()
    scale = max(1.0, e[finite].abs().max().item()) if finite.any() else 1.0
    err = (a[finite] - e[finite]).abs().max().item() / scale if finite.any() else 0.0
    tol = TOLERANCE[dtype] + 4 * torch.finfo(dtype).eps * input_terms / scale
    assert err <= tol, f"max error {err:.3g} (relative to scale {scale:.3g}) > {tol:g}"
