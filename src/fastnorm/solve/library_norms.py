"""Normalizations the reference calls by name: torch.nn modules and torch / torch.nn.functional functions.

Each matcher returns a NormMatch, a string (a norm it found but cannot fuse, and why) or None (not a
norm). Modules become a helper call that reads the module's own attributes at forward time
(`fused_batch_norm_module(x, self.bn)`), so training / eval mode, momentum and the running statistics
behave as the module's own forward would.
"""
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from fastnorm.solve import graph_patterns as gp
from fastnorm.solve.norm_match import AttrRef, NormMatch


def rms_norm_module_type():
    return getattr(nn, "RMSNorm", None)  # torch >= 2.4


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_INSTANCE_NORMS = (nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
# Spatial dims of a batched input of each instance norm (an input with one dim less has no batch dim).
_INSTANCE_SPATIAL_DIMS = {nn.InstanceNorm1d: 1, nn.InstanceNorm2d: 2, nn.InstanceNorm3d: 3}


def _channels_text(kind: str, ndim: int, groups=None) -> str:
    spatial = "" if ndim <= 2 else f" and dims 2..{ndim - 1}" if ndim > 3 else " and dim 2"
    if kind == "BatchNorm":
        return f"dim 0{spatial}, per channel (dim 1)"
    if kind == "InstanceNorm":
        return f"dim{'s 2..' + str(ndim - 1) if ndim > 3 else ' 2'} per sample and channel"
    return f"{groups if groups is not None else 'G'} groups of dim 1{spatial}, per sample"


def match_module(node: fx.Node, gm: fx.GraphModule):
    module = gm.get_submodule(node.target)
    x = node.args[0] if node.args else None
    info = gp.float_tensor(x)
    if info is None or gp.tensor(node) is None or len(node.args) != 1 or node.kwargs:
        return None
    p = node.target
    where = f"{type(module).__name__} (self.{p})"
    common = dict(args=(x,), kwargs={}, output=node, matched=[node], x=info, eps=getattr(module, "eps", None),
                  eps_source=f"self.{p}.eps")
    if type(module) is nn.LayerNorm:
        ndims = len(module.normalized_shape)
        common["args"] = (x, AttrRef(f"{p}.normalized_shape"), AttrRef(f"{p}.weight"), AttrRef(f"{p}.bias"),
                          AttrRef(f"{p}.eps"))
        return NormMatch(kind="LayerNorm", written_as=f"nn.LayerNorm (self.{p})", helper="fused_layer_norm",
                         begin=info.ndim - ndims, end=info.ndim, weight=module.weight is not None,
                         bias=module.bias is not None, **common)
    if rms_norm_module_type() is not None and type(module) is rms_norm_module_type():
        ndims = len(module.normalized_shape)
        common["args"] = (x, AttrRef(f"{p}.normalized_shape"), AttrRef(f"{p}.weight"), AttrRef(f"{p}.eps"))
        return NormMatch(kind="RMSNorm", written_as=f"nn.RMSNorm (self.{p})", helper="fused_rms_norm",
                         begin=info.ndim - ndims, end=info.ndim, weight=module.weight is not None, bias=False,
                         **common)
    if type(module) in _BATCH_NORMS:
        if info.ndim < 2:
            return f"{where}: input of {info.ndim} dims"
        common["args"] = (x, AttrRef(p))
        return NormMatch(kind="BatchNorm", written_as=f"nn.{type(module).__name__} (self.{p})",
                         helper="fused_batch_norm_module", begin=0, end=info.ndim, weight=module.affine,
                         bias=module.affine, over=_channels_text("BatchNorm", info.ndim), **common)
    if type(module) in _INSTANCE_NORMS:
        if info.ndim != _INSTANCE_SPATIAL_DIMS[type(module)] + 2:
            return f"{where}: input of {info.ndim} dims (fastnorm fuses the batched form)"
        common["args"] = (x, AttrRef(p))
        return NormMatch(kind="InstanceNorm", written_as=f"nn.{type(module).__name__} (self.{p})",
                         helper="fused_instance_norm_module", begin=2, end=info.ndim, weight=module.affine,
                         bias=module.affine, over=_channels_text("InstanceNorm", info.ndim), **common)
    if type(module) is nn.GroupNorm:
        if info.ndim < 2:
            return f"{where}: input of {info.ndim} dims"
        common["args"] = (x, AttrRef(f"{p}.num_groups"), AttrRef(f"{p}.weight"), AttrRef(f"{p}.bias"),
                          AttrRef(f"{p}.eps"))
        return NormMatch(kind="GroupNorm", written_as=f"nn.GroupNorm (self.{p})", helper="fused_group_norm",
                         begin=1, end=info.ndim, weight=module.affine, bias=module.affine,
                         over=_channels_text("GroupNorm", info.ndim, module.num_groups), **common)
    return None


# ----------------------------------------------------------------------------------------------
# Functions


@dataclass(frozen=True)
class LibraryFunction:
    label: str           # how the report names it
    kind: str
    helper: str
    names: tuple         # its arguments in order (the C++ builtins have no Python signature)
    defaults: dict
    helper_args: tuple   # the bound arguments the helper takes, positionally


def _f(label, kind, helper, names, defaults, helper_args=None):
    """helper_args default: every argument but the cuDNN switch."""
    return LibraryFunction(label, kind, helper, names, defaults,
                           helper_args or tuple(n for n in names if not n.startswith("cudnn")))


_BN = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
_IN = ("input", "running_mean", "running_var", "weight", "bias", "use_input_stats", "momentum", "eps")
_LIBRARY = {
    F.layer_norm: _f("F.layer_norm", "LayerNorm", "fused_layer_norm",
                     ("input", "normalized_shape", "weight", "bias", "eps"),
                     {"weight": None, "bias": None, "eps": 1e-5}),
    torch.layer_norm: _f("torch.layer_norm", "LayerNorm", "fused_layer_norm",
                         ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable"),
                         {"weight": None, "bias": None, "eps": 1e-5, "cudnn_enable": True}),
    F.batch_norm: _f("F.batch_norm", "BatchNorm", "fused_batch_norm", _BN,
                     {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5}),
    torch.batch_norm: _f("torch.batch_norm", "BatchNorm", "fused_batch_norm",
                         ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
                          "cudnn_enabled"), {}, _BN),
    F.instance_norm: _f("F.instance_norm", "InstanceNorm", "fused_instance_norm", _IN,
                        {"running_mean": None, "running_var": None, "weight": None, "bias": None,
                         "use_input_stats": True, "momentum": 0.1, "eps": 1e-5}),
    torch.instance_norm: _f("torch.instance_norm", "InstanceNorm", "fused_instance_norm",
                            ("input", "weight", "bias", "running_mean", "running_var", "use_input_stats",
                             "momentum", "eps", "cudnn_enabled"), {}, _IN),
    F.group_norm: _f("F.group_norm", "GroupNorm", "fused_group_norm",
                     ("input", "num_groups", "weight", "bias", "eps"), {"weight": None, "bias": None, "eps": 1e-5}),
    torch.group_norm: _f("torch.group_norm", "GroupNorm", "fused_group_norm",
                         ("input", "num_groups", "weight", "bias", "eps", "cudnn_enabled"),
                         {"weight": None, "bias": None, "eps": 1e-5, "cudnn_enabled": True}),
    F.normalize: _f("F.normalize", "L2Norm", "fused_normalize", ("input", "p", "dim", "eps", "out"),
                    {"p": 2.0, "dim": 1, "eps": 1e-12, "out": None}, ("input",)),
}
for _fn, _label in ((getattr(F, "rms_norm", None), "F.rms_norm"), (getattr(torch, "rms_norm", None), "torch.rms_norm")):
    if _fn is not None:  # torch >= 2.4
        _LIBRARY[_fn] = _f(_label, "RMSNorm", "fused_rms_norm", ("input", "normalized_shape", "weight", "eps"),
                           {"weight": None, "eps": None})

