"""What a worker process left behind, turned into a verdict or a baseline: shared by the local pool and Ray.

Torch-free (the evaluating process never imports torch). The timing verdict is the parent's (timing_verdict.py),
against the baseline measured on the GPU the candidate ran on.
"""
from __future__ import annotations

import os

from fastnorm.harness.isolation import ChildOutcome
from fastnorm.harness.messages import clip, process_death
from fastnorm.harness.report import Baseline, CandidateResult
from fastnorm.harness.timing_verdict import judge_timing


class EvaluationError(RuntimeError):
    """The evaluation as a whole cannot proceed (missing or broken reference)."""


def baseline_from(outcome: ChildOutcome, timeout: float, reference: str) -> Baseline:
    """The baseline worker's result, or EvaluationError saying why the reference could not be measured."""
    r = outcome.result
    if r is None or not r.get("ok"):
        why = (r or {}).get("message") or death_message(outcome, timeout, reference)
        raise EvaluationError(f"cannot evaluate against {os.path.basename(reference)}: {why}")
    return Baseline(device=r["device"], device_name=r["device_name"], torch_version=r["torch_version"],
                    ref_timing=r["ref_timing"], copy_bw=r["copy_bw"], min_bytes=r["min_bytes"],
                    outputs=r.get("outputs", []), copy_bw_large=r.get("copy_bw_large"),
                    copy_bw_same_size=r.get("copy_bw_same_size"), compiled_timing=r.get("compiled_timing"),
                    compile_error=r.get("compile_error"), timing_mode=r.get("timing_mode"))


def result_from(candidate: str, outcome: ChildOutcome, timeout: float, baseline: Baseline | None,
                floor_check: bool) -> CandidateResult:
    """The candidate's verdict from its judge's (or pre-build's) outcome; speedups against `baseline`."""
    r = outcome.result
    if r is None:
        verdict = "timeout" if outcome.timed_out else "runtime_error"
        return CandidateResult(candidate, verdict, death_message(outcome, timeout, candidate), stage=outcome.stage,
                               wall_s=outcome.wall_s, stage_s=outcome.stage_s)
    result = CandidateResult(candidate, r.get("verdict", "runtime_error"), r.get("message", ""),
                             max_abs_err=r.get("max_abs_err"), max_rel_err=r.get("max_rel_err"),
                             stage=r.get("stage", outcome.stage), wall_s=outcome.wall_s, stage_s=outcome.stage_s)
    timing = r.get("timing")
    if baseline is None or not timing:
        return result
    result.cand_timing = timing
    result.cand_ms = timing["median_ms"]
    result.ref_ms = baseline.ref_timing["median_ms"]
    mode, ref_mode = timing.get("mode"), baseline.timing_mode
    comparable = not (mode and ref_mode and mode != ref_mode)  # (a Ray node with another torch build, say)
    result.speedup = result.ref_ms / result.cand_ms if result.cand_ms > 0 and comparable else None
    if baseline.compiled_timing and comparable:
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
        elif not comparable:
            result.message = (f"no speedup: the reference was timed as {ref_mode!r}, this candidate as {mode!r} "
                              f"(different torch builds?)")
    return result


def import_succeeded(outcome: ChildOutcome) -> bool:
    return bool(outcome.result and outcome.result.get("verdict") == "ok")


def death_message(outcome: ChildOutcome, timeout: float, path: str) -> str:
    if outcome.timed_out:
        return f"no verdict within {timeout:g} s (it was at: {outcome.stage}); its whole process group was killed"
    return process_death(outcome.returncode, outcome.log_tail, path, outcome.stage)
