"""`fastnorm solve` end to end: recognize, rewrite, record the kernel calls on the traced shapes, emit
the kernels they need, build once, tune, verify with `fastnorm eval` (on that build), write.

Nothing is written to the output path unless `fastnorm eval` has found the final file correct.
"""
import functools
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

from fastnorm.harness.evaluate import DEFAULT_TIMING
from fastnorm.solve import emit, fused_helpers, kernel_needs
from fastnorm.solve.extension_calls import record_calls
from fastnorm.solve.planner_rules import CudaDevice
from fastnorm.solve.problem import ReferenceProblem, UnsupportedProblem, load_problem
from fastnorm.solve.recognize import Recognition, recognize
from fastnorm.solve.rewrite import ForwardCode, apply_matches, fuse_activations, generate_forward
from fastnorm.solve.trace import TracedModel, TensorInfo, trace_problem
from fastnorm.solve.tune import Trial, candidate_configs, tune

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
               kernel_sources=None, extension_code: Optional[str] = None, selection=None) -> str:
        return emit.render_solution(self.problem, self.forward, self.matches, device_type, threads=threads,
                                    blocks_per_row=blocks_per_row, tuned_on=tuned_on,
                                    kernel_sources=kernel_sources, extension_code=extension_code,
                                    selection=selection)


def plan_solution(reference) -> Plan:
    """Load, trace and rewrite a reference problem; UnsupportedProblem if it has nothing to fuse."""
    problem = reference if isinstance(reference, ReferenceProblem) else load_problem(reference)
    traced = trace_problem(problem)
    recognition = recognize(traced.graph_module)
    if not recognition.matches:
        raise UnsupportedProblem(no_match_message(problem, recognition))
    apply_matches(traced.graph_module.graph, recognition.matches)
    fuse_activations(traced.graph_module)
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


# The final check's timed runs when the caller names none: 100 on CUDA; on the CPU, whose calls take
# 10-1000 ms, as many as fit about CPU_TIMING_BUDGET_MS of the slower model (the reference or the
# chosen candidate, as the tuning timed them), 20 to 100. On 2 cores a LayerNorm problem's 100 runs
# took 45 of a solve's 82 s (each trial also flushes the cache and scrubs the 268 MB output), and the
# median of 20 runs of a 100 ms call is as steady there.
CPU_TIMING_BUDGET_MS = 3000.0


SINGLE_CONFIG_RUNS = 3  # timed runs of a lone launch configuration (see Tuning.run)


def default_perf_trials(device: torch.device, reference_ms: Optional[float], candidate_ms: Optional[float]) -> int:
    if device.type != "cpu":
        return 100
    slower = max(reference_ms or 0.0, candidate_ms or 0.0)
    if slower <= 0:
        return 100
    return max(20, min(100, int(CPU_TIMING_BUDGET_MS / slower)))


