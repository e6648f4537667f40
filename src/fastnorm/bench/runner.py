"""Runs one bench row on a device in one mode (fwd, bwd, train): memory gate, correctness check, then
timing of fastnorm, PyTorch eager, torch.compile and Liger (where it imports). Frees the row's tensors
before returning, so the next row starts clean."""
import contextlib
from dataclasses import dataclass, field
import gc
import math
import os
import time
from typing import Callable, Optional

import torch

from fastnorm.bench import modes
from fastnorm.bench.cases import (BenchCase, Unavailable, eager_fn, fastnorm_fn, liger_fn, make_grad_output,
                                  make_inputs)
from fastnorm.bench.check import CheckResult, check_gradients, combine, compare

IMPLS = ("fastnorm", "eager", "compile", "liger")
BASELINES = IMPLS[1:]  # what fastnorm is compared with


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
    mode: str = "fwd"                 # what was timed (modes.MODES): sets the row's minimal bytes

    def speedup_vs(self, baseline: str) -> Optional[float]:
        """baseline time / fastnorm time (both medians), None when either is missing."""
        ours, theirs = self.impls["fastnorm"], self.impls[baseline]
        if not (ours.timed and theirs.timed) or ours.median_us <= 0:
            return None
        return theirs.median_us / ours.median_us

    def best_baseline(self) -> Optional[str]:
        """The fastest timed baseline (eager, compile or liger), None when none was timed."""
        timed = [name for name in BASELINES if self.impls[name].timed]
        return min(timed, key=lambda name: self.impls[name].median_us) if timed else None

    def speedup_vs_best(self) -> Optional[float]:
        """The fastest baseline's time / fastnorm's: below 1 where some baseline beats fastnorm."""
        best = self.best_baseline()
        return None if best is None else self.speedup_vs(best)


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


def _compile_settings(mode: str):
    """torch.compile's backward donates saved buffers and then refuses retain_graph=True, which the bwd
    mode's timed call uses: donation off for that mode (torch versions without the switch never donate)."""
    if mode == "bwd":
        try:
            import torch._functorch.config as functorch_config
        except ImportError:
            functorch_config = None
        if hasattr(functorch_config, "donated_buffer"):
            return functorch_config.patch(donated_buffer=False)
    return contextlib.nullcontext()


class _ReferenceFailed(Exception):
    """PyTorch's own reference could not run (e.g. out of memory): the row is skipped, not FAILED."""


