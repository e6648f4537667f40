"""Find the normalizations in a traced model graph, however they are written.

Recognized (each becomes one call of a fused helper in the generated forward):
- modules: nn.LayerNorm, nn.RMSNorm, nn.BatchNorm1d/2d/3d (training with batch statistics and the
  running-statistics update, momentum None, num_batches_tracked; eval mode; track_running_stats=False;
  affine or not), nn.GroupNorm, nn.InstanceNorm1d/2d/3d (affine, track_running_stats);
- functions: F.layer_norm / torch.layer_norm, F.rms_norm / torch.rms_norm, F.batch_norm /
  torch.batch_norm, F.group_norm / torch.group_norm, F.instance_norm / torch.instance_norm, F.normalize
  (p 1 or 2 over consecutive dims);
- hand-written, over any consecutive dims of x (library_norms.py and hand_written.py say exactly):
      LayerNorm  (x - x.mean(d, keepdim=True)) / sqrt(x.var(d, keepdim=True, unbiased=False) + eps)
                 or * rsqrt(...), with torch.var_mean, correction=0 or mean((x - mean)**2), optionally
                 `* weight + bias` with one value per normalized element;
      RMSNorm    x / sqrt(mean(x**2, d, keepdim=True) + eps) or x * rsqrt(...) (sqrt, ** 0.5, 1 / sqrt,
                 reciprocal; x**2 as x ** 2, pow, x * x, square), optionally `* weight`;
      L1 / L2    x divided by mean(|x|), sum(|x|), sqrt(sum(x**2)), torch.norm, Tensor.norm,
                 torch.linalg.norm, torch.linalg.vector_norm (p 1 or 2, 'fro' over the whole tensor),
                 optionally clamped from below (F.normalize written out).
  A statistic must keep its dims (or reduce the leading ones) so it broadcasts back over x. A cast to
  float32 before and back after (LLaMA style) stays as written around the fused norm.

Other ops stay as they are. Near misses (dims not consecutive, p=3, an unbiased variance, ...) and
norms fastnorm does not have (LocalResponseNorm, SyncBatchNorm, ...) are reported, not fused.
"""
from dataclasses import dataclass, field

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from fastnorm.solve import graph_patterns as gp
from fastnorm.solve import hand_written, library_norms
from fastnorm.solve.norm_match import AttrRef, NormMatch

__all__ = ["AttrRef", "NormMatch", "Recognition", "recognize"]


@dataclass
class Recognition:
    matches: list
    other_norms: list = field(default_factory=list)   # norm-like things found but not fused, with why
    ops: list = field(default_factory=list)           # every op of the graph, for "what was found"


# Norm modules and functions fastnorm has no kernel for: reported by name when met.
_OTHER_NORM_MODULES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.LocalResponseNorm,
                       nn.CrossMapLRN2d) + ((library_norms.rms_norm_module_type(),)
                                            if library_norms.rms_norm_module_type() else ())
_OTHER_NORM_FUNCTIONS = {F.local_response_norm: "F.local_response_norm"}


def _op_name(node: fx.Node, gm) -> str:
    if node.op == "call_module":
        return f"{type(gm.get_submodule(node.target)).__name__} (self.{node.target})"
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return node.op


def _match_node(node: fx.Node, ctx: hand_written.Context):
    """NormMatch, a near-miss string, or None for one node of the graph."""
    gm = ctx.gm
    if node.op == "call_module":
        module = gm.get_submodule(node.target)
        found = library_norms.match_module(node, gm)
        if found is None and isinstance(module, _OTHER_NORM_MODULES):
            return f"{type(module).__name__} (self.{node.target})"
        return found
    if node.op == "call_function" and node.target in library_norms.LIBRARY_FUNCTIONS:
        return library_norms.match_function(node, gm)
    if node.op == "call_function" and node.target in _OTHER_NORM_FUNCTIONS:
        return f"{_OTHER_NORM_FUNCTIONS[node.target]} at node {node.name!r}"
    if hand_written.is_norm_call(node):
        return hand_written.match_norm_call(node, ctx)
    if gp.is_function(node, torch.var_mean):
        return hand_written.match_var_mean(node, ctx)
    if gp.mean_of(node) is not None or gp.sum_of(node) is not None:
        return hand_written.match_reduction(node, ctx)
    return None


def recognize(gm: fx.GraphModule) -> Recognition:
    """Every supported normalization of the traced graph, in graph order, without overlaps."""
    result = Recognition(matches=[])
    ctx = hand_written.Context(gm, claimed=set(), memo={}, order={n: i for i, n in enumerate(gm.graph.nodes)})
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        result.ops.append(_op_name(node, gm))
        if node in ctx.claimed:
            continue
        found = _match_node(node, ctx)
        if isinstance(found, str):
            result.other_norms.append(found)
        elif isinstance(found, NormMatch) and not any(n in ctx.claimed for n in found.matched):
            ctx.claimed.update(found.matched)
            result.matches.append(found)
    result.matches.sort(key=lambda m: ctx.order[m.output])
    return result
