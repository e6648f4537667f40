"""`evaluate()`: the parent side of `fastnorm eval`. Torch-free - every build, forward and timing runs in a
child process (see worker.py), so a crash or a poisoned CUDA context costs one candidate, never the evaluator,
and the parent holds no GPU memory however many candidates it evaluates.

Order: the reference baseline (one child), then - with several candidates and jobs > 1 - every candidate is
imported in parallel so that load_inline builds overlap, then each candidate is verified and timed, one at a
time so that timings do not disturb each other: by a judge child (judge.py) that runs the candidate in a
process of its own (candidate_process.py) and never imports the candidate's code.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from fastnorm.harness.isolation import ChildOutcome, run_worker
from fastnorm.harness.messages import clip, process_death
from fastnorm.harness.report import Baseline, CandidateResult, EvalReport
from fastnorm.harness.timing_verdict import judge_timing


SHM_MIN_FREE_BYTES = 4 << 30


class EvaluationError(RuntimeError):
    """The evaluation as a whole cannot proceed (missing or broken reference)."""


def default_jobs() -> int:
    return max(1, min(8, (os.cpu_count() or 1) // 2))


def evaluate(reference, candidates, *, device: str | None = None, trials: int = 5, perf_trials: int = 100,
             warmup: int = 3, atol: float | None = None, rtol: float | None = None, timeout: float = 600.0,
             compile_baseline: bool = False, class_name: str = "ModelNew", seed: int = 42, jobs: int | None = None,
             floor_check: bool = True, scrub_freed_memory: bool = True, keep_temp: bool = False,
             progress: Callable[[str], None] | None = None) -> EvalReport:
    """Build, verify and time KernelBench-style candidates against a reference problem file.

    reference: file defining Model, get_inputs(), get_init_inputs(). candidates: one path or several, each
    defining `class_name`. device: "cuda", "cpu", "cuda:1"; None picks cuda when available. atol/rtol: None
    means 1e-4 for fp32 outputs, 1e-2 for fp16/bf16, exact for integers. timeout: seconds per child process.
    scrub_freed_memory=False disables one defence (only to demonstrate that it matters).
    Raises EvaluationError when the reference itself cannot be loaded, run or timed.
    """
    say = progress or (lambda _msg: None)
    ref_path = Path(reference).resolve()
    if not ref_path.is_file():
        raise EvaluationError(f"reference file not found: {reference}")
    cand_paths = [Path(candidates)] if isinstance(candidates, (str, os.PathLike)) else [Path(c) for c in candidates]
    cand_paths = [p.resolve() for p in cand_paths]
    if trials < 1 or perf_trials < 1:
        raise ValueError("trials and perf_trials must be >= 1")
    config = {"reference": str(ref_path), "class_name": class_name, "device": device or "auto", "trials": trials,
              "perf_trials": perf_trials, "warmup": warmup, "atol": atol, "rtol": rtol, "seed": seed,
              "compile_baseline": compile_baseline, "scrub_freed_memory": scrub_freed_memory}
    root = Path(tempfile.mkdtemp(prefix="fastnorm-eval-"))
    config["share_dir"] = str(_share_folder(root))
    try:
        say(f"reference: timing {ref_path.name}")
        baseline = _baseline(config, root / "reference", timeout * (2 if compile_baseline else 1))
        config["device"] = baseline.device
        say(f"reference: {baseline.ref_timing['median_ms']:.4g} ms on {baseline.device_name}")
        workdirs = [root / f"{i:03d}-{p.stem}" for i, p in enumerate(cand_paths)]
        finished = {i: CandidateResult(str(p), "load_error", f"candidate file not found: {p}")
                    for i, p in enumerate(cand_paths) if not p.is_file()}
        jobs = default_jobs() if jobs is None else jobs
        pending = [i for i in range(len(cand_paths)) if i not in finished]
        if jobs > 1 and len(pending) > 1:
            say(f"building: importing {len(pending)} candidates, {jobs} at a time")
            finished.update(_prebuild(config, cand_paths, workdirs, pending, jobs, timeout))
        results = []
        for i, path in enumerate(cand_paths):
            if i not in finished:
                outcome = run_worker({**config, "mode": "candidate", "candidate": str(path)}, workdirs[i], timeout)
                finished[i] = _result_from(str(path), outcome, timeout, baseline, floor_check)
            r = finished[i]
            say(f"[{i + 1}/{len(cand_paths)}] {r.name}: {r.verdict}"
                + (f" {r.speedup:.3g}x" if r.ok and r.speedup else "") + (f" - {r.message}" if r.message else ""))
            results.append(r)
    finally:
        if keep_temp:
            say(f"worker files kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(config["share_dir"], ignore_errors=True)
    settings = {k: v for k, v in config.items() if k not in ("reference", "device", "share_dir")}
    settings.update(timeout=timeout, floor_check=floor_check, jobs=jobs)
    return EvalReport(reference=str(ref_path), baseline=baseline, results=results, settings=settings)


def _baseline(config: dict, workdir: Path, timeout: float) -> Baseline:
    outcome = run_worker({**config, "mode": "baseline"}, workdir, timeout)
    r = outcome.result
    if r is None or not r.get("ok"):
        why = (r or {}).get("message") or _death_message(outcome, timeout, config["reference"])
        raise EvaluationError(f"cannot evaluate against {os.path.basename(config['reference'])}: {why}")
    return Baseline(device=r["device"], device_name=r["device_name"], torch_version=r["torch_version"],
                    ref_timing=r["ref_timing"], copy_bw=r["copy_bw"], min_bytes=r["min_bytes"],
                    outputs=r.get("outputs", []), copy_bw_large=r.get("copy_bw_large"),
                    copy_bw_same_size=r.get("copy_bw_same_size"), compiled_timing=r.get("compiled_timing"),
                    compile_error=r.get("compile_error"))


def _prebuild(config: dict, paths: list[Path], workdirs: list[Path], pending: Iterable[int], jobs: int,
              timeout: float) -> dict[int, CandidateResult]:
    """Import candidates in parallel (load_inline builds dominate); returns the ones that already failed."""
    def one(i):
        return i, run_worker({**config, "mode": "import", "candidate": str(paths[i])}, workdirs[i], timeout)

    failed = {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for i, outcome in pool.map(one, pending):
            if not (outcome.result and outcome.result.get("verdict") == "ok"):
                failed[i] = _result_from(str(paths[i]), outcome, timeout, None, True)
    return failed


def _result_from(candidate: str, outcome: ChildOutcome, timeout: float, baseline: Baseline | None,
                 floor_check: bool) -> CandidateResult:
    r = outcome.result
    if r is None:
        verdict = "timeout" if outcome.timed_out else "runtime_error"
        return CandidateResult(candidate, verdict, _death_message(outcome, timeout, candidate), stage=outcome.stage,
                               wall_s=outcome.wall_s)
    result = CandidateResult(candidate, r.get("verdict", "runtime_error"), r.get("message", ""),
                             max_abs_err=r.get("max_abs_err"), max_rel_err=r.get("max_rel_err"),
                             stage=r.get("stage", outcome.stage), wall_s=outcome.wall_s)
    timing = r.get("timing")
    if baseline is None or not timing:
        return result
    result.cand_timing = timing
    result.cand_ms = timing["median_ms"]
    result.ref_ms = baseline.ref_timing["median_ms"]
    result.speedup = result.ref_ms / result.cand_ms if result.cand_ms > 0 else None
    if baseline.compiled_timing:
        result.compiled_ms = baseline.compiled_timing["median_ms"]
        result.speedup_vs_compiled = result.compiled_ms / result.cand_ms if result.cand_ms > 0 else None
    if result.cand_ms > 0:
        result.achieved_gbps = baseline.min_bytes / (result.cand_ms * 1e-3) / 1e9
        result.pct_of_copy_bw = result.achieved_gbps * 1e9 / baseline.copy_bw * 100 if baseline.copy_bw else None
    if result.ok:
        reason = judge_timing(timing, baseline.min_bytes, baseline.copy_bw, floor_check,
                              baseline.ref_timing.get("device_tail_ms") or 0.0)
        if reason:
            result.verdict, result.message = "cheating", clip(reason)
    return result


def _death_message(outcome: ChildOutcome, timeout: float, path: str) -> str:
    if outcome.timed_out:
        return f"no verdict within {timeout:g} s (it was at: {outcome.stage}); its whole process group was killed"
    return process_death(outcome.returncode, outcome.log_tail, path, outcome.stage)


def _share_folder(root: Path) -> Path:
    """Where the candidate's process puts the buffers the judge maps on CPU: shared memory when there is room
    (a container's /dev/shm can be tiny), else beside the worker folders."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK):
            stat = os.statvfs(shm)
            if stat.f_bavail * stat.f_frsize >= SHM_MIN_FREE_BYTES:
                return Path(tempfile.mkdtemp(prefix="fastnorm-eval-", dir=shm))
    except OSError:
        pass
    folder = root / "shared"
    folder.mkdir()
    return folder
