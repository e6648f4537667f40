"""One benchmark row: an op, a dtype, an input shape and the dims it normalizes, and how x is laid out
in memory (a start offset that breaks alignment, padded rows).

A case knows how many bytes it must move at least (the memory-bound floor) in each mode (forward,
backward, both) and builds its inputs, fastnorm's call, PyTorch's eager reference and Liger's call.
"""
from dataclasses import dataclass
import functools
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
    offset: int = 0           # x starts this many elements into its buffer (1..3: not 16-byte aligned)
    pad: int = 0              # elements after each run of the last dim: dim -2 has stride shape[-1] + pad

    def __post_init__(self):
        if self.op not in OPS or self.dtype not in DTYPES:
            raise ValueError(f"unknown op/dtype {self.op}/{self.dtype}")
        if list(self.dims) != list(range(self.dims[0], self.dims[0] + len(self.dims))):
            raise ValueError(f"normalized dims must be consecutive, got {self.dims}")
        if self.dims[-1] >= len(self.shape):
            raise ValueError(f"dims {self.dims} out of range for shape {self.shape}")
        if self.offset < 0 or self.pad < 0 or (self.pad and len(self.shape) < 2):
            raise ValueError(f"offset {self.offset} / pad {self.pad} must be >= 0 (pad needs 2+ dims)")

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

    @property
    def strides(self) -> tuple:
        """x's strides in elements: contiguous, except that rows of the last dim are `pad` apart."""
        strides, step = [], 1
        for i in reversed(range(len(self.shape))):
            strides.append(step)
            step *= self.shape[i] + (self.pad if i == len(self.shape) - 1 else 0)
        return tuple(reversed(strides))

    @property
    def storage_numel(self) -> int:
        """Elements of the buffer x is a view of: the offset, the rows and their padding."""
        if self.numel == 0:
            return self.offset
        return self.offset + 1 + sum((size - 1) * stride for size, stride in zip(self.shape, self.strides))

    def minimal_bytes(self, mode: str = "fwd") -> int:
        """The least a call must move, all at `dtype`. fwd: x read, y written, each parameter read.
        bwd: x and dy read, dx written, weight read and dweight (+ dbias) written. train: both."""
        n_param = math.prod(self.param_shape) if self.affine else 0
        fwd = 2 * self.numel + self.n_params * n_param
        bwd = 3 * self.numel + (1 + self.n_params) * n_param if self.affine else 3 * self.numel
        counts = {"fwd": fwd, "bwd": bwd, "train": fwd + bwd}
        if mode not in counts:
            raise ValueError(f"unknown mode {mode!r} (choose from {', '.join(counts)})")
        return counts[mode] * self.element_size

    def working_set_bytes(self, mode: str = "fwd") -> int:
        """Device memory a row needs at its peak. Forward: x and fastnorm's y, plus about three
        input-sized temporaries of the eager reference, which computes in fp32. Backward (bwd, train):
        x, dy, y and dx, plus about four fp32 temporaries of eager's backward."""
        x_bytes = self.storage_numel * self.element_size
        if mode == "fwd":
            return x_bytes + self.numel * self.element_size + 3 * self.numel * 4
        return x_bytes + 3 * self.numel * self.element_size + 4 * self.numel * 4

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
    def layout_str(self) -> str:
        """"" for a contiguous x; " off1", " pad24", " off2 pad7" for the other layouts."""
        return (f" off{self.offset}" if self.offset else "") + (f" pad{self.pad}" if self.pad else "")

    @property
    def label(self) -> str:
        return f"{OP_SHORT[self.op]} {self.dtype} {self.shape_str} {self.dims_str}{self.layout_str}"


def make_inputs(case: BenchCase, device, seed: int = 0, requires_grad: bool = False):
    """(x, weight or None, bias or None), random, on `device`, at the case's dtype. x is a view into a
    larger buffer when the case has an offset or padded rows. requires_grad: all of them are leaves
    that require grad (the backward modes)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = case.torch_dtype
    if case.offset or case.pad:
        buffer = torch.randn(case.storage_numel, generator=gen, device=device, dtype=dtype)
        x = buffer.as_strided(case.shape, case.strides, case.offset)
    else:
        x = torch.randn(case.shape, generator=gen, device=device, dtype=dtype)
    weight = bias = None
    if case.affine:
        weight = (torch.rand(case.param_shape, generator=gen, device=device) + 0.5).to(dtype)
        if case.op == "layer_norm":
            bias = (0.5 * torch.randn(case.param_shape, generator=gen, device=device)).to(dtype)
    if requires_grad:
        for t in (x, weight, bias):
            if t is not None:
                t.requires_grad_()
    return x, weight, bias


def make_grad_output(case: BenchCase, device, seed: int = 1):
    """dy for the backward modes: random, contiguous, x's shape and dtype."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(case.shape, generator=gen, device=device, dtype=case.torch_dtype)


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


