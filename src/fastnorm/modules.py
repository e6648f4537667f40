"""Drop-in modules: same constructor arguments, attributes and state_dict as torch.nn's."""
import numbers
from typing import Optional

import torch
from torch import nn

from fastnorm.ops.functional import layer_norm, rms_norm
from fastnorm.ops.norm_ops import accumulator_dtype, reference_forward
from fastnorm.ops.validate import default_rms_eps

_is_compiling = torch.compiler.is_compiling
ORIGINAL = "_fastnorm_original"  # set by fastnorm.patch on a replacement: the module it stands in for
ORIGINAL_EPS = "_fastnorm_original_eps"  # and the eps they shared then


class _InductorUnderCompile:
    """`inductor_under_compile` (set by fastnorm.patch): under torch.compile, forward as PyTorch ops,
    which inductor fuses with their neighbours in a model (a residual add before, casts after, the
    gradient sums in the backward), where a fastnorm kernel would be a fusion barrier. Where the module
    patch replaced still holds this one's parameters and eps, those ops are its own forward's: a patched
    model compiles to the unpatched model's graph (with fastnorm's reference ops instead, a Llama's graph
    had 5 more ops). Eager calls always take fastnorm's kernels."""

    inductor_under_compile = False

    def _to_inductor(self, residual) -> bool:
        return self.inductor_under_compile and residual is None and self.dim is None and _is_compiling()

    def _original_forward(self):
        """The forward of the module fastnorm.patch replaced with this one, or None where it no longer
        holds the same Parameter objects and eps (a parameter or eps set on this module since)."""
        original = vars(self).get(ORIGINAL)
        if original is None or vars(self).get(ORIGINAL_EPS) != self.eps:
            return None
        if any(getattr(original, name, None) is not p for name, p in self._parameters.items()):
            return None
        return original.forward


class LayerNorm(_InductorUnderCompile, nn.LayerNorm):
    """torch.nn.LayerNorm on fastnorm kernels; `dim` normalizes over other dims than the trailing ones.

    `forward(x, residual)` returns (y, h) with h = x + residual and y = norm(h), fused (pre-norm
    blocks); `residual_in_fp32=True` keeps h in float32.
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None, *, dim=None, residual_in_fp32: bool = False):
        kwargs = {"bias": bias} if "bias" in nn.LayerNorm.__init__.__code__.co_varnames else {}
        if not bias and not kwargs:  # torch < 2.1 has no bias switch
            raise TypeError("LayerNorm(bias=False) needs torch >= 2.1")
        super().__init__(normalized_shape, eps, elementwise_affine, device=device, dtype=dtype, **kwargs)
        self.dim = dim
        self.residual_in_fp32 = residual_in_fp32

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        if self._to_inductor(residual):
            original = self._original_forward()
            if original is not None:
                return original(x)
            return nn.functional.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, dim=self.dim, residual=residual,
                          residual_in_fp32=self.residual_in_fp32)

    def extra_repr(self) -> str:
        extra = super().extra_repr()
        return extra if self.dim is None else f"{extra}, dim={self.dim}"


def rms_norm_reference(x, normalized_shape, weight, eps, weight_offset: float = 0.0, out_dtype=None):
    """RMSNorm in PyTorch ops (statistics in float32 or wider, one rounding to `out_dtype`, default x's
    dtype): what patched modules trace to under torch.compile (see _InductorUnderCompile)."""
    wide = accumulator_dtype(x.dtype)  # float64 stays float64
    eps = default_rms_eps(x.dtype) if eps is None else eps
    w = None if weight is None else weight.to(wide) + weight_offset
    y = reference_forward(x.to(wide), x.dim() - len(normalized_shape), x.dim(), w, None, eps, rms=True)
    return y.to(x.dtype if out_dtype is None else out_dtype)


class RMSNorm(_InductorUnderCompile, nn.Module):
    """torch.nn.RMSNorm on fastnorm kernels; `dim=1` normalizes the channels of NCHW inputs natively.

    `forward(x, residual)` returns (y, h) with h = x + residual and y = norm(h), fused (pre-norm
    blocks); `residual_in_fp32=True` keeps h in float32.
    """

    __constants__ = ["normalized_shape", "eps", "elementwise_affine"]

    def __init__(self, normalized_shape, eps=None, elementwise_affine: bool = True, device=None, dtype=None,
                 *, dim=None, residual_in_fp32: bool = False):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.dim = dim
        self.residual_in_fp32 = residual_in_fp32
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(self.normalized_shape, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        if self._to_inductor(residual):
            original = self._original_forward()
            if original is not None:
                return original(x)
            return rms_norm_reference(x, self.normalized_shape, self.weight, self.eps)
        return rms_norm(x, self.normalized_shape, self.weight, self.eps, dim=self.dim, residual=residual,
                        residual_in_fp32=self.residual_in_fp32)

    def extra_repr(self) -> str:
        extra = f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
        return extra if self.dim is None else f"{extra}, dim={self.dim}"
