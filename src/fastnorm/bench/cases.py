"""One benchmark row: an op, a dtype, an input shape and the dims it normalizes.

A case knows how many bytes it must move at least (the memory-bound floor) and builds its inputs,
fastnorm's call and PyTorch's eager reference.
"""
from dataclasses import dataclass
import math

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
OPS = ("layer_norm", "rms_norm")
OP_SHORT = {"layer_norm": "LN", "rms_norm": "RMS"}


@dataclass(frozen=True)
class BenchCase:
    suite: str                # "seed", "lastdim" or "latency": where the row comes from
    op: str                   # "layer_norm" or "rms_norm"
    dtype: str                # key of DTYPES
    shape: tuple              # input shape
    dims: tuple               # normalized dims: consecutive, non-negative
    affine: bool              # weight (and bias for layer_norm) of shape shape[dims], in `dtype`
    eps: float = 1e-5

    def __post_init__(self):
        if self.op not in OPS or self.dtype not in DTYPES:
            raise ValueError(f"unknown op/dtype {self.op}/{self.dtype}")
        if list(self.dims) != list(range(self.dims[0], self.dims[0] + len(self.dims))):
            raise ValueError(f"normalized dims must be consecutive, got {self.dims}")
        if self.dims[-1] >= len(self.shape):
            raise ValueError(f"dims {self.dims} out of range for shape {self.shape}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @property
    def param_shape(self) -> tuple:
        return tuple(self.shape[d] for d in self.dims)

    @property
    def trailing(self) -> bool:
        """True when the normalized dims are the last ones (F.layer_norm's convention)."""
        return self.dims[-1] == len(self.shape) - 1

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def n_params(self) -> int:
        """How many parameter tensors the op reads: weight (+ bias for layer_norm) when affine."""
        if not self.affine:
            return 0
        return 2 if self.op == "layer_norm" else 1

    @property
    def element_size(self) -> int:
        return torch.empty((), dtype=self.torch_dtype).element_size()

    def minimal_bytes(self) -> int:
        """x read once + y written once + each parameter read once, all at `dtype`."""
        params = self.n_params * math.prod(self.param_shape)
        return (2 * self.numel + params) * self.element_size

    def working_set_bytes(self) -> int:
        """Device memory a row needs at its peak: x and fastnorm's y, plus about three
        input-sized temporaries of the eager reference, which computes in fp32."""
        return 2 * self.numel * self.element_size + 3 * self.numel * 4

    @property
    def shape_str(self) -> str:
        return "x".join(str(s) for s in self.shape)

    @property
    def dims_str(self) -> str:
        """"last", "last3" or "dim1", "dims1-2": how the table names the normalized dims."""
        if self.trailing:
            return "last" if len(self.dims) == 1 else f"last{len(self.dims)}"
        if len(self.dims) == 1:
            return f"dim{self.dims[0]}"
        return f"dims{self.dims[0]}-{self.dims[-1]}"

    @property
    def label(self) -> str:
        return f"{OP_SHORT[self.op]} {self.dtype} {self.shape_str} {self.dims_str}"


def make_inputs(case: BenchCase, device, seed: int = 0):
    """(x, weight or None, bias or None), random, on `device`, at the case's dtype."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = case.torch_dtype
    x = torch.randn(case.shape, generator=gen, device=device, dtype=dtype)
    weight = bias = None
    if case.affine:
        weight = (torch.rand(case.param_shape, generator=gen, device=device) + 0.5).to(dtype)
        if case.op == "layer_norm":
            bias = (0.5 * torch.randn(case.param_shape, generator=gen, device=device)).to(dtype)
    return x, weight, bias


def fastnorm_fn(case: BenchCase):
    """fastnorm's call for the case, as fn(x, weight, bias)."""
    import fastnorm

    eps = case.eps
    if case.trailing:
        shape = case.param_shape
        if case.op == "layer_norm":
            return lambda x, w, b: fastnorm.layer_norm(x, shape, w, b, eps)
        return lambda x, w, b: fastnorm.rms_norm(x, shape, w, eps)
    dim = case.dims[0] if len(case.dims) == 1 else case.dims
    if case.op == "layer_norm":
        return lambda x, w, b: fastnorm.layer_norm(x, None, w, b, eps, dim=dim)
    return lambda x, w, b: fastnorm.rms_norm(x, None, w, eps, dim=dim)


def _rms_formula(x, weight, dims, eps):
    """The hand-written RMSNorm; low-precision inputs are computed in fp32 and rounded once."""
    xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
    y = xf / torch.sqrt(torch.mean(xf ** 2, dim=dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float().reshape(weight.shape + (1,) * (x.dim() - 1 - dims[-1]))
    return y.to(x.dtype)


def eager_fn(case: BenchCase):
    """PyTorch's eager version of the case, as fn(x, weight, bias); also the correctness reference."""
    eps = case.eps
    if case.op == "layer_norm":
        if not case.trailing:
            raise ValueError("the eager LayerNorm baseline covers trailing dims only")
        shape = case.param_shape
        return lambda x, w, b: F.layer_norm(x, shape, w, b, eps)
    if case.trailing and hasattr(F, "rms_norm"):  # torch >= 2.4
        shape = case.param_shape
        return lambda x, w, b: F.rms_norm(x, shape, w, eps)
    dims = case.dims
    return lambda x, w, b: _rms_formula(x, w, dims, eps)
