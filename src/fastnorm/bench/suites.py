"""The rows `fastnorm bench` runs: a GPU suite (the two seed problems, the last-dim shapes, small
latency rows), a scaled-down CPU suite of the same kinds, and the `--quick` subsets of both."""
from fastnorm.bench.cases import BenchCase

SUITES = ("seed", "lastdim", "latency")

# (M, N) of the last-dim suite on a GPU: long and short rows, many and few of them.
GPU_LASTDIM = ((16384, 4096), (4096, 16384), (65536, 1024), (1024, 65536), (256, 262144), (16, 4194304))
GPU_LATENCY = ((1, 4096), (32, 4096))
CPU_LASTDIM = ((256, 1024), (64, 16384))
CPU_LATENCY = ((1, 4096), (32, 4096))


def _seed_cases(ln_shape, rms_shape, dtypes):
    rows = []
    for dtype in dtypes:
        # LayerNorm over the last three dims, affine; RMSNorm over the channels (dim 1), no weight.
        rows.append(BenchCase("seed", "layer_norm", dtype, ln_shape, (1, 2, 3), affine=True))
        rows.append(BenchCase("seed", "rms_norm", dtype, rms_shape, (1,), affine=False))
    return rows


def _lastdim_cases(suite, shapes, dtypes):
    return [BenchCase(suite, op, dtype, (m, n), (1,), affine=True)
            for dtype in dtypes for (m, n) in shapes for op in ("layer_norm", "rms_norm")]


def gpu_suite():
    return (_seed_cases((16, 64, 256, 256), (112, 64, 512, 512), ("fp32", "bf16"))
            + _lastdim_cases("lastdim", GPU_LASTDIM, ("fp32", "bf16"))
            + _lastdim_cases("latency", GPU_LATENCY, ("bf16",)))


def cpu_suite():
    return (_seed_cases((8, 8, 64, 64), (4, 16, 64, 64), ("fp32", "bf16"))
            + _lastdim_cases("lastdim", CPU_LASTDIM, ("fp32", "bf16"))
            + _lastdim_cases("latency", CPU_LATENCY, ("bf16",)))


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
    """The cases for a device type ("cuda" or "cpu"), narrowed by the --quick/--suite/--dtype/--op filters."""
    cases = gpu_suite() if device_type == "cuda" else cpu_suite()
    if quick:
        keep = _GPU_QUICK if device_type == "cuda" else _CPU_QUICK
        cases = [c for c in cases if c.label in keep]
    if suites:
        cases = [c for c in cases if c.suite in suites]
    if dtypes:
        cases = [c for c in cases if c.dtype in dtypes]
    if ops:
        cases = [c for c in cases if c.op in ops]
    return cases