def solve(reference, output, *, device: Optional[str] = None, target_speedup: Optional[float] = None,
          tune_trials: int = 20, eval_trials: int = 5, perf_trials: Optional[int] = None,
          log: Callable[[str], None] = print, verify: Optional[Callable] = None,
          timing: str = DEFAULT_TIMING) -> SolveResult:
    """Write a verified ModelNew for `reference` to `output`. Raises UnsupportedProblem (nothing to fuse,
    nothing written) or SolveFailed (no correct solution, nothing written). perf_trials: timed runs of the
    final check; None picks them (default_perf_trials). timing: how the tuning runs and the final check
    time a call, as `fastnorm eval --timing` ("device": device time, host work overlapped; "host": host
    time counted)."""
    from fastnorm.harness.timing import include_host_for

    include_host_for(timing)  # ValueError for anything else, before any work
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

    calls = _recorded_calls(plan, log)
    dev = CudaDevice.of(device) if device.type == "cuda" else CudaDevice()
    helpers_call = fused_helpers.extension_calls(plan.forward.helpers, emit.EXTENSION_FUNCTIONS)
    selection = kernel_needs.selection_for(calls, device.type, dev, helpers_call)
    workdir = Path(tempfile.mkdtemp(prefix="fastnorm_solve_"))
    try:
        candidate = workdir / output.name
        tuning = Tuning(plan, calls, dev, device, target_speedup, tune_trials, log, timing)
        best = tuning.run(candidate, selection)
        if best is None and tuning.missed_kernels and selection != selection.widened():
            log("  a call took a kernel family this build left out: rebuilding with every family")
            selection = selection.widened()
            best = tuning.run(candidate, selection)
        trials, reference_ms = tuning.trials, tuning.reference_ms
        if best is None:
            raise SolveFailed("every launch configuration failed or gave wrong results:\n  " +
                              "\n  ".join(f"{t.label}: {t.error}" for t in trials))
        log(f"chosen: {best.label} ({best.ms:.4g} ms, {best.speedup:.2f}x in the tuning runs)")

        candidate.write_text(plan.render(device.type, threads=best.threads, blocks_per_row=best.blocks_per_row,
                                         tuned_on=device_label(device), selection=selection))
        if perf_trials is None:
            perf_trials = default_perf_trials(device, reference_ms, best.ms)
        log(f"verifying with fastnorm eval ({eval_trials} correctness trials, {perf_trials} timing trials)...")
        verification = verify(problem.path, candidate, device=device, trials=eval_trials, perf_trials=perf_trials,
                              log=log, extensions_dir=tuning.extensions_dir, timing=timing)
        if not verification.correct:
            raise SolveFailed(f"fastnorm eval rejected the solution: {verification.message}")
        log(f"verified: {verification.message}")
        output.parent.mkdir(parents=True, exist_ok=True)
        staging = output.with_name(f".{output.name}.partial")
        shutil.copyfile(candidate, staging)
        os.replace(staging, output)
        log(f"wrote {output} ({output.stat().st_size / 1024:.1f} KB)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    speedup = verification.speedup
    target_met = target_speedup is None or (speedup is not None and speedup >= target_speedup)
    return SolveResult(output, plan, trials, best, reference_ms, verification, target_met)


def _recorded_calls(plan: Plan, log: Callable[[str], None]) -> list:
    """The extension calls of the plan's ModelNew on the traced shapes ([] if they cannot be recorded:
    the build then holds every kernel of the functions its helpers call)."""
    try:
        calls = record_calls(plan)
    except Exception as err:  # the reference's own code on the meta device, say
        log(f"  note: could not record the kernel calls on the traced shapes ({type(err).__name__}: {err}); "
            "building every kernel")
        return []
    log("kernel calls on the traced shapes:")
    for call in calls:
        log(f"  {call.describe()}")
    return calls


class Tuning:
    """Build a solution with a kernel selection, then time its launch configurations (tune.py)."""

    def __init__(self, plan: Plan, calls: list, dev: CudaDevice, device: torch.device,
                 target_speedup: Optional[float], trials: int, log: Callable[[str], None], timing: str = DEFAULT_TIMING):
        self.plan, self.calls, self.dev, self.device = plan, calls, dev, device
        self.target_speedup, self.timed_runs, self.log = target_speedup, trials, log
        self.timing = timing  # the final check's mode: the configuration chosen is the one it finds fastest
        self.trials, self.reference_ms = [], None
        self.extensions_dir = None  # where the build landed: fastnorm eval finds it there

    @property
    def missed_kernels(self) -> bool:
        """True when a configuration failed because its call took a family the build left out."""
        return any(t.error and "not in this build" in t.error for t in self.trials)

    def run(self, candidate: Path, selection) -> Optional[Trial]:
        plan, device, log = self.plan, self.device, self.log
        candidate.write_text(plan.render(device.type, selection=selection))
        log(f"building the inline {device.type} extension ({selection.describe()}; cached after the first "
            "build)...")
        start = time.perf_counter()
        module = import_solution(candidate)
        log(f"  ready in {time.perf_counter() - start:.1f} s")
        self.extensions_dir = str(Path(module._ext.__file__).parent.parent)

        problem = plan.problem
        reference_model = problem.build_model(device).eval()
        model_new = module.ModelNew(*problem.init_inputs()).to(device).eval()
        model_new.load_state_dict(reference_model.state_dict())
        inputs = problem.inputs(device)
        from fastnorm.harness.timing import include_host_for, time_callable

        timer = functools.partial(time_callable, include_host=include_host_for(self.timing))
        overrides = emit.uses_launch_config(plan.forward)
        configs = kernel_needs.tune_configs(self.calls, selection, candidate_configs(device.type), self.dev)
        count = len(configs) if overrides else 1
        target = f" until {self.target_speedup:g}x" if self.target_speedup else ""
        # One configuration leaves nothing to choose: checked, and timed only for the final check's budget
        # (a few runs: the RMS problem's 165 ms CPU reference made 20 of them 4 s of a solve).
        runs = self.timed_runs if count > 1 else min(self.timed_runs, SINGLE_CONFIG_RUNS)
        log(f"timing {count} launch configuration{'s' * (count > 1)} on {device_label(device)}{target}"
            + ("" if count > 1 else f" ({runs} runs: nothing to choose)") + ":")
        best, self.trials, self.reference_ms = tune(module, model_new, reference_model, inputs, device,
                                                    target_speedup=self.target_speedup, timer=timer,
                                                    trials=runs, log=log, launch_overrides=overrides,
                                                    configs=configs)
        del reference_model, model_new, inputs, module
        _release_memory(device)
        return best


# ----------------------------------------------------------------------------------------------


def verify_with_eval(reference_path: Path, candidate_path: Path, *, device: torch.device, trials: int,
                     perf_trials: int, log: Callable[[str], None] = print,
                     extensions_dir: Optional[str] = None, timing: str = DEFAULT_TIMING) -> Verification:
    """Run `fastnorm eval` (fastnorm.harness.evaluate) on the one candidate and read its verdict.
    extensions_dir: where the solver built the candidate's extension, so that eval loads that build
    (the candidate differs from the tuned file in THREADS / BLOCKS_PER_ROW only: the same sources, the
    same hashed name) instead of compiling it again in a directory of its own."""
    from fastnorm.harness import EvaluationError, evaluate

    try:
        report = evaluate(str(reference_path), [str(candidate_path)], device=str(device), trials=trials,
                          perf_trials=perf_trials, extensions_dir=extensions_dir, timing=timing,
                          progress=lambda line: log(f"  eval: {line}"))
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
