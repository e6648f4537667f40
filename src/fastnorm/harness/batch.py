"""The units of a batch evaluation, and what a pool (pool.py on this host, ray_pool.py on a cluster) reports
back to the evaluating process's main thread as they happen. Torch-free."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

from fastnorm.harness.report import Baseline, CandidateResult


@dataclass
class Problem:
    index: int
    reference: Path
    candidates: list
    config: dict        # the workers' settings for this reference (trials, seed, tolerances, share_dir, ...)


@dataclass
class Job:
    index: int                  # the candidate's place in the batch (the report keeps this order)
    problem: Problem
    candidate: Path | None      # None: only measure the reference (its candidates all have results already)


@dataclass
class Finished:
    job: Job
    result: CandidateResult | None   # None: not run, its reference could not be measured


@dataclass
class Measured:
    problem: Problem
    where: str                       # the GPU (or CPU, or Ray node and GPU) the reference was measured on
    baseline: Baseline


@dataclass
class ReferenceFailed:
    problem: Problem
    message: str


Event = Union[Finished, Measured, ReferenceFailed]
Handler = Callable[[Event], None]   # called on the main thread; may raise to stop the whole batch
