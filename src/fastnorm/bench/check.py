"""Correctness gate of a bench row, before anything is timed: fastnorm's output against PyTorch's, and
in the backward modes fastnorm's gradients against PyTorch eager's computed in float64."""
from dataclasses import dataclass
import math
from typing import Optional

import torch

# (atol, rtol) per dtype; |out - ref| <= atol + rtol * |ref| elementwise, KernelBench's allclose rule.
# bf16 allows a rounding step or two of difference (8-bit mantissa), fp32 allows summation order.
TOLERANCES = {torch.float32: (1e-4, 1e-4), torch.bfloat16: (1e-2, 1e-2), torch.float16: (2e-3, 2e-3)}

# Compare in chunks so the fp32 temporaries stay small next to multi-GB outputs; the float64 gradient
# reference is computed over slices of dim 0 of about this many elements.
_CHUNK = 1 << 24


@dataclass
class CheckResult:
    max_abs_err: float  # nan when the output has a NaN or inf the reference does not
    ok: bool
    atol: float
    rtol: float
    error: str = ""     # why it failed, when it did not even produce a comparable output


def compare(out: torch.Tensor, ref: torch.Tensor, dtype: Optional[torch.dtype] = None,
            atol_scale: float = 1.0) -> CheckResult:
    """Max abs error of `out` against `ref` and whether every element is within tolerance. `dtype` is
    the dtype `out` must have and whose tolerances apply (default: ref's; a float64 reference of a
    bf16 output passes dtype=torch.bfloat16). atol_scale widens atol (sums over many rows)."""
    dtype = dtype or ref.dtype
    atol, rtol = TOLERANCES.get(dtype, (1e-4, 1e-4))
    atol *= atol_scale
    if out.shape != ref.shape:
        return CheckResult(math.nan, False, atol, rtol, f"shape {tuple(out.shape)} != {tuple(ref.shape)}")
    if out.dtype != dtype:
        return CheckResult(math.nan, False, atol, rtol, f"dtype {out.dtype} != {dtype}")
    wide = torch.float64 if ref.dtype == torch.float64 else torch.float32
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    max_err, ok = 0.0, True
    for start in range(0, flat_ref.numel(), _CHUNK):
        o = flat_out[start:start + _CHUNK].to(wide)
        r = flat_ref[start:start + _CHUNK].to(wide)
        diff = (o - r).abs_()
        # `<=` is False for NaN, so any NaN fails the row (the random inputs give a finite reference).
        ok = ok and bool((diff <= atol + rtol * r.abs()).all())
        chunk_max = float(diff.nan_to_num(nan=math.inf, posinf=math.inf).max()) if diff.numel() else 0.0
        max_err = max(max_err, chunk_max)
    if math.isinf(max_err):
        max_err = math.nan
    return CheckResult(max_err, ok, atol, rtol)


def combine(results: dict) -> CheckResult:
    """One result for several compared tensors (name -> CheckResult): ok when all are, the largest
    error, and the names of those that failed. atol/rtol are those of the first (the elementwise one)."""
    first = next(iter(results.values()))
    errors = [r.max_abs_err for r in results.values()]
    worst = math.nan if any(math.isnan(e) for e in errors) else max(errors)
    failed = [f"{name}: {r.error}" if r.error else f"{name} out of tolerance"
              for name, r in results.items() if not r.ok]
    return CheckResult(worst, not failed, first.atol, first.rtol, "; ".join(failed))


def _leaf64(t):
    return None if t is None else t.detach().double().requires_grad_()


def check_gradients(grads, reference, x, weight, bias, dy, begin_dim: int) -> dict:
    """fastnorm's gradients `grads` = (dx, dweight or None, dbias or None) against `reference`
    (PyTorch eager's fn(x, weight, bias)) run in float64, within the tolerances of x's dtype: a
    CheckResult per gradient ("dx", "dweight", "dbias"), for `combine`.

    The reference runs over slices of dim 0 (independent when the normalized dims start after it), so
    its float64 graph stays small next to multi-GB inputs; dweight / dbias add up the slices' parts.
    Those two are sums over the R rows a parameter element sees, whose size grows as sqrt(R) for
    random dy: their atol is the dtype's times sqrt(R) (the dtype's tolerance at the sum's scale)."""
    dx, dweight, dbias = grads
    w64, b64 = _leaf64(weight), _leaf64(bias)
    params = [p for p in (w64, b64) if p is not None]
    sums = [torch.zeros_like(p) for p in params]
    step = x.shape[0]
    if begin_dim > 0 and x.numel() > _CHUNK:
        step = max(1, _CHUNK // max(1, x.numel() // x.shape[0]))
    dx_parts = CheckResult(0.0, True, *TOLERANCES.get(x.dtype, (1e-4, 1e-4)))
    for start in range(0, x.shape[0], step):
        part = _leaf64(x[start:start + step])
        got = torch.autograd.grad(reference(part, w64, b64), [part] + params, dy[start:start + step].double())
        dx_parts = _worse(dx_parts, compare(dx[start:start + step], got[0], x.dtype))
        for total, g in zip(sums, got[1:]):
            total += g
        del got, part
    results = {"dx": dx_parts}
    rows = x.numel() // weight.numel() if weight is not None and weight.numel() else 1
    for name, out, ref in zip(("dweight", "dbias"), [g for g in (dweight, dbias) if g is not None], sums):
        results[name] = compare(out, ref, x.dtype, atol_scale=math.sqrt(max(1, rows)))
    return results


def _worse(a: CheckResult, b: CheckResult) -> CheckResult:
    """Two parts of one tensor's comparison as one: failed when either did, the larger error."""
    err = math.nan if math.isnan(a.max_abs_err) or math.isnan(b.max_abs_err) else max(a.max_abs_err, b.max_abs_err)
    return CheckResult(err, a.ok and b.ok, b.atol, b.rtol, a.error or b.error)
