"""The progress line of a batch: one line on stderr per finished candidate, with done / total, the verdicts
so far and an estimate of the time left (from the candidates finished in this run only, not resumed ones,
counted from the first reference's measurement: on a fresh GPU machine that takes a minute, 20 candidates'
worth, and made the first estimates 30 minutes for 2)."""
from __future__ import annotations

import time
from collections import Counter
from typing import Callable

from fastnorm.harness.report import VERDICTS, CandidateResult


class ProgressLine:
    def __init__(self, total: int, say: Callable[[str], None], already_done=()):
        self.total, self.say = total, say
        self.counts = Counter(r.verdict for r in already_done)
        self.done = self.resumed = sum(self.counts.values())
        self.start = time.monotonic()
        self.timed_from_reference = False

    def reference_measured(self) -> None:
        """Candidates are judged from here on: the estimate's clock starts (once, before any finished)."""
        if self.done == self.resumed and not self.timed_from_reference:
            self.start, self.timed_from_reference = time.monotonic(), True

    def finished(self, result: CandidateResult) -> None:
        self.done += 1
        self.counts[result.verdict] += 1
        where = f" on gpu {result.gpu}" if result.gpu is not None else ""
        if result.worker and result.worker.startswith("ray"):
            where += f" ({result.worker})"
        text = (f"[{self.done}/{self.total}] {result.name}: {result.verdict}"
                + (f" {result.speedup:.3g}x" if result.ok and result.speedup else "") + where
                + (f" - {result.message}" if result.message else ""))
        self.say(f"{text} | {self.verdicts()}{self.eta()}")

    def verdicts(self) -> str:
        return ", ".join(f"{v} {self.counts[v]}" for v in VERDICTS if self.counts[v])

    def eta(self) -> str:
        ran = self.done - self.resumed
        left = self.total - self.done
        if ran <= 0 or left <= 0:
            return ""
        return f" | ETA {format_seconds((time.monotonic() - self.start) / ran * left)}"


def format_seconds(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
