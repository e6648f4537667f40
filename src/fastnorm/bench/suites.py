"""The rows `fastnorm bench` runs, by suite: the two seed problems, last-dim shapes and small latency
rows, at GPU sizes or at scaled-down CPU sizes, and the `--quick` subsets of both.

A suite is a builder, device type ("cuda" or "cpu") -> its cases, registered in SUITES under the name
`--suite` takes. A new suite is one builder and one entry there.
"""
from dataclasses import dataclass
from typing import Callable

from fastnorm.bench.cases import BenchCase

# (M, N) of the last-dim and latency suites: long and short rows, many and few of them.
LASTDIM_SHAPES = {"cuda": ((16384, 4096), (4096, 16384), (65536, 1024), (1024, 65536), (256, 262144),
                           (16, 4194304)),
                  "cpu": ((256, 1024), (64, 16384))}
LATENCY_SHAPES = {"cuda": ((1, 4096), (32, 4096)), "cpu": ((1, 4096), (32, 4096))}
# The seed problems: LayerNorm over the last three dims, affine; RMSNorm over the channels (dim 1), no weight.
SEED_SHAPES = {"cuda": ((16, 64, 256, 256), (112, 64, 512, 512)), "cpu": ((8, 8, 64, 64), (4, 16, 64, 64))}


def seed_cases(device_type: str):
    ln_shape, rms_shape = SEED_SHAPES[device_type]
    rows = []
    for dtype in ("fp32", "bf16"):
        rows.append(BenchCase("seed", "layer_norm", dtype, ln_shape, (1, 2, 3), affine=True))
        rows.append(BenchCase("seed", "rms_norm", dtype, rms_shape, (1,), affine=False))
    return rows


def _lastdim_cases(suite, shapes, dtypes):
    return [BenchCase(suite, op, dtype, (m, n), (1,), affine=True)
            for dtype in dtypes for (m, n) in shapes for op in ("layer_norm", "rms_norm")]


def lastdim_cases(device_type: str):
    return _lastdim_cases("lastdim", LASTDIM_SHAPES[device_type], ("fp32", "bf16"))


def latency_cases(device_type: str):
    return _lastdim_cases("latency", LATENCY_SHAPES[device_type], ("bf16",))


@dataclass(frozen=True)
class Suite:
    build: Callable                # device type ("cuda" or "cpu") -> list of BenchCase
    by_row_length: bool = False    # also chart % of copy against row length (a `<chart>-rows.png`)
    default: bool = True           # runs without --suite (a suite that takes long may say False)


SUITES = {
    "seed": Suite(seed_cases),
    "lastdim": Suite(lastdim_cases, by_row_length=True),
    "latency": Suite(latency_cases),
}
SUITE_DTYPES = ("fp32", "bf16")  # the dtypes the suites have rows for (the choices of --dtype)


# --quick keeps these rows (by label) of the full suite: one seed problem per op in fp32, a few
# last-dim shapes that show short, long and very long rows, one latency row.
_GPU_QUICK = {
    "LN fp32 16x64x256x256 last3", "RMS fp32 112x64x512x512 dim1",
    "LN bf16 16384x4096 last", "RMS bf16 16384x4096 last",
    "LN fp32 1024x65536 last", "RMS bf16 16x4194304 last",
    "RMS bf16 32x4096 last",
}
_CPU_QUICK = {
    "LN fp32 8x8x64x64 last3", "RMS fp32 4x16x64x64 dim1",
    "LN fp32 256x1024 last", "RMS bf16 64x16384 last", "RMS bf16 32x4096 last",
}


def select(device_type: str, *, quick=False, suites=None, dtypes=None, ops=None):
    """The cases for a device type ("cuda" or "cpu"): the default suites, or those named in `suites`,
    narrowed by the --quick/--dtype/--op filters."""
    names = [n for n, s in SUITES.items() if (n in suites if suites else s.default)]
    cases = [case for name in names for case in SUITES[name].build(device_type)]
    if quick:
        keep = _GPU_QUICK if device_type == "cuda" else _CPU_QUICK
        cases = [c for c in cases if c.label in keep]
    if dtypes:
        cases = [c for c in cases if c.dtype in dtypes]
    if ops:
        cases = [c for c in cases if c.op in ops]
    return cases
