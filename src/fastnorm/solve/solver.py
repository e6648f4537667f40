"""`fastnorm solve` end to end: recognize, rewrite, emit, tune, verify with `fastnorm eval`, write.

Nothing is written to the output path unless `fastnorm eval` has found the final file correct.
"""
import gc
import importlib.util
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from fastnorm.solve import emit
from fastnorm.solve.problem import ReferenceProblem, UnsupportedProblem, load_problem
from fastnorm.solve.recognize import Recognition, recognize
from fastnorm.solve.rewrite import ForwardCode, apply_matches, generate_forward
from fastnorm.solve.trace import TracedModel, TensorInfo, trace_problem
from fastnorm.solve.tune import Trial, tune

SUPPORTED = (
    "nn.LayerNorm / F.layer_norm (trailing dims, with or without weight and bias); nn.RMSNorm / F.rms_norm; "
    "nn.BatchNorm1d/2d/3d / F.batch_norm (training with running statistics, eval); nn.GroupNorm / F.group_norm; "
    "nn.InstanceNorm1d/2d/3d / F.instance_norm; F.normalize (p 1 or 2); hand-written over any consecutive "
    "dims: LayerNorm (x - mean) / sqrt(var(unbiased=False) + eps) or * rsqrt(...), optionally * weight + bias; "
    "RMSNorm x / sqrt(mean(x**2, dim, keepdim=True) + eps) or x * rsqrt(...), optionally times a weight; "
    "L1 / L2 / Frobenius x / mean(|x|), x / sum(|x|), x / torch.norm(x, p, dim, keepdim=True) (p 1, 2, 'fro'; "
    "also Tensor.norm, torch.linalg.norm / vector_norm, sqrt(sum(x**2)), optionally clamp_min(eps))")


class SolveFailed(Exception):
    """The reference was understood but no verified solution came out of it."""


@dataclass
class Plan:
    """A reference problem understood: its graph rewritten and the new forward generated."""
    problem: ReferenceProblem
    traced: TracedModel
    recognition: Recognition
    forward: ForwardCode

    @property
    def matches(self) -> list:
        return self.recognition.matches

    def render(self, device_type: str, *, threads: int = 0, blocks_per_row: int = 0, tuned_on: str = "",
               kernel_sources=None, extension_code: Optional[str] = None) -> str:
        return emit.render_solution(self.problem, self.forward, self.matches, device_type, threads=threads,
                                    blocks_per_row=blocks_per_row, tuned_on=tuned_on,
                                    kernel_sources=kernel_sources, extension_code=extension_code)


def plan_solution(reference) -> Plan:
    """Load, trace and rewrite a reference problem; UnsupportedProblem if it has nothing to fuse."""
    problem = reference if isinstance(reference, ReferenceProblem) else load_problem(reference)
    traced = trace_problem(problem)
    recognition = recognize(traced.graph_module)
    if not recognition.matches:
        raise UnsupportedProblem(no_match_message(problem, recognition))
    apply_matches(traced.graph_module.graph, recognition.matches)
    forward = generate_forward(traced.graph_module.graph, emit.forward_signature(problem))
    return Plan(problem, traced, recognition, forward)


