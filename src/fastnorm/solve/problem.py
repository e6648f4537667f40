"""A KernelBench reference problem file: `Model`, `get_inputs()`, `get_init_inputs()` and its source."""
import ast
import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch


class UnsupportedProblem(Exception):
    """The reference cannot be solved; the message says what was found and what is supported."""


@dataclass
class ReferenceProblem:
    path: Path
    source: str
    module: ModuleType
    tree: ast.Module

    @property
    def model_class(self) -> type:
        return self.module.Model

    def init_inputs(self) -> list:
        return list(self.module.get_init_inputs())

    def build_model(self, device) -> torch.nn.Module:
        """Model(*get_init_inputs()), created directly on `device` (meta: no memory at all)."""
        with torch.device(device):
            return self.model_class(*self.init_inputs())

    def inputs(self, device) -> list:
        """get_inputs() with its tensors created on `device`, so a 7.5 GB input never touches the host
        when the device is a GPU (or the meta device, for shapes only)."""
        with torch.device(device):
            values = list(self.module.get_inputs())
        return [v.to(device) if isinstance(v, torch.Tensor) else v for v in values]


REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")


def load_problem(path) -> ReferenceProblem:
    """Import a reference problem file under a private module name (no sys.path changes)."""
    path = Path(path).resolve()
    if not path.is_file():
        raise UnsupportedProblem(f"{path}: no such file")
    source = path.read_text()
    try:
        tree = ast.parse(source, filename=str(path))
    except SyntaxError as err:
        raise UnsupportedProblem(f"{path}: not valid Python ({err})") from err
    # Registered in sys.modules so that inspect, pickling and fx can find the module's objects.
    name = "fastnorm_reference_" + hashlib.sha256(str(path).encode() + source.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the reference's own code failed: report it, do not crash
        del sys.modules[name]
        raise UnsupportedProblem(f"{path}: importing the reference failed: {type(err).__name__}: {err}") from err
    missing = [n for n in REQUIRED_NAMES if not hasattr(module, n)]
    if missing:
        raise UnsupportedProblem(
            f"{path}: not a KernelBench reference problem, it lacks {', '.join(missing)} "
            f"(a problem file defines class Model, get_inputs() and get_init_inputs())")
    if not isinstance(module.Model, type) or not issubclass(module.Model, torch.nn.Module):
        raise UnsupportedProblem(f"{path}: Model is not an nn.Module subclass")
    return ReferenceProblem(path=path, source=source, module=module, tree=tree)
