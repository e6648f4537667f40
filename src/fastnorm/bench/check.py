"""Correctness gate of a bench row: fastnorm's output against PyTorch's, before anything is timed."""
from dataclasses import dataclass
import math

import torch

# (atol, rtol) per dtype; |out - ref| <= atol + rtol * |ref| elementwise, KernelBench's allclose rule.
# bf16 allows a rounding step or two of difference (8-bit mantissa), fp32 allows summation order.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1e-2, 1e-2), torch.float16: (2e-3, 2e-3)}

# Compare in chunks so the fp32 temporaries stay small next to multi-GB outputs.
_CHUNK = 1 << 24


@dataclass
class CheckResult:
    max_abs_err: float  # nan when the output has a NaN or inf the reference does not
    ok: bool
    atol: float
    rtol: float
    error: str = ""     # why it failed, when it did not even produce a comparable output


def compare(out: torch.Tensor, ref: torch.Tensor) -> CheckResult:
    """Max abs error of `out` against `ref` and whether every element is within tolerance."""
    atol, rtol = TOLERANCES.get(ref.dtype, (1e-4, 1e-4))
    if out.shape != ref.shape:
        return CheckResult(math.nan, False, atol, rtol, f"shape {tuple(out.shape)} != {tuple(ref.shape)}")
    if out.dtype != ref.dtype:
        return CheckResult(math.nan, False, atol, rtol, f"dtype {out.dtype} != {ref.dtype}")
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    max_err, ok = 0.0, True
    for start in range(0, flat_ref.numel(), _CHUNK):
        o = flat_out[start:start + _CHUNK].float()
        r = flat_ref[start:start + _CHUNK].float()
        diff = (o - r).abs_()
        # `<=` is False for NaN, so any NaN fails the row (the random inputs give a finite reference).
        ok = ok and bool((diff <= atol + rtol * r.abs()).all())
        chunk_max = float(diff.nan_to_num(nan=math.inf, posinf=math.inf).max()) if diff.numel() else 0.0
        max_err = max(max_err, chunk_max)
    if math.isinf(max_err):
        max_err = math.nan
    return CheckResult(max_err, ok, atol, rtol)