class Runner:
    """Runs cases on one device in one mode. `timer` has harness.timing.time_callable's signature; the
    fn factories exist so tests can run the runner with stand-ins for fastnorm and the baselines."""

    def __init__(self, device: torch.device, plan: TimingPlan, copy_bw: float, *, use_compile=True,
                 timer: Optional[Callable] = None, fastnorm_factory=fastnorm_fn, eager_factory=eager_fn,
                 liger_factory=liger_fn, log: Callable[[str], None] = print, memory_fraction: float = 0.9,
                 mode: str = "fwd"):
        if timer is None:
            from fastnorm.harness.timing import time_callable as timer
        modes.needs_grad(mode)  # an unknown mode fails here, not after the first row
        self.device, self.plan, self.copy_bw, self.mode = device, plan, copy_bw, mode
        self.use_compile, self.timer, self.log = use_compile, timer, log
        self.fastnorm_factory, self.eager_factory, self.liger_factory = fastnorm_factory, eager_factory, liger_factory
        self.memory_fraction = memory_fraction
        self._told = set()  # skip reasons already logged (one line, not one per row)

    def run(self, case: BenchCase) -> RowResult:
        free = free_memory_bytes(self.device)
        need = case.working_set_bytes(self.mode)
        if free is not None and need > self.memory_fraction * free:
            note = f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
            self.log(f"  skipped: {note}")
            return RowResult(case, "skipped", note=note, mode=self.mode)
        try:
            return self._run(case)
        finally:
            if self.use_compile:
                torch._dynamo.reset()  # drop this shape's compiled graph before the next row allocates
            release(self.device)

    def _run(self, case: BenchCase) -> RowResult:
        grad = modes.needs_grad(self.mode)
        x, w, b = make_inputs(case, self.device, requires_grad=grad)
        dy = make_grad_output(case, self.device) if grad else None
        fast, eager = self.fastnorm_factory(case), self.eager_factory(case)
        row = RowResult(case, "ok", mode=self.mode)

        # Correctness first: a row whose output or gradients are wrong is reported FAILED, never timed.
        try:
            row.check = self._check(case, fast, eager, x, w, b, dy)
        except _ReferenceFailed as exc:
            row.status, row.note = "skipped", f"reference failed: {exc}"
            self.log(f"  skipped: {row.note}")
            return row
        finally:
            release(self.device)
        c = row.check
        self.log(f"  check {'ok' if c.ok else 'FAILED'}: max abs err {c.max_abs_err:.2e}"
                 f" (atol {c.atol:g}, rtol {c.rtol:g}){' ' + c.error if c.error else ''}")
        if not c.ok:
            row.status = "failed"
            for impl in row.impls.values():
                impl.note = "not timed: check failed"
            return row

        nbytes, args = case.minimal_bytes(self.mode), (x, w, b, dy)
        row.impls["fastnorm"] = self._timed("fastnorm", lambda: modes.timed_call(self.mode, fast, *args), nbytes)
        row.impls["eager"] = self._timed("eager", lambda: modes.timed_call(self.mode, eager, *args), nbytes)
        if self.use_compile:
            row.impls["compile"] = self._compiled(eager, args, nbytes)
        else:
            row.impls["compile"] = ImplResult(note="n/a: compile off")
        row.impls["liger"] = self._liger(case, args, nbytes)
        return row

    def _check(self, case, fast, eager, x, w, b, dy) -> CheckResult:
        """fastnorm's output (fwd, train) against eager's, and its gradients (bwd, train) against
        eager's in float64. Raises _ReferenceFailed when the reference cannot run."""
        results = {}
        ref = None
        if self.mode != "bwd":
            try:
                with torch.no_grad():
                    ref = eager(x, w, b)
            except Exception as exc:  # e.g. out of memory for the reference itself
                raise _ReferenceFailed(_short(exc)) from None
        try:
            out = fast(x, w, b)
            if ref is not None:
                results["y"] = compare(out.detach(), ref)
                ref = None
            grads = None
            if dy is not None:
                got = iter(torch.autograd.grad(out, modes.grad_inputs(x, w, b), dy))
                grads = tuple(next(got) if t is not None else None for t in (x, w, b))
            del out
        except Exception as exc:
            return CheckResult(math.nan, False, 0.0, 0.0, _short(exc))
        if grads is not None:
            try:
                results.update(check_gradients(grads, eager, x, w, b, dy, case.dims[0]))
            except Exception as exc:
                raise _ReferenceFailed(_short(exc)) from None
        return combine(results)

    def _time(self, fn):
        timing = {"flush_l2": self.plan.flush_l2, "include_host": self.plan.include_host}
        probe = self.timer(fn, device=self.device, trials=2, warmup=1, **timing)
        trials = self.plan.trials_for(probe.median_ms)
        return self.timer(fn, device=self.device, trials=trials, warmup=self.plan.warmup, **timing)

    def _timed(self, name, make_call, nbytes, compile_s=None) -> ImplResult:
        """Times the callable make_call() returns (for bwd, making it runs the forward): an ImplResult,
        n/a with the reason when it raises. Nothing holds the callable afterwards, so its graph and
        tensors are freed (by reference count) before the next implementation runs."""
        try:
            result = impl_result(self._time(make_call()), nbytes, self.copy_bw)
        except Unavailable as exc:
            result = ImplResult(note=f"skipped: {exc}")
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
        """torch.compile of the eager function, fresh for this shape; n/a when it cannot compile here.
        compile_s is the first call's wall time (bwd and train: forward and backward both compile)."""
        with _compile_settings(self.mode):
            failure = None
            try:
                torch._dynamo.reset()  # each shape compiles on its own, not as a recompile of the last one
                compiled = torch.compile(eager, dynamic=False)
                start = time.perf_counter()
                call = modes.timed_call(self.mode, compiled, *args)
                call()
                _sync(self.device)
                compile_s = time.perf_counter() - start
            except Exception as exc:
                failure = ImplResult(note=f"n/a: {_short(exc)}")
            if failure is not None:
                release(self.device)
                self.log(f"  compile: {failure.note}")
                return failure
            self.log(f"  compile: compiled in {compile_s:.1f} s")
            return self._timed("compile", lambda: call, nbytes, compile_s)

    def _liger(self, case, args, nbytes) -> ImplResult:
        """Liger's LayerNorm / RMSNorm: skipped (with the reason) where liger_kernel does not import or
        does not take the case."""
        try:
            liger = self.liger_factory(case)
        except Unavailable as exc:
            note = f"skipped: {exc}"
            if note not in self._told:
                self._told.add(note)
                self.log(f"  liger: {note}")
            return ImplResult(note=note)
        return self._timed("liger", lambda: modes.timed_call(self.mode, liger, *args), nbytes)
