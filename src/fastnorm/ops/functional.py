"""Public functional API: torch.nn.functional semantics, plus normalization over any axis (`dim`)."""
import torch

from fastnorm.ops import norm_ops  # noqa: F401  (registers torch.ops.fastnorm.*)
from fastnorm.ops.validate import check_affine, norm_dims


def layer_norm(x, normalized_shape=None, weight=None, bias=None, eps: float = 1e-5, *, dim=None):
    """LayerNorm of `x` over its trailing `normalized_shape` dims, or over the consecutive dims `dim`.

    Same semantics as torch.nn.functional.layer_norm; `dim=1` normalizes the channels of an NCHW tensor
    in place of the trailing dims (weight and bias then have shape x.shape[dim]).
    """
    begin, end = norm_dims(x, normalized_shape, dim, "layer_norm")
    check_affine(x, begin, end, "layer_norm", weight=weight, bias=bias)
    return torch.ops.fastnorm.layer_norm(x, begin, end, weight, bias, float(eps))


def rms_norm(x, normalized_shape=None, weight=None, eps=None, *, dim=None):
    """RMSNorm: x / sqrt(mean(x**2) + eps) [* weight], over trailing dims or the consecutive dims `dim`.

    Same semantics as torch.nn.functional.rms_norm (eps None means torch.finfo(x.dtype).eps).
    """
    begin, end = norm_dims(x, normalized_shape, dim, "rms_norm")
    check_affine(x, begin, end, "rms_norm", weight=weight)
    if eps is None:
        eps = torch.finfo(x.dtype).eps
    return torch.ops.fastnorm.rms_norm(x, begin, end, weight, float(eps))
