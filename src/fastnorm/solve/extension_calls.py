"""The calls a solution makes into its kernel extension, recorded on the traced shapes.

The solution file is rendered with a recording stand-in for `_ext`, its ModelNew built where the shapes
were propagated (the meta device: no memory, no kernels) and run on the problem's inputs in training
and in eval mode (KernelBench builds its models in training mode; the solver tunes them in eval mode).
Every `_ext.<function>(...)` is recorded with what the kernels decide on: the function, the input's
shape and dtype, the parameters' dtype and the normalized dims. The solution's build then holds only
the kernels these calls need (kernel_needs.py).
"""
import math
import types
from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class ExtensionCall:
    function: str                 # norm_forward, group_norm_forward, batch_norm_forward, p_normalize
    shape: tuple
    dtype: str                    # of the input: "float32", ...
    param_dtype: Optional[str]    # of weight / bias, None without
    begin: int = 0                # norm_forward, p_normalize: the normalized dims [begin, end)
    end: int = 0
    groups: int = 0               # group_norm_forward
    rms: bool = False             # norm_forward: RMSNorm (the planner takes some LayerNorm rows elsewhere)

    @property
    def outer(self) -> int:
        return math.prod(self.shape[:self.begin])

    @property
    def n(self) -> int:
        return math.prod(self.shape[self.begin:self.end])

    @property
    def inner(self) -> int:
        return math.prod(self.shape[self.end:])

    def describe(self) -> str:
        dims = f" over dims [{self.begin}, {self.end})" if self.end else ""
        params = f", parameters {self.param_dtype}" if self.param_dtype else ""
        return f"{self.function}({self.dtype} {self.shape}{dims}{params})"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


class _Recorder:
    """Stands in for the load_inline module: records each call, returns outputs of the kernels' shapes."""

    def __init__(self):
        self.calls = []

    def _record(self, function, x, weight=None, bias=None, begin=0, end=0, groups=0, rms=False):
        params = next((t for t in (weight, bias) if t is not None), None)
        call = ExtensionCall(function, tuple(x.shape), _name(x.dtype), _name(params.dtype) if params is not None
                             else None, int(begin), int(end), int(groups), bool(rms))
        if call not in self.calls:
            self.calls.append(call)

    @staticmethod
    def _stats(x, *shape):
        return torch.empty(shape, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32, device=x.device)

    def norm_forward(self, x, weight, bias, begin_dim, end_dim, eps, rms, threads=0, blocks_per_row=0):
        self._record("norm_forward", x, weight, bias, begin_dim, end_dim, rms=rms)
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    def group_norm_forward(self, x, weight, bias, groups, eps, activation=0):
        self._record("group_norm_forward", x, weight, bias, groups=groups)
        return [torch.empty(x.shape, dtype=x.dtype, device=x.device), self._stats(x, x.shape[0], groups),
                self._stats(x, x.shape[0], groups)]

    def batch_norm_forward(self, x, weight, bias, mean, var, eps):
        self._record("batch_norm_forward", x, weight, bias)
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        if mean is not None:
            return [y, mean, var]
        return [y, self._stats(x, x.shape[1]), self._stats(x, x.shape[1])]

    def p_normalize(self, x, p, begin_dim, end_dim, eps, mean):
        self._record("p_normalize", x, None, None, begin_dim, end_dim)
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def record_calls(plan) -> list:
    """The distinct ExtensionCalls of the plan's ModelNew on the problem's inputs, training and eval mode."""
    source = plan.render("cpu", extension_code="_ext = None  # the recorder, set below")
    module = types.ModuleType("fastnorm_solution_recording")
    exec(compile(source, f"<solution of {plan.problem.path.name}>", "exec"), module.__dict__)
    recorder = _Recorder()
    module._ext = recorder
    device = plan.traced.shapes_on
    with torch.device(device):
        model = module.ModelNew(*plan.problem.init_inputs())
    inputs = plan.problem.inputs(device)
    with torch.no_grad():
        for training in (True, False):
            model.train(training)
            model(*inputs)
    return recorder.calls
