"""`fastnorm bench --suite family`: the KernelBench-style norm problems of problems/ (issue 21), each run
three ways on its own inputs: the reference Model as is (eager), torch.compile of it, and the solved
ModelNew of solutions/ (same file name). Models are built as KernelBench builds them: in training mode,
so BatchNorm uses and updates batch statistics. Forward only, no grad, unless `--mode train`: then each
problem whose norm has a fused backward (TRAIN_PROBLEMS) times forward + backward, torch.autograd.grad of
the output against x and the parameters, and checks those gradients against the reference's too.
`--dtype` runs the problems in other dtypes (models and inputs cast), e.g. GroupNorm + SiLU in bf16.

Every row is checked first (ModelNew's outputs against the reference's, KernelBench's tolerances) and
scored against the floor: the bytes it must move (x read once and y written once; the Frobenius norm over
the whole tensor needs x read twice) over the device's copy bandwidth. The problems are GPU-sized (4 to
8.6 GB inputs): the suite runs on CUDA.
"""
import gc
import importlib.util
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, List, Optional

import torch

# Passes over x a problem's output needs at least, where it is not one read and one write.
PASSES = {"frobenius_norm": 3}
# Problems whose norm's backward is fused kernels (the affine family members, the LayerNorm / RMSNorm
# seeds): the rows of `--mode train`. The p-norms' backward is torch ops on float32 temporaries, which
# at these sizes (8.6 GB inputs) would not fit beside the rest.
TRAIN_PROBLEMS = ("group_norm", "batch_norm", "instance_norm", "layer_norm", "rms_norm")
# The backward adds a read of x and dy and a write of dx.
TRAIN_PASSES = 3
# --dtype names -> torch dtypes.
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# Gradients against the reference's, relative to the largest: float32 sums over up to 2**25 elements.
GRAD_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}
HALF_GRAD_TOLERANCE = 3e-2


@dataclass
class FamilyRow:
    problem: str
    input: str                       # shapes and dtypes of the inputs
    bytes: int                       # the least a forward must move
    ok: Optional[bool] = None        # ModelNew's outputs match the reference's
    eager_ms: Optional[float] = None
    compile_ms: Optional[float] = None
    fastnorm_ms: Optional[float] = None
    pct_copy: Optional[float] = None  # fastnorm's bytes / time against the copy bandwidth
    note: str = ""

    def speedup(self, baseline_ms: Optional[float]) -> Optional[float]:
        return baseline_ms / self.fastnorm_ms if baseline_ms and self.fastnorm_ms else None


def problem_pairs(problems_dir: Path, solutions_dir: Path) -> list:
    """(problem path, solution path) for every problems/ file with a same-named solution, by name."""
    return [(p, solutions_dir / p.name) for p in sorted(problems_dir.glob("*.py"))
            if (solutions_dir / p.name).is_file()]


def minimal_bytes(name: str, inputs: list, mode: str = "fwd") -> int:
    passes = next((n for prefix, n in PASSES.items() if name.startswith(prefix)), 2)
    passes += TRAIN_PASSES if mode == "train" else 0
    return passes * sum(t.numel() * t.element_size() for t in inputs if isinstance(t, torch.Tensor))


def trains(name: str) -> bool:
    return name.startswith(TRAIN_PROBLEMS)


def _cast(inputs: list, dtype: Optional[torch.dtype]) -> list:
    return [t.to(dtype) if dtype is not None and isinstance(t, torch.Tensor) and t.is_floating_point() else t
            for t in inputs]


