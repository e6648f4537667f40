"""The rows `fastnorm bench` runs, by suite: the two seed problems, last-dim shapes and small latency
rows (run by default), the training shapes of issue 19 and the committed sweep of issue 20 (run when
named), at GPU sizes or at scaled-down CPU sizes, and the `--quick` subsets.

A suite is a builder, device type ("cuda" or "cpu") -> its cases, registered in SUITES under the name
`--suite` takes. A new suite is one builder and one entry there.
"""
from dataclasses import dataclass
import functools
import json
from pathlib import Path
from typing import Callable, Optional

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


# The training shapes of issue 19, (M, N, dtype), LayerNorm and RMSNorm each; the CPU keeps N, fewer rows.
TRAIN_SHAPES = {"cuda": ((16384, 4096, "bf16"), (4096, 16384, "fp32"), (8192, 5120, "bf16"),
                         (65536, 1024, "bf16"), (1024, 65536, "fp32"), (4096, 14336, "fp16")),
                "cpu": ((64, 4096, "bf16"), (16, 16384, "fp32"), (32, 5120, "bf16"), (256, 1024, "bf16"),
                        (4, 65536, "fp32"), (16, 14336, "fp16"))}


def train_cases(device_type: str):
    """Issue 19's training shapes, then the two fp32 seed problems: the channel RMSNorm seed last, as
    its eager backward needs most of an 80 GB GPU (every earlier row's tensors are freed by then)."""
    rows = [BenchCase("train", op, dtype, (m, n), (1,), affine=True)
            for (m, n, dtype) in TRAIN_SHAPES[device_type] for op in ("layer_norm", "rms_norm")]
    ln_shape, rms_shape = SEED_SHAPES[device_type]
    rows.append(BenchCase("train", "layer_norm", "fp32", ln_shape, (1, 2, 3), affine=True))
    rows.append(BenchCase("train", "rms_norm", "fp32", rms_shape, (1,), affine=False))
    return rows


SWEEP_FILE = Path(__file__).with_name("sweep_cases.json")  # written by benchmarks/gen_sweep.py


@functools.lru_cache(maxsize=None)
def _sweep_list():
    return json.loads(SWEEP_FILE.read_text())


def sweep_cases(device_type: str):
    """The committed sweep of issue 20 (benchmarks/gen_sweep.py says what it covers): the GPU list, or
    on the CPU the CPU list (tensors under 8 MB)."""
    return [BenchCase("sweep", c["op"], c["dtype"], tuple(c["shape"]), tuple(c["dims"]), c["affine"],
                      offset=c["offset"], pad=c["pad"]) for c in _sweep_list()[device_type]]


@dataclass(frozen=True)
class Suite:
    build: Callable                # device type ("cuda" or "cpu") -> list of BenchCase
    by_row_length: bool = False    # also chart % of copy against row length (a `<chart>-rows.png`)
    default: bool = True           # runs without --suite (a suite that takes long may say False)
    rank_worst: bool = False       # also print its rows worst first against the fastest baseline (ranking.py)
    quick: Optional[Callable] = None  # cases -> the --quick subset (default: the labels in _GPU/_CPU_QUICK)


SUITES = {
    "seed": Suite(seed_cases),
    "lastdim": Suite(lastdim_cases, by_row_length=True),
    "latency": Suite(latency_cases),
    "train": Suite(train_cases, default=False),
    "sweep": Suite(sweep_cases, by_row_length=True, default=False, rank_worst=True,
                   quick=lambda cases: cases[::10]),
}
SUITE_DTYPES = ("fp32", "bf16", "fp16")  # the dtypes the suites have rows for (the choices of --dtype)


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
    keep = _GPU_QUICK if device_type == "cuda" else _CPU_QUICK
    cases = []
    for name in names:
        suite_cases = SUITES[name].build(device_type)
        if quick:
            pick = SUITES[name].quick or (lambda rows: [c for c in rows if c.label in keep])
            suite_cases = pick(suite_cases)
        cases += suite_cases
    if dtypes:
        cases = [c for c in cases if c.dtype in dtypes]
    if ops:
        cases = [c for c in cases if c.op in ops]
    return cases
