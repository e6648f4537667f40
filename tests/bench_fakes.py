"""Stand-ins shared by the bench tests: timing stats and result rows without running anything."""
from dataclasses import dataclass

from fastnorm.bench.cases import BenchCase
from fastnorm.bench.check import CheckResult
from fastnorm.bench.runner import IMPLS, RowResult, impl_result


@dataclass
class FakeStats:
    median_ms: float
    mean_ms: float
    min_ms: float
    q1_ms: float
    q3_ms: float
    trials: int

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms


def stats(median_ms: float, trials: int = 10) -> FakeStats:
    return FakeStats(median_ms, median_ms, 0.9 * median_ms, 0.95 * median_ms, 1.1 * median_ms, trials)


class FakeTimer:
    """Records every call; every implementation takes `ms` milliseconds."""

    def __init__(self, ms: float = 1.0):
        self.ms, self.calls = ms, []

    def __call__(self, fn, *, device, trials=100, warmup=3, flush_l2=True, include_host=True):
        for _ in range(warmup + trials):
            fn()
        self.calls.append(trials)
        self.include_host = include_host
        return stats(self.ms, trials)


def fake_row(case: BenchCase, times_ms: dict, copy_bw: float = 1e12, status: str = "ok",
             mode: str = "fwd") -> RowResult:
    """A finished row with the given median time per implementation (None: not timed)."""
    row = RowResult(case, status, CheckResult(1e-6 if status == "ok" else 0.5, status == "ok", 1e-4, 1e-4),
                    mode=mode)
    for name in IMPLS:
        ms = times_ms.get(name)
        if ms is not None:
            row.impls[name] = impl_result(stats(ms), case.minimal_bytes(mode), copy_bw)
        else:
            row.impls[name].note = "n/a: test"
    return row
