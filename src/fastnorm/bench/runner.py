"""Runs one bench row on a device: memory gate, correctness check, then timing of fastnorm, PyTorch
eager and torch.compile. Frees the row's tensors before returning, so the next row starts clean."""
from dataclasses import dataclass, field
import gc
import math
import os
import time
from typing import Callable, Optional

import torch

from fastnorm.bench.cases import BenchCase, eager_fn, fastnorm_fn, make_inputs
from fastnorm.bench.check import CheckResult, compare

IMPLS = ("fastnorm", "eager", "compile")


@dataclass
class TimingPlan:
    """How many trials an implementation gets: as many as fit `budget_ms`, within [min, max]."""
    max_trials: int = 100
    min_trials: int = 10
    budget_ms: float = 300.0
    warmup: int = 3
    flush_l2: bool = True
    include_host: bool = False  # time_callable's include_host: False = device time, host work overlapped

    def trials_for(self, estimate_ms: float) -> int:
        fit = self.budget_ms / max(estimate_ms, 1e-3)
        return int(min(self.max_trials, max(self.min_trials, fit)))


@dataclass
class ImplResult:
    median_us: Optional[float] = None
    min_us: Optional[float] = None
    iqr_us: Optional[float] = None
    trials: Optional[int] = None
    gbs: Optional[float] = None       # minimal bytes / median time
    pct_copy: Optional[float] = None  # gbs / copy bandwidth, in percent
    compile_s: Optional[float] = None  # torch.compile only: first call (compilation) wall time
    note: str = ""                    # why there is no timing (failed check, compile n/a, ...)

    @property
    def timed(self) -> bool:
        return self.median_us is not None


@dataclass
class RowResult:
    case: BenchCase
    status: str                       # "ok", "failed" (check did not pass) or "skipped"
    check: Optional[CheckResult] = None
    impls: dict = field(default_factory=lambda: {name: ImplResult() for name in IMPLS})
    note: str = ""

    def speedup_vs(self, baseline: str) -> Optional[float]:
        """baseline time / fastnorm time (both medians), None when either is missing."""
        ours, theirs = self.impls["fastnorm"], self.impls[baseline]
        if not (ours.timed and theirs.timed) or ours.median_us <= 0:
            return None
        return theirs.median_us / ours.median_us


def impl_result(stats, nbytes: int, copy_bw: float) -> ImplResult:
    """An ImplResult from a harness TimingStats (milliseconds) and the row's minimal bytes."""
    seconds = stats.median_ms * 1e-3
    rate = nbytes / seconds if seconds > 0 else math.inf
    return ImplResult(median_us=stats.median_ms * 1e3, min_us=stats.min_ms * 1e3,
                      iqr_us=stats.iqr_ms * 1e3, trials=stats.trials, gbs=rate / 1e9,
                      pct_copy=100.0 * rate / copy_bw if copy_bw else None)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:160] if text else ''}".rstrip(": ")


