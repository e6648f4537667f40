"""Honest timing of a callable on CUDA or CPU, and the device's copy bandwidth.

Shared by `fastnorm eval` (harness) and `fastnorm bench`. Every trial starts from an idle device with a
cold last-level cache, so reference and candidate are measured under the same conditions.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch


@dataclass
class TimingStats:
    median_ms: float
    mean_ms: float
    min_ms: float
    q1_ms: float
    q3_ms: float
    trials: int
    # Median time the device stayed busy after the callable's end event had completed: work the callable
    # left running on another stream, which the events do not see. ~0.01 ms for honest code; 0 on CPU.
    device_tail_ms: float = 0.0

    @property
    def iqr_ms(self) -> float:
        return self.q3_ms - self.q1_ms

    def to_dict(self) -> dict:
        return {**asdict(self), "iqr_ms": self.iqr_ms}

    @classmethod
    def from_samples(cls, samples_ms: list[float], tails_ms: list[float] | None = None) -> "TimingStats":
        if not samples_ms:
            raise ValueError("no timing samples")
        s = sorted(samples_ms)
        tail = _quantile(sorted(tails_ms), 0.5) if tails_ms else 0.0
        return cls(median_ms=_quantile(s, 0.5), mean_ms=sum(s) / len(s), min_ms=s[0],
                   q1_ms=_quantile(s, 0.25), q3_ms=_quantile(s, 0.75), trials=len(s), device_tail_ms=tail)


def _quantile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_values) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def time_callable(fn: Callable[[], object], *, device: torch.device, trials: int = 100, warmup: int = 3,
                  flush_l2: bool = True, include_host: bool = True) -> TimingStats:
    """Median/min/IQR of `fn()` over `trials` runs after `warmup` runs.

    CUDA: per trial the L2 cache is flushed (a buffer larger than L2 is overwritten), the device is synchronized,
    then CUDA events on the current stream bracket fn(). Afterwards a device-wide synchronize measures the
    "tail" - work fn() left behind on other streams (see TimingStats.device_tail_ms).
    include_host=False skips the synchronize after the flush: fn() is then issued while the flush still runs,
    so its host-side time (Python, argument checks, launches) hides behind the flush as it would behind
    earlier work in a GPU-bound program, and the events measure device time (triton's do_bench does this).
    CPU: perf_counter around fn(), the last-level cache flushed the same way.
    """
    device = torch.device(device)
    if trials < 1:
        raise ValueError("trials must be >= 1")
    if device.type == "cuda":
        return _time_cuda(fn, device, trials, warmup, flush_l2, include_host)
    return _time_host(fn, device, trials, warmup, flush_l2)


def _time_cuda(fn, device, trials, warmup, flush_l2, include_host) -> TimingStats:
    with torch.cuda.device(device):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        stream = torch.cuda.current_stream()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
        tails_ms = []
        for start, end in zip(starts, ends):
            if flush_l2:
                flush_cache(device)
            if include_host or not flush_l2:  # with nothing queued before it, host time always counts
                torch.cuda.synchronize()
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            t_end = time.perf_counter()
            torch.cuda.synchronize()  # device-wide: waits for every stream, including ones fn() hid work on
            tails_ms.append((time.perf_counter() - t_end) * 1e3)
        return TimingStats.from_samples([s.elapsed_time(e) for s, e in zip(starts, ends)], tails_ms)


def _time_host(fn, device, trials, warmup, flush_l2) -> TimingStats:
    for _ in range(warmup):
        fn()
    samples_ms = []
    for _ in range(trials):
        if flush_l2:
            flush_cache(device)
        t0 = time.perf_counter()
        fn()
        samples_ms.append((time.perf_counter() - t0) * 1e3)
    return TimingStats.from_samples(samples_ms)


def flush_cache(device: torch.device) -> None:
    """Evict the device's last-level cache by overwriting a buffer twice its size."""
    _flush_buffer(torch.device(device)).add_(1)


@functools.lru_cache(maxsize=None)
def _flush_buffer(device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or (128 << 20)
        nbytes = 2 * l2
    else:
        nbytes = min(2 * _host_llc_bytes(), 256 << 20)
    return torch.zeros(nbytes // 4, dtype=torch.int32, device=device)


def _host_llc_bytes() -> int:
    """Largest CPU cache size from sysfs (Linux); 32 MiB when unknown."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        try:
            text = path.read_text().strip().upper()
            unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            sizes.append(int(text.rstrip("KMG")) * unit)
        except (OSError, ValueError):
            pass
    return max(sizes, default=32 << 20)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, trials: int = 10, best: bool = False,
                   include_host: bool = True) -> float:
    """Bytes per second of a device-to-device tensor copy, counting bytes read + written (2 * nbytes per copy).

    The median over `trials` copies timed by time_callable (best=True: the fastest copy, for a conservative
    lower bound on time). On CPU this is a multi-threaded memcpy-like copy.
    """
    device = torch.device(device)
    nbytes = max(int(nbytes), 1 << 20)
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.zeros_like(src)
    stats = time_callable(lambda: dst.copy_(src), device=device, trials=trials, warmup=2,
                          include_host=include_host)
    return 2 * nbytes / ((stats.min_ms if best else stats.median_ms) * 1e-3)
