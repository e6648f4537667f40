"""The child process of `fastnorm eval`: loads, verifies and times one candidate, or times the reference.

Run as `python -m fastnorm.harness.worker CONFIG.json` by isolation.run_worker. Modes (CONFIG["mode"]):
  import     import the candidate only (parallel pre-build of load_inline extensions)
  baseline   validate and time the reference (+ torch.compile), measure copy bandwidth and the minimal bytes
  candidate  correctness trials with the cheat checks, then timing, then one more check after timing
Writes CONFIG["result_path"] (JSON) and announces each stage in CONFIG["progress_path"], so that when the
process dies (segfault, timeout) the parent still knows where.
"""
from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import torch

from fastnorm.harness import checks
from fastnorm.harness.messages import (clip, describe_exception, exception_message, first_compiler_error,
                                       location_in_file)
from fastnorm.harness.timing import copy_bandwidth, time_callable

REFERENCE_MODULE = "_fastnorm_eval_reference"
CANDIDATE_MODULE = "_fastnorm_eval_candidate"
THREAD_JOIN_S = 2.0  # how long to wait for threads a forward started before re-reading its output


class Verdict(Exception):
    """Ends the evaluation of a candidate with a verdict other than ok."""

    def __init__(self, verdict: str, message: str):
        super().__init__(message)
        self.verdict, self.message = verdict, clip(message)


class Progress:
    def __init__(self, path: str):
        self.path, self.stage = path, "start"

    def __call__(self, stage: str) -> None:
        self.stage = stage
        with open(self.path, "a") as f:
            f.write(stage + "\n")


# ---------------------------------------------------------------------------------------------------------
# Loading

def load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_failure(exc: BaseException, cfg: dict, log_offset: int, prefix: str) -> Verdict:
    """compile_error for a failed extension build (with the compiler's first error), load_error otherwise."""
    text = str(exc)
    path = cfg["candidate"]
    if isinstance(exc, RuntimeError) and "Error building extension" in text:
        match = re.search(r"Error building extension '([^']+)'", text)
        # verbose=False puts the build log in the exception; verbose=True sends it to our stdout (the log file).
        error = first_compiler_error(text) or first_compiler_error(_read_log(cfg, log_offset))
        message = f"building extension '{match.group(1) if match else '?'}' failed: "
        message += error or "no compiler error line found (rerun with --keep-temp and read worker.log)"
        where = location_in_file(exc, path)
        return Verdict("compile_error", message + (f" (at {where})" if where else ""))
    return Verdict("load_error", exception_message(exc, path, prefix=prefix))


def _read_log(cfg: dict, offset: int) -> str:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with open(cfg["log_path"], "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _log_size(cfg: dict) -> int:
    sys.stdout.flush()
    try:
        return os.path.getsize(cfg["log_path"])
    except OSError:
        return 0


def import_candidate(cfg: dict, progress: Progress):
    progress("import candidate")
    offset = _log_size(cfg)
    try:
        module = load_module(cfg["candidate"], CANDIDATE_MODULE)
    except BaseException as exc:  # SystemExit from a candidate is a load failure too
        raise load_failure(exc, cfg, offset, "importing the candidate raised ") from None
    cls = getattr(module, cfg["class_name"], None)
    if cls is None:
        defined = sorted(n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == CANDIDATE_MODULE)
        raise Verdict("load_error", f"the candidate defines no class {cfg['class_name']!r} "
                                    f"(classes found: {', '.join(defined) or 'none'}; pick one with --class)")
    return module, cls


def resolve_device(name: str) -> torch.device:
    if name in (None, "", "auto"):
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # events, streams and the allocator all follow the current device
    return device


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    import platform
    try:
        with open("/proc/cpuinfo") as f:
            models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if models:
            return f"{models[0]} ({len(models)} threads)"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


# ---------------------------------------------------------------------------------------------------------
# Inputs, models, global state

def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % (1 << 32))


def to_device(values, device):
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


def make_inputs(ref_mod, seed: int, device: torch.device) -> list:
    """get_inputs() after `seed`, created directly on the device when possible (7.5 GB randn on a CPU is slow)."""
    seed_everything(seed)
    if device.type != "cpu":
        try:
            with torch.device(device):
                return to_device(list(ref_mod.get_inputs()), device)
        except Exception:
            seed_everything(seed)
    return to_device(list(ref_mod.get_inputs()), device)


