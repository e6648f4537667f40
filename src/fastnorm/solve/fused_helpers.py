"""The fused normalization helpers that a generated solution file carries.

They are ordinary functions so they can be tested here; `fastnorm solve` copies the source of the
ones a solution uses into its file, where `_ext` is the load_inline module and THREADS /
BLOCKS_PER_ROW hold the launch configuration the solver chose. The rewritten graph calls them by
identity, which is how the code generator knows where they are used.
"""
import torch

_ext = None  # set by the solution file (its load_inline module) or by tests
THREADS = 0  # launch overrides passed to every kernel call; 0 = the kernel's own choice
BLOCKS_PER_ROW = 0


def fused_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm(x, normalized_shape, weight, bias, eps) on the inline kernel."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    begin = x.dim() - len(normalized_shape)
    if begin < 0 or tuple(x.shape[begin:]) != tuple(normalized_shape):
        raise ValueError(f"layer_norm: normalized_shape {tuple(normalized_shape)} is not the end of "
                         f"the input shape {tuple(x.shape)}")
    return _ext.norm_forward(x, weight, bias, begin, x.dim(), float(eps), False, THREADS, BLOCKS_PER_ROW)


def fused_rms_norm(x, normalized_shape, weight=None, eps=None):
    """torch.nn.functional.rms_norm(x, normalized_shape, weight, eps) on the inline kernel."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    begin = x.dim() - len(normalized_shape)
    if begin < 0 or tuple(x.shape[begin:]) != tuple(normalized_shape):
        raise ValueError(f"rms_norm: normalized_shape {tuple(normalized_shape)} is not the end of "
                         f"the input shape {tuple(x.shape)}")
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    return _ext.norm_forward(x, weight, None, begin, x.dim(), float(eps), True, THREADS, BLOCKS_PER_ROW)


def fused_rms_norm_over_dims(x, dim, weight=None, eps=0.0):
    """x / sqrt(mean(x**2, dim, keepdim=True) + eps) [* weight] on the inline kernel.

    `dim`: one dim or consecutive dims (None: all of them). `weight`: one value per normalized element,
    in any shape that broadcasts along the normalized dims only (e.g. (C, 1, 1) for dim=1 of NCHW).
    """
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        dim = range(x.dim())
    dims = sorted(d % x.dim() for d in ((dim,) if isinstance(dim, int) else dim))
    begin, end = dims[0], dims[-1] + 1
    if dims != list(range(begin, end)):
        raise ValueError(f"rms_norm: dims {tuple(dims)} are not consecutive")
    return _ext.norm_forward(x, weight, None, begin, end, float(eps), True, THREADS, BLOCKS_PER_ROW)


HELPERS = {f.__name__: f for f in (fused_layer_norm, fused_rms_norm, fused_rms_norm_over_dims)}
