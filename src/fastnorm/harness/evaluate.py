"""`evaluate()` and `evaluate_batch()`: the parent side of `fastnorm eval`. Torch-free - every build, forward
and timing runs in a child process (see worker.py), so a crash or a poisoned CUDA context costs one candidate,
never the evaluator, and the parent holds no GPU memory however many candidates it evaluates.

Each reference is measured (baseline worker) on every GPU that judges its candidates; each candidate is
judged by a judge process (judge.py) that runs it in a process of its own (candidate_process.py) and never
imports its code. Candidates are spread over a pool: on this host one timing slot per GPU plus a build pool
(pool.py), or one Ray task each (ray_pool.py). Results stream to an optional JSON Lines file as they finish.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Callable

from fastnorm.harness.batch import Finished, Job, Measured, Problem, ReferenceFailed
from fastnorm.harness.isolation import make_share_folder
from fastnorm.harness.manifest import expand_candidates
from fastnorm.harness.outcomes import EvaluationError
from fastnorm.harness.pool import LocalPool, plan_slots
from fastnorm.harness.progress import ProgressLine
from fastnorm.harness.report import BatchReport, CandidateResult, EvalReport
from fastnorm.harness.results_log import ResultsLog, result_key

__all__ = ["evaluate", "evaluate_batch", "EvaluationError"]

TIMING_MODES = ("device", "host")  # timing.TIMING_MODES (this module stays torch-free)
# Device time: each call issued behind the L2 flush and a spin on every SM, so medians repeat within 0.4%
# (results/h100-eval-steadiness.txt) where host time spread by 9-14%.
DEFAULT_TIMING = "device"  # timing.DEFAULT_TIMING


def evaluate(reference, candidates, *, device: str | None = None, trials: int = 5, perf_trials: int = 100,
             warmup: int = 3, atol: float | None = None, rtol: float | None = None, timeout: float = 600.0,
             compile_baseline: bool = False, class_name: str = "ModelNew", seed: int = 42, jobs: int | None = None,
             build_jobs: int | None = None, jsonl=None, resume: bool = False, ray=None, floor_check: bool = True,
             scrub_freed_memory: bool = True, keep_temp: bool = False, extensions_dir: str | None = None,
             timing: str = DEFAULT_TIMING, progress: Callable[[str], None] | None = None) -> EvalReport:
    """Build, verify and time KernelBench-style candidates against a reference problem file.

    reference: file defining Model, get_inputs(), get_init_inputs(). candidates: one path or several (files,
    directories of *.py, globs), each defining `class_name`. device: "cuda" (every visible GPU), "cuda:N",
    "cpu"; None picks cuda when a GPU is visible. atol/rtol: None means 1e-4 for fp32 outputs, 1e-2 for
    fp16/bf16, exact for integers. timeout: seconds per child process.
    jobs: candidates judged at once - default one per visible GPU (at most one per GPU), 1 on CPU.
    build_jobs: candidate imports (load_inline builds) run ahead of the judges, overlapping timing - default
    0 (each judge builds its own); min(8, cores / 2) suits several candidates on CUDA.
    jsonl: append one JSON object per candidate to this file as it finishes; resume: keep that file's
    results and skip their candidates. ray: run on a Ray cluster instead - an address, or True / "local" for
    a local instance (needs `pip install fastnorm[ray]`).
    scrub_freed_memory=False disables one defence (only to demonstrate that it matters).
    extensions_dir: build (and find built) the candidates' load_inline extensions there instead of in a
    directory of each candidate's own; only for candidates whose extension names cannot clash (fastnorm
    solve's, named by a hash of their sources, verified after it built them there). Local pool only.
    timing: "host" (default) starts each call on an idle GPU, so its host time counts too (KernelBench's
    convention); "device" times device time - each call is issued while the L2 flush and a ~1 ms spin still
    run, so its host side (Python, launches) overlaps as in a GPU-bound program and the medians are steadier
    across processes, but work started on a stream that does not wait for the caller's can hide under the
    spin (tests/candidates/side_stream_no_wait.py), which is why it is not the default. Reference and candidates are always timed in the same mode; CPU: wall clock.
    Raises EvaluationError when the reference itself cannot be loaded, run or timed.
    """
    batch = evaluate_batch([(reference, candidates)], device=device, trials=trials, perf_trials=perf_trials,
                           warmup=warmup, atol=atol, rtol=rtol, timeout=timeout, compile_baseline=compile_baseline,
                           class_name=class_name, seed=seed, jobs=jobs, build_jobs=build_jobs, jsonl=jsonl,
                           resume=resume, ray=ray, floor_check=floor_check, scrub_freed_memory=scrub_freed_memory,
                           keep_temp=keep_temp, extensions_dir=extensions_dir, timing=timing, progress=progress,
                           strict=True)
    return batch.reports[0]


def evaluate_batch(problems, *, device: str | None = None, trials: int = 5, perf_trials: int = 100, warmup: int = 3,
                   atol: float | None = None, rtol: float | None = None, timeout: float = 600.0,
                   compile_baseline: bool = False, class_name: str = "ModelNew", seed: int = 42,
                   jobs: int | None = None, build_jobs: int | None = None, jsonl=None, resume: bool = False,
                   ray=None, floor_check: bool = True, scrub_freed_memory: bool = True, keep_temp: bool = False,
                   extensions_dir: str | None = None, timing: str = DEFAULT_TIMING,
                   progress: Callable[[str], None] | None = None, strict: bool = False) -> BatchReport:
    """evaluate() over several problems at once: problems is [(reference, candidates), ...] (see
    manifest.read_manifest). A reference that cannot be measured is reported in BatchReport.errors and its
    candidates are not run (strict=True raises EvaluationError instead)."""
    say = progress or (lambda _msg: None)
    if trials < 1 or perf_trials < 1:
        raise ValueError("trials and perf_trials must be >= 1")
    if resume and not jsonl:
        raise ValueError("resume needs the JSON Lines file of the earlier run (jsonl=PATH, --jsonl PATH)")
    if build_jobs is not None and build_jobs < 0:
        raise ValueError("--build-jobs must be >= 0")
    if extensions_dir is not None and ray is not None and ray is not False:
        raise ValueError("extensions_dir is for the local pool: Ray tasks build on their own nodes")
    if timing not in TIMING_MODES:
        raise ValueError(f"timing must be one of {', '.join(TIMING_MODES)}, not {timing!r}")
    # settings travel to every worker (the problem's config; Ray ships it with each task): the baseline
    # and the judge read "timing" from there.
    settings = {"class_name": class_name, "trials": trials, "perf_trials": perf_trials, "warmup": warmup,
                "atol": atol, "rtol": rtol, "seed": seed, "compile_baseline": compile_baseline,
                "scrub_freed_memory": scrub_freed_memory, "timing": timing}
    resolved = []
    for reference, candidates in problems:
        ref_path = Path(reference).resolve()
        if not ref_path.is_file():
            raise EvaluationError(f"reference file not found: {reference}")
        resolved.append((ref_path, expand_candidates(ref_path, candidates)))

    root = Path(tempfile.mkdtemp(prefix="fastnorm-eval-"))
    share_dir = make_share_folder(root)
    log = None
    try:
        log = ResultsLog(jsonl, resume) if jsonl else None
        run = _BatchRun(resolved, settings, str(share_dir), log, say, strict)
        pending = run.pending_jobs()
        to_run = sum(job.candidate is not None for job in pending)
        if ray is not None and ray is not False:
            from fastnorm.harness.ray_pool import RayPool

            pool = RayPool("local" if ray is True else ray, device, jobs, timeout=timeout, floor_check=floor_check,
                           compile_baseline=compile_baseline)
            where, jobs = f"Ray ({pool.describe()})", pool.in_flight
        else:
            slots = plan_slots(device, jobs)
            if build_jobs is None:  # opt-in until the build pool has run on a GPU (it has only on CPU)
                build_jobs = 0
            pool = LocalPool(slots, build_jobs=build_jobs, timeout=timeout, floor_check=floor_check, root=root,
                             keep_temp=keep_temp, baseline_timeout=timeout * (2 if compile_baseline else 1),
                             extensions_dir=extensions_dir)
            places = [s.where for s in slots]
            where = (f"{places[0]} x{len(places)}" if len(set(places)) == 1 and len(places) > 1 else ", ".join(places))
            where += f"; {build_jobs} builds at a time" if build_jobs else ""
            jobs = len(slots)
        resumed = f", {len(run.resumed)} done before ({jsonl})" if resume else ""
        say(f"{run.total} candidates{resumed}; {to_run} to run on {where}")
        pool.run(pending, run.handle)
    finally:
        if log is not None:
            log.close()
        if keep_temp:
            say(f"worker files kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(share_dir, ignore_errors=True)
    settings.update(timeout=timeout, floor_check=floor_check, jobs=jobs, build_jobs=build_jobs,
                    backend="ray" if ray is not None and ray is not False else "local")
    return run.report(settings)


class _BatchRun:
    """The evaluating process's record of a batch: results by candidate, baselines by where they were
    measured, failed references; writes the JSON Lines file and the progress line as events arrive."""

    def __init__(self, problems: list, settings: dict, share_dir: str, log: ResultsLog | None, say, strict: bool):
        self.problems = [Problem(i, ref, cands, {**settings, "reference": str(ref), "share_dir": share_dir})
                         for i, (ref, cands) in enumerate(problems)]
        self.log, self.say, self.strict = log, say, strict
        self.results: dict[int, CandidateResult] = {}
        self.baselines: dict[int, dict] = {p.index: {} for p in self.problems}
        self.errors: dict[int, str] = {}
        self.jobs: list[Job] = []
        self.resumed: dict[int, CandidateResult] = {}
        done = log.done if log is not None else {}
        for problem in self.problems:
            for path in problem.candidates:
                job = Job(len(self.jobs), problem, path)
                self.jobs.append(job)
                if result_key(problem.reference, path) in done:
                    self.resumed[job.index] = done[result_key(problem.reference, path)]
        self.total = len(self.jobs)
        self.progress = ProgressLine(self.total, say, self.resumed.values())
        self.results.update(self.resumed)

    def pending_jobs(self) -> list[Job]:
        """Candidates still to run; missing files get their verdict here. A problem whose candidates all have
        results still gets its reference measured, for the report's baseline."""
        pending = []
        for job in self.jobs:
            if job.index in self.results:
                continue
            if not job.candidate.is_file():
                self._finished(job, CandidateResult(str(job.candidate), "load_error",
                                                    f"candidate file not found: {job.candidate}"))
            else:
                pending.append(job)
        busy = {job.problem.index for job in pending}
        pending += [Job(-1, p, None) for p in self.problems if p.index not in busy]
        return pending

    def handle(self, event) -> None:
        if isinstance(event, Measured):
            self.progress.reference_measured()
            self.baselines[event.problem.index][event.where] = event.baseline
            ref = event.baseline.ref_timing
            self.say(f"reference {event.problem.reference.name}: {ref['median_ms']:.4g} ms on "
                     f"{event.baseline.device_name} ({event.where})")
        elif isinstance(event, ReferenceFailed):
            if self.strict:
                raise EvaluationError(event.message)
            self.errors[event.problem.index] = event.message
            self.say(f"reference {event.problem.reference.name}: {event.message}; its candidates are skipped")
        elif isinstance(event, Finished) and event.result is not None and event.job.index >= 0 \
                and event.job.problem.index not in self.errors:
            self._finished(event.job, event.result)

    def _finished(self, job: Job, result: CandidateResult) -> None:
        self.results[job.index] = result
        if self.log is not None:
            self.log.write(job.problem.reference, result)
        self.progress.finished(result)

    def report(self, settings: dict) -> BatchReport:
        reports, errors = [], {}
        for problem in self.problems:
            baselines = self.baselines[problem.index]
            if problem.index in self.errors or not baselines:
                errors[str(problem.reference)] = self.errors.get(problem.index, "the reference was not measured")
                continue
            results = [self.results[j.index] for j in self.jobs if j.problem is problem and j.index in self.results]
            reports.append(EvalReport(reference=str(problem.reference), baseline=next(iter(baselines.values())),
                                      results=results, settings=settings, baselines=dict(baselines)))
        return BatchReport(reports, errors)
