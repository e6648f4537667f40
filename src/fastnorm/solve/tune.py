"""Choose the kernels' launch configuration by timing the whole ModelNew on the problem's real inputs.

The candidates are the extension's overrides (threads per block, blocks cooperating on one row) after
auto (0, 0). They are tried in order until one reaches the target speedup over the reference, or all
have been tried; the fastest correct one wins, unless it beats auto by less than NOISE_MARGIN (then
auto stays: an override that does not measurably help is not worth writing down). A candidate whose
output differs from the reference's, or that the kernels refuse, is skipped.
"""
from dataclasses import dataclass
from typing import Callable, Optional

import torch

# KernelBench's tolerances per output dtype (atol = rtol).
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 1e-2}
DEFAULT_TOLERANCE = 1e-4
NOISE_MARGIN = 0.03  # an override must be this much faster than auto to be chosen


@dataclass
class Trial:
    threads: int
    blocks_per_row: int
    ms: Optional[float] = None      # median time of ModelNew's forward
    speedup: Optional[float] = None  # reference time / ms
    error: Optional[str] = None     # why the candidate was skipped

    @property
    def label(self) -> str:
        def text(v):
            return "auto" if v == 0 else str(v)
        return f"threads={text(self.threads)} blocks_per_row={text(self.blocks_per_row)}"


def candidate_configs(device_type: str) -> list:
    """(threads, blocks_per_row) pairs the kernels take, auto first, most promising next. The solver times
    those of them that launch its traced calls differently on the kernels it built
    (kernel_needs.tune_configs)."""
    if device_type == "cpu":
        # The CPU kernels size their OpenMP team and chunks themselves and ignore both overrides, so
        # timing overrides there would only pick noise.
        return [(0, 0)]
    threads = (32, 64, 128, 256, 512, 1024)  # threads per row (row kernel) or per block (split rows)
    blocks = (1, 2, 4, 8, 16, 32, 64)       # 1 forces one thread group per row
    return ([(0, 0)] + [(t, 0) for t in threads] + [(0, b) for b in blocks]
            + [(t, b) for b in blocks for t in threads])


def _outputs(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _outputs(v)]
    return []


def outputs_match(expected, actual) -> Optional[str]:
    """None if every output tensor matches within KernelBench's tolerance, else what differs."""
    want, got = _outputs(expected), _outputs(actual)
    if len(want) != len(got):
        return f"{len(got)} output tensors, expected {len(want)}"
    for i, (w, g) in enumerate(zip(want, got)):
        if w.shape != g.shape or w.dtype != g.dtype:
            return f"output {i}: {g.dtype} {tuple(g.shape)}, expected {w.dtype} {tuple(w.shape)}"
        tol = TOLERANCE.get(w.dtype, DEFAULT_TOLERANCE)
        diff = _max_violation(g, w, tol)
        if diff is not None:
            return f"output {i}: max abs difference {diff:.3g} (tolerance {tol:g})"
    return None


_CHUNK = 1 << 26  # elements compared at a time: the 7.5 GB outputs would need several copies at once


def _max_violation(actual: torch.Tensor, expected: torch.Tensor, tol: float) -> Optional[float]:
    """None if allclose(actual, expected, tol, tol); else the largest absolute difference."""
    a, e = actual.reshape(-1), expected.reshape(-1)
    worst = None
    for start in range(0, a.numel(), _CHUNK):
        pa, pe = a[start:start + _CHUNK], e[start:start + _CHUNK]
        if not torch.allclose(pa, pe, atol=tol, rtol=tol, equal_nan=True):
            diff = (pa.double() - pe.double()).abs().nan_to_num(float("inf")).max().item()
            worst = diff if worst is None else max(worst, diff)
    return worst


def tune(solution_module, model_new: torch.nn.Module, reference: torch.nn.Module, inputs: list,
         device: torch.device, *, target_speedup: Optional[float], timer: Callable, trials: int,
         log: Callable = print, launch_overrides: bool = True, configs: Optional[list] = None):
    """(best Trial or None, all Trials, reference ms). Sets solution_module.THREADS / BLOCKS_PER_ROW.
    configs: the (threads, blocks_per_row) pairs to try (default: candidate_configs of the device type).
    launch_overrides=False (the solution's kernels take none): auto only, timed once."""
    if configs is None:
        configs = candidate_configs(device.type)
    if not launch_overrides:
        configs = [(0, 0)]
    with torch.no_grad():
        expected = reference(*inputs)
        reference_ms = timer(lambda: reference(*inputs), device=device, trials=trials).median_ms
        log(f"reference Model: {reference_ms:.4g} ms (median of {trials})")
        results = []
        for threads, blocks_per_row in configs:
            trial = Trial(threads, blocks_per_row)
            results.append(trial)
            solution_module.THREADS, solution_module.BLOCKS_PER_ROW = threads, blocks_per_row
            try:
                actual = model_new(*inputs)
                trial.error = outputs_match(expected, actual)
                del actual
                if trial.error is None:
                    trial.ms = timer(lambda: model_new(*inputs), device=device, trials=trials).median_ms
                    trial.speedup = reference_ms / trial.ms
            except RuntimeError as err:
                trial.error = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            if trial.error is None:
                log(f"  {trial.label:<34} {trial.ms:9.4g} ms  {trial.speedup:6.2f}x")
            else:
                log(f"  {trial.label:<34} skipped: {trial.error}")
                if not _device_usable(device):
                    log("  the device is in an error state after this candidate: no further candidates")
                    break
            if trial.speedup is not None and target_speedup is not None and trial.speedup >= target_speedup:
                log(f"  target {target_speedup:g}x reached")
                break
        del expected
    best = choose(results, log)
    if best is not None:
        solution_module.THREADS, solution_module.BLOCKS_PER_ROW = best.threads, best.blocks_per_row
    return best, results, reference_ms


def _device_usable(device: torch.device) -> bool:
    """False once a CUDA error has poisoned this process's context (every later call would fail)."""
    if device.type != "cuda":
        return True
    try:
        torch.cuda.synchronize(device)
        return True
    except RuntimeError:
        return False


def choose(results: list, log: Callable = print) -> Optional[Trial]:
    """The fastest timed trial, or auto when the fastest override is within the noise margin of it."""
    timed = [t for t in results if t.ms is not None]
    if not timed:
        return None
    best = min(timed, key=lambda t: t.ms)
    auto = next((t for t in timed if (t.threads, t.blocks_per_row) == (0, 0)), None)
    if auto is not None and best is not auto and best.ms > auto.ms * (1 - NOISE_MARGIN):
        log(f"  fastest override ({best.label}) is within {NOISE_MARGIN:.0%} of auto: keeping auto")
        return auto
    return best