def refill(buffers: list, fresh: list) -> list:
    """Write a new trial's inputs into the previous trial's tensors, so that a candidate cannot memoize on
    tensor identity or address; falls back to the new tensors where shapes differ."""
    out = []
    for old, new in zip(buffers, fresh):
        if isinstance(old, torch.Tensor) and isinstance(new, torch.Tensor) and old.shape == new.shape \
                and old.dtype == new.dtype and old.device == new.device:
            try:
                old.copy_(new)
                out.append(old)
                continue
            except RuntimeError:  # e.g. an expanded (overlapping) input cannot be written
                pass
        out.append(new)
    return out


def build_model(cls, init_inputs, seed: int, device: torch.device):
    seed_everything(seed)
    model = cls(*init_inputs)
    if hasattr(model, "to"):
        model = model.to(device)
    return model


class GlobalNumerics:
    """Process-wide settings a candidate might change at import (default dtype, fp32 matmul precision):
    the reference and the inputs always run under the harness's, the candidate under its own."""

    def __init__(self):
        self.default_dtype = torch.get_default_dtype()
        self.matmul_precision = torch.get_float32_matmul_precision()

    def apply(self) -> None:
        torch.set_default_dtype(self.default_dtype)
        torch.set_float32_matmul_precision(self.matmul_precision)


class TamperGuard:
    """Notices a candidate replacing what the reference computes with (torch.nn.functional.layer_norm,
    Tensor methods, the reference module's own names) - the reference runs in the candidate's process."""

    def __init__(self, ref_mod):
        import torch.nn.functional as F
        self.targets = {"torch": torch, "torch.nn.functional": F, "torch.Tensor": torch.Tensor,
                        "torch.nn.Module": torch.nn.Module, "the reference module": ref_mod}
        model_cls = getattr(ref_mod, "Model", None)
        if isinstance(model_cls, type):
            self.targets["the reference Model"] = model_cls
        self.before = {label: self._identities(label, obj) for label, obj in self.targets.items()}

    # Rebound by torch itself: importing torch._dynamo (any torch.compile) wraps torch.manual_seed.
    ALLOWED = {("torch", "manual_seed")}

    @classmethod
    def _identities(cls, label, obj) -> dict:
        return {k: id(v) for k, v in vars(obj).items()
                if not k.startswith("_") and callable(v) and (label, k) not in cls.ALLOWED}

    def check(self) -> None:
        for label, obj in self.targets.items():
            now = vars(obj)
            for name, ident in self.before[label].items():
                if name not in now or id(now[name]) != ident:
                    raise Verdict("cheating", f"the candidate replaced {label}.{name}, which the reference may "
                                              f"call: results of this process cannot be trusted")


# ---------------------------------------------------------------------------------------------------------
# One checked forward call

@dataclass
class ForwardRun:
    outputs: list     # what forward returned, flattened
    snapshots: list   # copies taken right after the end event, before any device-wide synchronize
    changed_after_return: list  # indices of outputs that changed after that point


def checked_forward(model, inputs: list, device: torch.device, numerics: GlobalNumerics,
                    harness: GlobalNumerics, what: str, path: str) -> ForwardRun:
    """Call forward the way a caller would, and read its output the way a caller would: right after the
    call's end event, without synchronizing other streams. Then synchronize everything and look again:
    an output that changes afterwards was produced by work hidden on another stream (or thread)."""
    threads_before = set(threading.enumerate())
    numerics.apply()
    try:
        with torch.no_grad():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = model(*inputs)
                end.record()
                end.synchronize()
            else:
                out = model(*inputs)
    except BaseException as exc:
        raise Verdict("runtime_error", exception_message(exc, path, prefix=f"forward raised {what}: ")) from None
    finally:
        harness.apply()
    try:
        outputs = checks.flatten_outputs(out)
        snapshots = [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outputs]
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # device-wide; also surfaces asynchronous kernel faults
        _join_new_threads(threads_before)
        changed = [i for i, (o, s) in enumerate(zip(outputs, snapshots))
                   if isinstance(o, torch.Tensor) and not checks.bitwise_equal(o, s)]
    except Exception as exc:
        raise Verdict("runtime_error", f"after forward returned {what}: {clip(describe_exception(exc))}")
    return ForwardRun(outputs, snapshots, changed)