def _wide(t):
    """fp32 for low-precision tensors, fp32/fp64 ones as they are: the formulas compute in this."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def _param(param, x, dims):
    """A weight or bias of shape x.shape[dims], shaped to broadcast against x (trailing 1s)."""
    return _wide(param).reshape(param.shape + (1,) * (x.dim() - 1 - dims[-1]))


def _rms_formula(x, weight, dims, eps):
    """The hand-written RMSNorm; low-precision inputs are computed in fp32 and rounded once."""
    xf = _wide(x)
    y = xf / torch.sqrt(torch.mean(xf ** 2, dim=dims, keepdim=True) + eps)
    if weight is not None:
        y = y * _param(weight, x, dims)
    return y.to(x.dtype)


def _layer_norm_formula(x, weight, bias, dims, eps):
    """The hand-written LayerNorm over non-trailing dims (ConvNeXt's channels-first LayerNorm), in fp32
    for low-precision inputs like _rms_formula."""
    xf = _wide(x)
    centered = xf - torch.mean(xf, dim=dims, keepdim=True)
    y = centered / torch.sqrt(torch.mean(centered ** 2, dim=dims, keepdim=True) + eps)
    if weight is not None:
        y = y * _param(weight, x, dims)
    if bias is not None:
        y = y + _param(bias, x, dims)
    return y.to(x.dtype)


def eager_fn(case: BenchCase):
    """PyTorch's eager version of the case, as fn(x, weight, bias); also the correctness reference (run
    in float64 for gradients). Non-trailing dims: the formula users write for channels-first tensors."""
    eps, dims = case.eps, case.dims
    if case.op == "layer_norm":
        if not case.trailing:
            return lambda x, w, b: _layer_norm_formula(x, w, b, dims, eps)
        shape = case.param_shape
        return lambda x, w, b: F.layer_norm(x, shape, w, b, eps)
    if case.trailing and hasattr(F, "rms_norm"):  # torch >= 2.4
        shape = case.param_shape
        return lambda x, w, b: F.rms_norm(x, shape, w, eps)
    return lambda x, w, b: _rms_formula(x, w, dims, eps)


class Unavailable(RuntimeError):
    """An implementation that cannot run a case here: not installed, or a layout or device it lacks."""


@functools.lru_cache(maxsize=None)
def _liger_functional():
    """liger_kernel.transformers.functional, or the reason it cannot be had (an optional baseline:
    never a dependency of fastnorm)."""
    try:
        from liger_kernel.transformers import functional
    except Exception as exc:  # not installed, or installed without a working triton
        return f"liger_kernel not importable ({type(exc).__name__}: {str(exc).strip()[:80]})"
    return functional


def liger_fn(case: BenchCase):
    """Liger-Kernel's LayerNorm / RMSNorm for the case, as fn(x, weight, bias): its autograd functions on
    rows of the last dim (trailing normalized dims are flattened into one, a view of a contiguous x).
    Raises Unavailable when liger_kernel does not import, for non-trailing dims and for LayerNorm
    without weight; the fn raises it for tensors off CUDA (Liger's kernels are Triton)."""
    functional = _liger_functional()
    if isinstance(functional, str):
        raise Unavailable(functional)
    if not case.trailing:
        raise Unavailable("Liger normalizes the last dim only")
    if case.op == "layer_norm" and not case.affine:
        raise Unavailable("Liger's LayerNorm needs a weight")
    begin, eps = case.dims[0], case.eps

    def rows(t):  # trailing normalized dims as one: x -> (..., N), a parameter -> (N,)
        if t is None:
            return None
        return t.flatten(begin if t.dim() == len(case.shape) else 0)

    def fn(x, w, b):
        if not x.is_cuda:
            raise Unavailable("Liger's kernels run on CUDA only")
        if case.op == "layer_norm":
            y = functional.liger_layer_norm(rows(x), rows(w), rows(b), eps)
        else:  # dX in a fresh tensor, not over dy: the timed backward reuses dy every trial
            y = functional.liger_rms_norm(rows(x), rows(w), eps, 0.0, "llama", False)
        return y.reshape(x.shape)
    return fn