def _train_call(model, inputs: list, dy: torch.Tensor):
    """The timed call of --mode train: forward and the gradients of x and the parameters."""
    targets = [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    targets += [q for q in model.parameters() if q.requires_grad]
    return lambda: torch.autograd.grad(model(*inputs), targets, dy)


def grads_match(expected, actual) -> Optional[str]:
    """None if every gradient is within GRAD_TOLERANCE of the reference's largest magnitude."""
    if len(expected) != len(actual):
        return f"{len(actual)} gradients, expected {len(expected)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        if e.shape != a.shape or e.dtype != a.dtype:
            return f"gradient {i}: {a.dtype} {tuple(a.shape)}, expected {e.dtype} {tuple(e.shape)}"
        scale = max(1.0, e.abs().max().item())
        err = (a - e).abs().max().item() / scale  # in the gradient's dtype: no float64 copy of 7.5 GB
        tol = GRAD_TOLERANCE.get(e.dtype, HALF_GRAD_TOLERANCE)
        if not err <= tol:
            return f"gradient {i}: error {err:.3g} of the largest magnitude (tolerance {tol:g})"
    return None


def _import(path: Path, tag: str):
    spec = importlib.util.spec_from_file_location(f"fastnorm_family_{tag}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _describe(inputs: list) -> str:
    return ", ".join(f"{str(t.dtype).replace('torch.', '')} {tuple(t.shape)}" for t in inputs
                     if isinstance(t, torch.Tensor))


def run_row(problem: Path, solution: Path, device: torch.device, *, reps: int, use_compile: bool,
            copy_bw: float, timer: Callable, log: Callable = print, mode: str = "fwd",
            dtype: Optional[torch.dtype] = None) -> FamilyRow:
    """One problem: check, then eager, torch.compile (when asked) and ModelNew timed on the same inputs.
    mode "train" times forward + backward and checks the gradients too; dtype casts models and inputs."""
    from fastnorm.solve.problem import load_problem
    from fastnorm.solve.tune import outputs_match

    reference = load_problem(problem)
    torch.manual_seed(0)
    inputs = _cast(reference.inputs(device), dtype)
    name = problem.stem + (f" {str(dtype).replace('torch.', '')}" if dtype is not None else "")
    row = FamilyRow(name, _describe(inputs), minimal_bytes(problem.stem, inputs, mode))
    try:
        model = reference.build_model(device)
        model_new = _import(solution, "solution").ModelNew(*reference.init_inputs()).to(device)
        model_new.load_state_dict(model.state_dict())
        if dtype is not None:
            model, model_new = model.to(dtype), model_new.to(dtype)
        with torch.no_grad():
            error = outputs_match(model(*inputs), model_new(*inputs))
        if error is None and mode == "train":
            for t in inputs:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    t.requires_grad_(True)
            dy = torch.randn_like(model(*inputs))
            reference_call, new_call = _train_call(model, inputs, dy), _train_call(model_new, inputs, dy)
            error = grads_match(reference_call(), new_call())
        else:
            reference_call = new_call = None
        row.ok = error is None
        if error:
            row.note = f"wrong output: {error}"
            return row
        with torch.no_grad() if mode != "train" else torch.enable_grad():
            row.eager_ms = timer(reference_call or (lambda: model(*inputs)), device=device, trials=reps).median_ms
            row.fastnorm_ms = timer(new_call or (lambda: model_new(*inputs)), device=device, trials=reps).median_ms
            if use_compile:
                compiled = torch.compile(model)
                call = _train_call(compiled, inputs, dy) if mode == "train" else (lambda: compiled(*inputs))
                start = time.perf_counter()
                call()
                log(f"  torch.compile: first call {time.perf_counter() - start:.1f} s")
                row.compile_ms = timer(call, device=device, trials=reps).median_ms
    except Exception as exc:  # a failing problem is reported, the others still run
        row.note = f"{type(exc).__name__}: {str(exc).strip()[:200]}"
    finally:
        inputs = model = model_new = compiled = dy = reference_call = new_call = call = None  # noqa: F841
        gc.collect()  # (released before the next, huge, row)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if row.fastnorm_ms and copy_bw:
        row.pct_copy = 100.0 * row.bytes / (row.fastnorm_ms * 1e-3) / copy_bw
    return row


def run(device: torch.device, problems_dir: Path, solutions_dir: Path, *, reps: int, use_compile: bool,
        copy_bw: float, log: Callable = print, timer: Optional[Callable] = None, mode: str = "fwd",
        dtypes: Optional[list] = None) -> Optional[List[FamilyRow]]:
    """The suite's rows, or None (after saying why) when there is no problem with a solution. dtypes:
    torch dtypes to run each problem in (None: the problem's own)."""
    if timer is None:
        from fastnorm.harness.timing import time_callable as timer
    pairs = problem_pairs(problems_dir, solutions_dir)
    if mode == "train":
        pairs = [(p, s) for p, s in pairs if trains(p.stem)]
    if not pairs:
        log(f"the family suite needs problems in {problems_dir}/ with solved ModelNew files of the same name in "
            f"{solutions_dir}/ (fastnorm solve {problems_dir}/P.py -o {solutions_dir}/P.py)"
            + (f"; --mode train runs those named {', '.join(TRAIN_PROBLEMS)}" if mode == "train" else ""))
        return None
    runs = [(p, s, d) for p, s in pairs for d in (dtypes or [None])]
    rows = []
    for i, (problem, solution, dtype) in enumerate(runs, 1):
        log(f"[{i}/{len(runs)}] family{' train' if mode == 'train' else ''}: {problem.stem}"
            + (f" in {dtype}" if dtype is not None else ""))
        row = run_row(problem, solution, device, reps=reps, use_compile=use_compile, copy_bw=copy_bw, timer=timer,
                      log=log, mode=mode, dtype=dtype)
        log(f"  {_timings(row)}" if row.ok else f"  FAILED {row.note}")
        rows.append(row)
    return rows


def _ms(value: Optional[float]) -> str:
    return f"{value:.3f}" if value is not None else "-"


def _x(value: Optional[float]) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _timings(row: FamilyRow) -> str:
    return (f"eager {_ms(row.eager_ms)} ms, compile {_ms(row.compile_ms)} ms, fastnorm {_ms(row.fastnorm_ms)} ms"
            + (f", {row.pct_copy:.0f}% of copy" if row.pct_copy is not None else ""))


def format_rows(rows: List[FamilyRow], markdown: bool = False) -> str:
    """The table issue 21 asks for: problem, eager ms, torch.compile ms, fastnorm ms, speedups, % of copy."""
    header = ["problem", "eager ms", "compile ms", "fastnorm ms", "vs eager", "vs compile", "% of copy"]
    lines = []
    for r in rows:
        cells = [r.problem, _ms(r.eager_ms), _ms(r.compile_ms), _ms(r.fastnorm_ms), _x(r.speedup(r.eager_ms)),
                 _x(r.speedup(r.compile_ms)), f"{r.pct_copy:.0f}" if r.pct_copy is not None else "-"]
        if not r.ok:
            cells[3] = "FAILED"
        lines.append(cells)
    if markdown:
        return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                         + ["| " + " | ".join(c) + " |" for c in lines])
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(header)]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
                     for cells in [header] + lines)


def to_json(device: torch.device, rows: List[FamilyRow], copy_bw: float, timing: str = "device",
            mode: str = "fwd") -> dict:
    from fastnorm.bench import report

    return {"suite": "family", "device": report.device_name(device), "torch": torch.__version__,
            "fastnorm_commit": report.git_commit(Path(__file__).resolve().parent),
            "copy_bandwidth_gbs": copy_bw / 1e9, "timing": timing, "mode": mode,
            "rows": [dict(asdict(r), speedup_vs_eager=r.speedup(r.eager_ms),
                          speedup_vs_compile=r.speedup(r.compile_ms)) for r in rows]}
