"""Capture a reference Model's forward as a torch.fx graph, with shapes and dtypes on every node.

Two things beyond plain `torch.fx.symbolic_trace`:
- Number attributes of the model (`self.eps = eps`, `self.features = features`) are traced as
  `get_attr` nodes instead of being baked into the graph as constants, so the generated forward reads
  `self.eps` and honours a non-default value given at construction. If the forward uses such a number
  in Python control flow (`range(self.n)`, `if self.eps > 0`), tracing falls back to proxying floats
  only, then to baking them all.
- Shapes are propagated on the meta device: the model and its inputs are created there, so a 7.5 GB
  input costs no memory. If an op has no meta implementation, the real inputs on the CPU are used.
"""
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx

from fastnorm.solve.problem import ReferenceProblem, UnsupportedProblem


@dataclass(frozen=True)
class TensorInfo:
    """What shape propagation saw for a tensor-valued node."""
    shape: tuple
    dtype: torch.dtype
    stride: tuple

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def describe(self) -> str:
        return f"{str(self.dtype).replace('torch.', '')} {tuple(self.shape)}"


class Opaque:
    """A propagated value that is neither a tensor nor a plain constant."""

    def __init__(self, value):
        self.type_name = type(value).__name__


def describe_value(value) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorInfo(tuple(value.shape), value.dtype, tuple(value.stride()))
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device)):
        return value
    if isinstance(value, (tuple, list)) and len(value) < 64:
        return type(value)(describe_value(v) for v in value)
    if isinstance(value, torch.Size):
        return tuple(value)
    return Opaque(value)


VALUE_KEY = "fastnorm_value"


def node_value(node) -> Any:
    """The propagated value of a node (TensorInfo for tensors); None when not propagated."""
    return node.meta.get(VALUE_KEY) if isinstance(node, fx.Node) else node


class _ValueRecorder(fx.Interpreter):
    def run_node(self, n):
        result = super().run_node(n)
        n.meta[VALUE_KEY] = describe_value(result)
        return result


@dataclass
class TracedModel:
    graph_module: fx.GraphModule
    shapes_on: str          # "meta" or "cpu": where shapes were propagated
    attrs_traced: tuple     # number types whose attributes became graph inputs: (float, int), (float,) or ()
    input_infos: list       # describe_value of each forward input


ATTRIBUTE_TYPES = ((float, int), (float,), ())  # tried in this order


def _number_attributes(module: torch.nn.Module, types: tuple) -> dict:
    # type() rather than isinstance: bool is an int, and flags such as self.training must stay Python values
    return {k: v for k, v in vars(module).items() if type(v) in types and not k.startswith("_")}


def _symbolic_trace(model: torch.nn.Module, attr_types: tuple) -> fx.Graph:
    tracer = fx.Tracer()
    swapped = []
    if attr_types:
        # A property on a throwaway subclass wins over the instance __dict__, so `self.eps` returns a
        # get_attr proxy during tracing. Leaf modules (nn.LayerNorm, ...) are not traced into.
        for qualname, module in model.named_modules():
            if module is not model and tracer.is_leaf_module(module, qualname):
                continue
            numbers = _number_attributes(module, attr_types)
            if not numbers:
                continue
            prefix = qualname + "." if qualname else ""
            props = {name: property(lambda _self, path=prefix + name: tracer.create_proxy("get_attr", path, (), {}))
                     for name in numbers}
            cls = type(module)
            module.__class__ = type(cls.__name__, (cls,), props)
            swapped.append((module, cls))
    try:
        return tracer.trace(model)
    finally:
        for module, cls in swapped:
            module.__class__ = cls


def _trace(model: torch.nn.Module):
    """(GraphModule, attribute types traced): number attributes as graph inputs where the forward allows."""
    for attr_types in ATTRIBUTE_TYPES:
        try:
            graph = _symbolic_trace(model, attr_types)
        except Exception:  # e.g. `range(self.n)`: retry with fewer attributes as graph inputs
            if not attr_types:
                raise
            continue
        return fx.GraphModule(model, graph, class_name=type(model).__name__), attr_types


def trace_problem(problem: ReferenceProblem) -> TracedModel:
    """fx graph of Model(*get_init_inputs()).forward with every node's value recorded."""
    errors = []
    for device in ("meta", "cpu"):
        try:
            model = problem.build_model(device).eval()
        except Exception as err:
            errors.append(f"Model(*get_init_inputs()) on {device}: {_brief(err)}")
            continue
        try:
            gm, attrs_traced = _trace(model)
        except Exception as err:
            raise UnsupportedProblem(
                "could not capture Model.forward with torch.fx.symbolic_trace (fastnorm solve needs a forward "
                f"without data-dependent Python control flow): {_brief(err)}") from err
        try:
            inputs = problem.inputs(device)
            with torch.no_grad():
                _ValueRecorder(gm).run(*inputs)
        except Exception as err:  # an op without a meta kernel: propagate real values on the CPU instead
            errors.append(f"shape propagation on {device}: {_brief(err)}")
            continue
        return TracedModel(gm, device, attrs_traced, [describe_value(v) for v in inputs])
    raise UnsupportedProblem("could not run the reference model to learn its shapes:\n  " + "\n  ".join(errors))


def _brief(err: Exception) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