LIBRARY_FUNCTIONS = frozenset(_LIBRARY)


def match_function(node: fx.Node, gm: fx.GraphModule):
    spec = _LIBRARY[node.target]
    where = f"{spec.label} at node {node.name!r}"
    bound = gp.bind(node, spec.names, spec.defaults)
    x = bound and bound["input"]
    info = gp.float_tensor(x)
    if bound is None or info is None or gp.tensor(node) is None:
        return f"{where}: unusual arguments"
    args = tuple(bound[n] for n in spec.helper_args)
    eps = bound.get("eps")
    weight = bound.get("weight") is not None
    bias = bound.get("bias") is not None
    common = dict(written_as=spec.label, helper=spec.helper, args=args, kwargs={}, output=node, matched=[node],
                  x=info, eps=gp.value_of(eps, gm), eps_source=gp.source_text(eps))
    if spec.kind in ("LayerNorm", "RMSNorm"):
        shape = gp.node_value(bound["normalized_shape"])
        shape = (shape,) if isinstance(shape, int) else shape
        if not isinstance(shape, (tuple, list)):
            return f"{where}: normalized_shape is not a shape"
        return NormMatch(kind=spec.kind, begin=info.ndim - len(shape), end=info.ndim, weight=weight,
                         bias=bias and spec.kind == "LayerNorm", **common)
    if info.ndim < 2:
        return f"{where}: input of {info.ndim} dims"
    if spec.kind == "BatchNorm":
        return NormMatch(kind="BatchNorm", begin=0, end=info.ndim, weight=weight, bias=bias,
                         over=_channels_text("BatchNorm", info.ndim), **common)
    if spec.kind == "InstanceNorm":
        return NormMatch(kind="InstanceNorm", begin=2, end=info.ndim, weight=weight, bias=bias,
                         over=_channels_text("InstanceNorm", info.ndim), **common)
    if spec.kind == "GroupNorm":
        return NormMatch(kind="GroupNorm", begin=1, end=info.ndim, weight=weight, bias=bias,
                         over=_channels_text("GroupNorm", info.ndim, gp.value_of(bound["num_groups"], gm)),
                         **common)
    return _match_normalize(node, bound, where, info, common)


def _match_normalize(node, bound, where, info, common) -> Optional[object]:
    """F.normalize(x, p, dim, eps): p 1 or 2 over consecutive dims."""
    if bound["out"] is not None:
        return f"{where}: out= given"
    p = gp.node_value(bound["p"])
    if not gp.number(p) or float(p) not in (1.0, 2.0):
        return f"{where}: p={p!r} (fastnorm fuses p=1 and p=2)"
    dims = gp.normalize_dims(bound["dim"], info.ndim)
    problem = gp.dims_problem(dims, True, info.ndim)
    if problem:
        return f"{where}: {problem}"
    begin, end = dims[0], dims[-1] + 1
    kwargs = {"p": bound["p"], "dim": bound["dim"], "eps": bound["eps"]}
    common.update(kwargs=kwargs)
    return NormMatch(kind=p_norm_kind(float(p), begin, end, info.ndim), begin=begin, end=end, weight=False,
                     bias=False, **common)


def p_norm_kind(p: float, begin: int, end: int, ndim: int) -> str:
    if p == 1.0:
        return "L1Norm"
    return "FrobeniusNorm" if (begin, end) == (0, ndim) and ndim > 1 else "L2Norm"
