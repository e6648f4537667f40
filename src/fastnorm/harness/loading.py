"""Loading problem and candidate files, picking the device, seeded inputs and models: what the worker
processes of `fastnorm eval` (worker.py, judge.py, candidate_process.py) share.
"""
from __future__ import annotations

import importlib.util
import os
import random
import re
import sys
import time

import torch

from fastnorm.harness.messages import Verdict, exception_message, first_compiler_error, location_in_file

REFERENCE_MODULE = "_fastnorm_eval_reference"
CANDIDATE_MODULE = "_fastnorm_eval_candidate"


class Progress:
    """Announces the stage a worker is at in a file, a line "<time.monotonic()>\t<stage>" each, so that the
    parent still knows where when it dies (isolation.last_stage) and where an evaluation's time went
    (isolation.stage_seconds; time.monotonic() is one clock for every process of the host)."""

    def __init__(self, path: str):
        self.path, self.stage = path, "start"

    def __call__(self, stage: str) -> None:
        self.stage = stage
        with open(self.path, "a") as f:
            f.write(f"{time.monotonic():.6f}\t{stage}\n")


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


def log_size(cfg: dict) -> int:
    sys.stdout.flush()
    try:
        return os.path.getsize(cfg["log_path"])
    except OSError:
        return 0


def import_candidate(cfg: dict):
    """The candidate module and its model class; Verdict (load_error, compile_error) when either fails."""
    offset = log_size(cfg)
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
# Inputs and models

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


def build_model(cls, init_inputs, seed: int, device: torch.device):
    seed_everything(seed)
    model = cls(*init_inputs)
    if hasattr(model, "to"):
        model = model.to(device)
    return model