def free_memory_bytes(device: torch.device) -> Optional[int]:
    """Bytes the row may still allocate on the device (None when unknown)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Runner:
    """Runs cases on one device. `timer` has harness.timing.time_callable's signature; the fn
    factories exist so tests can run the runner with stand-ins for fastnorm."""

    def __init__(self, device: torch.device, plan: TimingPlan, copy_bw: float, *, use_compile=True,
                 timer: Optional[Callable] = None, fastnorm_factory=fastnorm_fn, eager_factory=eager_fn,
                 log: Callable[[str], None] = print, memory_fraction: float = 0.9):
        if timer is None:
            from fastnorm.harness.timing import time_callable as timer
        self.device, self.plan, self.copy_bw = device, plan, copy_bw
        self.use_compile, self.timer, self.log = use_compile, timer, log
        self.fastnorm_factory, self.eager_factory = fastnorm_factory, eager_factory
        self.memory_fraction = memory_fraction

    def run(self, case: BenchCase) -> RowResult:
        free = free_memory_bytes(self.device)
        need = case.working_set_bytes()
        if free is not None and need > self.memory_fraction * free:
            note = f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
            self.log(f"  skipped: {note}")
            return RowResult(case, "skipped", note=note)
        try:
            return self._run(case)
        finally:
            if self.use_compile:
                torch._dynamo.reset()  # drop this shape's compiled graph before the next row allocates
            release(self.device)

    def _run(self, case: BenchCase) -> RowResult:
        x, w, b = make_inputs(case, self.device)
        fast, eager = self.fastnorm_factory(case), self.eager_factory(case)
        row = RowResult(case, "ok")

        # Correctness first: a row whose output is wrong is reported FAILED and never timed.
        try:
            ref = eager(x, w, b)
        except Exception as exc:  # e.g. out of memory for the reference itself
            row.status, row.note = "skipped", f"reference failed: {_short(exc)}"
            self.log(f"  skipped: {row.note}")
            return row
        try:
            out = fast(x, w, b)
            row.check = compare(out, ref)
            del out
        except Exception as exc:
            row.check = CheckResult(math.nan, False, 0.0, 0.0, _short(exc))
        del ref
        release(self.device)
        c = row.check
        self.log(f"  check {'ok' if c.ok else 'FAILED'}: max abs err {c.max_abs_err:.2e}"
                 f" (atol {c.atol:g}, rtol {c.rtol:g}){' ' + c.error if c.error else ''}")
        if not c.ok:
            row.status = "failed"
            for impl in row.impls.values():
                impl.note = "not timed: check failed"
            return row

        nbytes = case.minimal_bytes()
        row.impls["fastnorm"] = self._timed("fastnorm", lambda: fast(x, w, b), nbytes)
        row.impls["eager"] = self._timed("eager", lambda: eager(x, w, b), nbytes)
        if self.use_compile:
            row.impls["compile"] = self._compiled(eager, (x, w, b), nbytes)
        else:
            row.impls["compile"] = ImplResult(note="n/a: compile off")
        return row

    def _time(self, fn):
        timing = {"flush_l2": self.plan.flush_l2, "include_host": self.plan.include_host}
        probe = self.timer(fn, device=self.device, trials=2, warmup=1, **timing)
        trials = self.plan.trials_for(probe.median_ms)
        return self.timer(fn, device=self.device, trials=trials, warmup=self.plan.warmup, **timing)

    def _timed(self, name, fn, nbytes, compile_s=None) -> ImplResult:
        try:
            result = impl_result(self._time(fn), nbytes, self.copy_bw)
        except Exception as exc:
            result = ImplResult(note=f"n/a: {_short(exc)}")
        if not result.timed:
            release(self.device)  # outside the handler: the traceback no longer pins its tensors
            self.log(f"  {name}: {result.note}")
            return result
        result.compile_s = compile_s
        pct = f", {result.pct_copy:.1f}% of copy" if result.pct_copy is not None else ""
        self.log(f"  {name}: {result.median_us:.1f} us, {result.gbs:.3g} GB/s{pct} ({result.trials} trials)")
        return result

    def _compiled(self, eager, args, nbytes) -> ImplResult:
        """torch.compile of the eager function, fresh for this shape; n/a when it cannot compile here."""
        failure = None
        try:
            torch._dynamo.reset()  # each shape compiles on its own, not as a recompile of the last one
            compiled = torch.compile(eager, dynamic=False)
            start = time.perf_counter()
            compiled(*args)
            _sync(self.device)
            compile_s = time.perf_counter() - start
        except Exception as exc:
            failure = ImplResult(note=f"n/a: {_short(exc)}")
        if failure is not None:
            release(self.device)
            self.log(f"  compile: {failure.note}")
            return failure
        self.log(f"  compile: compiled in {compile_s:.1f} s")
        return self._timed("compile", lambda: compiled(*args), nbytes, compile_s)