def no_match_message(problem: ReferenceProblem, recognition: Recognition) -> str:
    ops = list(dict.fromkeys(recognition.ops))
    lines = [f"{problem.path.name}: no normalization fastnorm can fuse in Model.forward",
             f"  found: {', '.join(ops) if ops else 'no operations at all'}"]
    if recognition.other_norms:
        lines.append(f"  normalizations not supported: {'; '.join(recognition.other_norms)}")
    lines.append(f"  supported: {SUPPORTED}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------


@dataclass
class Verification:
    correct: bool
    message: str
    speedup: Optional[float] = None
    reference_ms: Optional[float] = None
    solution_ms: Optional[float] = None
    details: dict = field(default_factory=dict)


@dataclass
class SolveResult:
    output: Path
    plan: Plan
    trials: list
    chosen: Trial
    reference_ms: float
    verification: Verification
    target_met: bool


def device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"


def import_solution(path: Path):
    """Import a generated solution file as a fresh module (builds or loads its extension)."""
    name = f"fastnorm_solution_candidate_{abs(hash((str(path), time.time_ns()))):x}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _release_memory(device: torch.device) -> None:
    """Give the GPU memory back before `fastnorm eval` runs its own processes on the same device."""
    gc.collect()
    if device.type == "cuda":
        try:
            torch.cuda.empty_cache()
        except RuntimeError:  # a poisoned context (see tune): eval runs in fresh processes anyway
            pass


def solve(reference, output, *, device: Optional[str] = None, target_speedup: Optional[float] = None,
          tune_trials: int = 20, eval_trials: int = 5, perf_trials: int = 100,
          log: Callable[[str], None] = print, verify: Optional[Callable] = None) -> SolveResult:
    """Write a verified ModelNew for `reference` to `output`. Raises UnsupportedProblem (nothing to fuse,
    nothing written) or SolveFailed (no correct solution, nothing written)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UnsupportedProblem("--device cuda, but torch sees no CUDA device (use --device cpu)")
    if device.type not in ("cuda", "cpu"):
        raise UnsupportedProblem(f"device {device}: fastnorm has kernels for cuda and cpu only")
    output = Path(output)
    verify = verify or verify_with_eval

    plan = plan_solution(reference)
    problem = plan.problem
    log(f"fastnorm solve: {problem.path}")
    inputs_text = ", ".join(v.describe() if isinstance(v, TensorInfo) else repr(v) for v in plan.traced.input_infos)
    log(f"traced Model.forward with torch.fx (shapes propagated on {plan.traced.shapes_on}): inputs {inputs_text}")
    if plan.traced.attrs_traced != (float, int):
        kinds = "float" if plan.traced.attrs_traced else "number"
        log(f"  note: the forward uses {kinds} attributes in Python control flow; their traced values are "
            "baked into the new forward")
    log(f"recognized {len(plan.matches)} normalization{'s' if len(plan.matches) != 1 else ''}:")
    for i, match in enumerate(plan.matches, 1):
        log(f"  {i}. {match.describe()}")
    for other in plan.recognition.other_norms:
        log(f"  left as PyTorch: {other}")
    log("new forward:" + ("" if plan.forward.direct else " (torch.fx generated)"))
    for line in plan.forward.source.rstrip().splitlines():
        log("    " + line)

    workdir = Path(tempfile.mkdtemp(prefix="fastnorm_solve_"))
    try:
        candidate = workdir / output.name
        candidate.write_text(plan.render(device.type))
        log(f"building the inline {device.type} extension (cached after the first build)...")
        start = time.perf_counter()
        module = import_solution(candidate)
        log(f"  ready in {time.perf_counter() - start:.1f} s")

        init = problem.init_inputs()
        reference_model = problem.build_model(device).eval()
        model_new = module.ModelNew(*init).to(device).eval()
        model_new.load_state_dict(reference_model.state_dict())
        inputs = problem.inputs(device)
        from fastnorm.harness.timing import time_callable

        target = f" until {target_speedup:g}x" if target_speedup else ""
        log(f"timing launch configurations on {device_label(device)}{target}:")
        best, trials, reference_ms = tune(module, model_new, reference_model, inputs, device,
                                          target_speedup=target_speedup, timer=time_callable,
                                          trials=tune_trials, log=log,
                                          launch_overrides=emit.uses_launch_config(plan.forward))
        del reference_model, model_new, inputs, module
        _release_memory(device)
        if best is None:
            raise SolveFailed("every launch configuration failed or gave wrong results:\n  " +
                              "\n  ".join(f"{t.label}: {t.error}" for t in trials))
        log(f"chosen: {best.label} ({best.ms:.4g} ms, {best.speedup:.2f}x in the tuning runs)")

        candidate.write_text(plan.render(device.type, threads=best.threads, blocks_per_row=best.blocks_per_row,
                                         tuned_on=device_label(device)))
        log(f"verifying with fastnorm eval ({eval_trials} correctness trials, {perf_trials} timing trials)...")
        verification = verify(problem.path, candidate, device=device, trials=eval_trials, perf_trials=perf_trials,
                              log=log)
        if not verification.correct:
            raise SolveFailed(f"fastnorm eval rejected the solution: {verification.message}")
        log(f"verified: {verification.message}")
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = output.with_name(f".{output.name}.partial")
        shutil.copyfile(candidate, staging)
        os.replace(staging, output)
        log(f"wrote {output}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    speedup = verification.speedup
    target_met = target_speedup is None or (speedup is not None and speedup >= target_speedup)
    return SolveResult(output, plan, trials, best, reference_ms, verification, target_met)


# ----------------------------------------------------------------------------------------------


def verify_with_eval(reference_path: Path, candidate_path: Path, *, device: torch.device, trials: int,
                     perf_trials: int, log: Callable[[str], None] = print) -> Verification:
    """Run `fastnorm eval` (fastnorm.harness.evaluate) on the one candidate and read its verdict."""
    from fastnorm.harness import EvaluationError, evaluate

    try:
        report = evaluate(str(reference_path), [str(candidate_path)], device=str(device), trials=trials,
                          perf_trials=perf_trials, progress=lambda line: log(f"  eval: {line}"))
    except EvaluationError as err:
        return Verification(False, f"the evaluator could not run the reference: {err}")
    result = report.results[0]
    if not result.ok:
        return Verification(False, f"{result.verdict}: {result.message}", details=result.to_dict())
    parts = ["correct"]
    if result.max_abs_err is not None:
        parts[0] += f" (max abs error {result.max_abs_err:.3g})"
    if result.speedup is not None:
        parts.append(f"speedup {result.speedup:.3g}x")
    if result.ref_ms is not None and result.cand_ms is not None:
        parts.append(f"reference {result.ref_ms:.4g} ms, ModelNew {result.cand_ms:.4g} ms")
    return Verification(True, ", ".join(parts), result.speedup, result.ref_ms, result.cand_ms,
                        details=result.to_dict())