def _join_new_threads(before: set) -> None:
    deadline = time.monotonic() + THREAD_JOIN_S
    for thread in set(threading.enumerate()) - before:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))



# ---------------------------------------------------------------------------------------------------------
# Checks of one run against the reference

@dataclass
class Expected:
    inputs: list            # the live input tensors handed to both models
    saved_inputs: list      # copies taken before the reference ran
    outputs: list           # copies of the reference's outputs (the originals were freed and scrubbed)
    reference_mutates: bool  # the reference itself writes its inputs: then the candidate may too
    reference_aliases: set   # output indices where the reference returns (a view of) an input


def check_run(run: ForwardRun, exp: Expected, atol, rtol, what: str) -> tuple[float, float]:
    """Raise Verdict on the first failed check; return (max abs err, max rel err)."""
    if run.changed_after_return:
        i = run.changed_after_return[0]
        n = checks.count_differences(run.outputs[i], run.snapshots[i])
        raise Verdict("cheating", f"output #{i} was still being written after forward returned {what} "
                                  f"({n} of {run.outputs[i].numel()} elements changed after a device-wide "
                                  f"synchronize): work is hidden on another stream or thread")
    if len(run.outputs) != len(exp.outputs):
        raise Verdict("wrong_shape", f"forward returned {len(run.outputs)} outputs, the reference "
                                     f"{len(exp.outputs)}")
    for i, (got, want) in enumerate(zip(run.outputs, exp.outputs)):
        if isinstance(want, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                raise Verdict("wrong_shape", f"output #{i} is a {type(got).__name__}, expected a Tensor")
            if got.shape != want.shape or got.dtype != want.dtype:
                raise Verdict("wrong_shape", f"output #{i} has shape {tuple(got.shape)} {got.dtype}, expected "
                                             f"{tuple(want.shape)} {want.dtype}")
    for i, got in enumerate(run.outputs):
        if not isinstance(got, torch.Tensor):
            continue
        for j, t in enumerate(exp.inputs):
            if isinstance(t, torch.Tensor) and i not in exp.reference_aliases and checks.storages_overlap(got, t):
                raise Verdict("cheating", f"output #{i} aliases input #{j} (shares its memory) {what}")
        for held, label in ((exp.outputs, "the reference's output"), (exp.saved_inputs, "the harness's input copy")):
            if any(isinstance(t, torch.Tensor) and checks.storages_overlap(got, t) for t in held):
                raise Verdict("cheating", f"output #{i} is {label} (shares its memory) {what}")
    if not exp.reference_mutates:
        for j, (now, before) in enumerate(zip(exp.inputs, exp.saved_inputs)):
            if isinstance(now, torch.Tensor) and not checks.bitwise_equal(now, before):
                n = checks.count_differences(now, before)
                raise Verdict("cheating", f"forward modified input #{j} in place {what} ({n} of {now.numel()} "
                                          f"elements changed)")
    max_abs = max_rel = 0.0
    for i, (got, want) in enumerate(zip(run.snapshots, exp.outputs)):
        if not isinstance(want, torch.Tensor):
            if got != want:
                raise Verdict("wrong_output", f"output #{i} is {got!r}, expected {want!r}")
            continue
        tol_a = atol if atol is not None else checks.default_tolerance(want.dtype)
        tol_r = rtol if rtol is not None else checks.default_tolerance(want.dtype)
        result = checks.compare(got, want, tol_a, tol_r)
        max_abs, max_rel = max(max_abs, result.max_abs_err), max(max_rel, result.max_rel_err)
        if not result.ok:
            message = f"wrong values {what}: " + result.describe(f"output #{i}")
            scrubbed = checks.count_scrub_pattern(got)
            if scrubbed:
                message = (f"output #{i} holds {scrubbed} of {got.numel()} elements of freed memory the harness had "
                           f"overwritten (never written by forward: stale or uninitialised output) {what}; "
                           + message)
            err = Verdict("wrong_output", message)
            err.max_abs_err, err.max_rel_err = max_abs, max_rel
            raise err
    return max_abs, max_rel


# ---------------------------------------------------------------------------------------------------------
# Modes

def run_import(cfg: dict, progress: Progress) -> dict:
    import_candidate(cfg, progress)
    return {"verdict": "ok", "message": ""}


def run_baseline(cfg: dict, progress: Progress) -> dict:
    device = resolve_device(cfg["device"])
    result = {"ok": False, "device": str(device), "device_name": device_name(device),
              "torch_version": torch.__version__}
    seed = cfg["seed"]
    progress("import reference")
    try:
        ref_mod = load_module(cfg["reference"], REFERENCE_MODULE)
        progress("construct reference")
        model = build_model(ref_mod.Model, to_device(ref_mod.get_init_inputs(), device), seed, device)
        progress("reference forward")
        inputs = make_inputs(ref_mod, seed + 1, device)
        with torch.no_grad():
            outputs = checks.flatten_outputs(model(*inputs))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except BaseException as exc:
        result["message"] = exception_message(exc, cfg["reference"], prefix="the reference failed: ")
        return result
    tensors_in = [t for t in inputs if isinstance(t, torch.Tensor)]
    tensors_out = [t for t in outputs if isinstance(t, torch.Tensor)]
    min_bytes = sum(map(checks.footprint_bytes, tensors_in)) + sum(map(checks.footprint_bytes, tensors_out))
    result["outputs"] = [{"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")} for t in tensors_out]
    result["min_bytes"] = min_bytes
    del outputs, tensors_out

    progress("copy bandwidth")
    # Two copies: a large one (the asymptotic bandwidth) and one moving the problem's own bytes under the same
    # cache flush, which profits from the same effects (outputs still in a write-back cache when the clock
    # stops) that an honest kernel of this size does. The floor uses the fastest copy of either: conservative.
    limit = torch.cuda.mem_get_info(device)[0] // 3 if device.type == "cuda" else 1 << 30
    large = min(1 << 30 if device.type == "cuda" else 256 << 20, limit)
    same_size = min(max(min_bytes // 2, 1 << 20), limit)
    result["copy_bw_large"] = copy_bandwidth(device, large, best=True)
    result["copy_bw_same_size"] = copy_bandwidth(device, same_size, best=True)
    result["copy_bw"] = max(result["copy_bw_large"], result["copy_bw_same_size"])

    progress("time reference")

    def eager():
        with torch.no_grad():
            return model(*inputs)

    result["ref_timing"] = time_callable(eager, device=device, trials=cfg["perf_trials"],
                                         warmup=cfg["warmup"]).to_dict()
    result["compiled_timing"] = result["compile_error"] = None
    if cfg.get("compile_baseline"):
        progress("torch.compile reference")
        try:
            compiled = torch.compile(model)

            def compiled_call():
                with torch.no_grad():
                    return compiled(*inputs)

            compiled_call()
            result["compiled_timing"] = time_callable(compiled_call, device=device, trials=cfg["perf_trials"],
                                                      warmup=cfg["warmup"]).to_dict()
        except Exception as exc:
            result["compile_error"] = clip(describe_exception(exc))
    result["ok"] = True
    return result


def run_candidate(cfg: dict, progress: Progress) -> dict:
    device = resolve_device(cfg["device"])
    seed, atol, rtol = cfg["seed"], cfg.get("atol"), cfg.get("rtol")
    result = {"device": str(device), "max_abs_err": None, "max_rel_err": None, "timing": None}
    harness = GlobalNumerics()

    progress("import reference")
    ref_mod = load_module(cfg["reference"], REFERENCE_MODULE)
    guard = TamperGuard(ref_mod)
    _, cls = import_candidate(cfg, progress)
    candidate_numerics = GlobalNumerics()
    harness.apply()
    guard.check()

    progress("construct models")
    init_inputs = to_device(ref_mod.get_init_inputs(), device)
    ref_model = build_model(ref_mod.Model, init_inputs, seed, device)
    candidate_numerics.apply()
    offset = _log_size(cfg)
    try:
        model = build_model(cls, init_inputs, seed, device)
    except BaseException as exc:  # a load_inline inside __init__ can fail to build: compile_error then
        raise load_failure(exc, cfg, offset, f"constructing {cfg['class_name']} raised ") from None
    finally:
        harness.apply()
    guard.check()

    inputs, exp = None, None
    max_abs = max_rel = 0.0
    for trial in range(cfg["trials"]):
        what = f"in correctness trial {trial}"
        progress(f"trial {trial}: inputs")
        exp = None  # release the previous trial's copies before allocating new ones
        fresh = make_inputs(ref_mod, seed + 1 + trial, device)
        inputs = fresh if inputs is None else refill(inputs, fresh)
        del fresh
        exp = reference_outputs(ref_model, inputs, device, cfg, guard, progress, trial)
        progress(f"trial {trial}: candidate forward")
        run = checked_forward(model, inputs, device, candidate_numerics, harness, what, cfg["candidate"])
        progress(f"trial {trial}: checks")
        errs = check_run(run, exp, atol, rtol, what)
        guard.check()
        max_abs, max_rel = max(max_abs, errs[0]), max(max_rel, errs[1])
        del run
    result["max_abs_err"], result["max_rel_err"] = max_abs, max_rel

    progress("timing")

    def call():
        with torch.no_grad():
            return model(*inputs)

    candidate_numerics.apply()
    try:
        stats = time_callable(call, device=device, trials=cfg["perf_trials"], warmup=cfg["warmup"])
    except BaseException as exc:
        raise Verdict("runtime_error", exception_message(exc, cfg["candidate"],
                                                         prefix="forward raised while timing: ")) from None
    finally:
        harness.apply()
    result["timing"] = stats.to_dict()

    # A candidate that behaves only for its first few calls is caught here: same inputs as the last trial.
    progress("post-timing check")
    guard.check()
    run = checked_forward(model, inputs, device, candidate_numerics, harness, "after timing", cfg["candidate"])
    check_run(run, exp, atol, rtol, "after timing")
    result.update(verdict="ok", message="")
    return result


def reference_outputs(ref_model, inputs, device, cfg, guard: TamperGuard, progress: Progress, trial: int) -> Expected:
    """Run the reference, keep copies of its outputs, free the originals and overwrite the freed memory, so a
    candidate that returns whatever the allocator hands it cannot return the reference's result."""
    progress(f"trial {trial}: reference")
    guard.check()
    saved = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    with torch.no_grad():
        raw = ref_model(*inputs)
    outputs = checks.flatten_outputs(raw)
    copies = [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in outputs]
    aliases = {i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor)
               and any(isinstance(t, torch.Tensor) and checks.storages_overlap(o, t) for t in inputs)}
    mutates = any(isinstance(t, torch.Tensor) and not checks.bitwise_equal(t, s) for t, s in zip(inputs, saved))
    if mutates:  # give the candidate the same inputs the reference saw
        for t, s in zip(inputs, saved):
            if isinstance(t, torch.Tensor):
                t.copy_(s)
    freed = [o.numel() * o.element_size() for i, o in enumerate(outputs)
             if isinstance(o, torch.Tensor) and i not in aliases]
    del raw, outputs
    if cfg.get("scrub_freed_memory", True):
        checks.scrub_freed_memory(device, freed)
    return Expected(inputs=inputs, saved_inputs=saved, outputs=copies, reference_mutates=mutates,
                    reference_aliases=aliases)


# ---------------------------------------------------------------------------------------------------------

MODES = {"import": run_import, "baseline": run_baseline, "candidate": run_candidate}


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        cfg = json.load(f)
    progress = Progress(cfg["progress_path"])
    try:
        result = MODES[cfg["mode"]](cfg, progress)
    except Verdict as v:
        result = {"verdict": v.verdict, "message": v.message, "max_abs_err": getattr(v, "max_abs_err", None),
                  "max_rel_err": getattr(v, "max_rel_err", None)}
    except BaseException as exc:  # a fault of the harness, or the reference failing in this process
        traceback.print_exc()
        result = {"verdict": "runtime_error",
                  "message": clip(f"evaluator error during {progress.stage}: {describe_exception(exc)}")}
    result["stage"] = progress.stage
    tmp = cfg["result_path"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, cfg["result_path"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter/CUDA teardown: a poisoned context can crash or hang there


if __name__ == "__main__":
    main(sys.argv[1:])
