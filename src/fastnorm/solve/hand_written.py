"""Normalizations the reference writes out with tensor arithmetic, followed forward from their statistic.

- LayerNorm: (x - mean(x)) / sqrt(var(x) + eps), or times rsqrt(var + eps), over consecutive dims, the
  variance biased (unbiased=False, correction=0, torch.var_mean, or mean((x - mean)**2)), then
  optionally `* weight` and `+ bias` with one value per normalized element;
- RMSNorm: x / sqrt(mean(x**2) + eps) or x * rsqrt(...) [* weight];
- L1 / L2 / Frobenius: x divided by mean(|x|), sum(|x|), sqrt(sum(x**2)), torch.norm, Tensor.norm,
  torch.linalg.norm or torch.linalg.vector_norm (p 1 or 2), optionally clamped below (F.normalize by hand).

Each matcher returns a NormMatch, a string (a near miss worth reporting) or None (not a norm at all).
"""
import operator
from dataclasses import dataclass
from typing import Optional

import torch
import torch.fx as fx

from fastnorm.solve import graph_patterns as gp
from fastnorm.solve.library_norms import p_norm_kind
from fastnorm.solve.norm_match import NormMatch
from fastnorm.solve.trace import node_value


@dataclass
class Context:
    gm: fx.GraphModule
    claimed: set     # nodes earlier matches took
    memo: dict       # gp.depends_on_input's cache
    order: dict      # node -> position in the graph

    def sorted(self, nodes) -> list:
        return sorted(set(nodes), key=self.order.__getitem__)


def _fits(y, info, ctx) -> bool:
    """y can be the fused norm's output: x's shape and dtype, not taken by an earlier match."""
    out = gp.tensor(y)
    return out is not None and out.shape == info.shape and out.dtype == info.dtype and y not in ctx.claimed


def _affine(y, info, begin, end, ctx, bias_too: bool):
    """(output node, weight node or None, bias node or None, nodes) for y [* weight] [+ bias]."""
    weight = gp.fusable_parameter(y, gp.MUL, info, begin, end, ctx.memo)
    out = weight[1] if weight else y
    bias = gp.fusable_parameter(out, gp.ADD, info, begin, end, ctx.memo) if bias_too else None
    out = bias[1] if bias else out
    nodes = [p[1] for p in (weight, bias) if p]
    return out, weight[0] if weight else None, bias[0] if bias else None, nodes


def _eps_form(eps) -> str:
    return "" if gp.number_equal(eps, 0.0) else " + eps"


# ----------------------------------------------------------------------------------------------
# RMSNorm


def match_rms(ms: fx.Node, ctx: Context):
    """x / sqrt(mean(x**2, dim, keepdim=True) + eps) [* weight], followed from the mean node."""
    sq, dim, keepdim = gp.mean_of(ms)
    x = gp.square_of(sq) if isinstance(sq, fx.Node) else None
    info = gp.float_tensor(x)
    if info is None:
        return None
    where = f"mean({x.name}**2) at node {ms.name!r}"
    dims = gp.normalize_dims(dim, info.ndim)
    problem = gp.dims_problem(dims, keepdim, info.ndim)
    if problem:
        return f"{where}: {problem}"
    begin, end = dims[0], dims[-1] + 1
    for den, eps in gp.plus_scalar(ms):
        for root in list(den.users):
            kind = gp.root_kind(root, den)
            if kind is None:
                continue
            for y, _, chain, op in gp.quotients({x}, root, reciprocal=kind == "rsqrt"):
                if not _fits(y, info, ctx):
                    continue
                output, weight, _, affine_nodes = _affine(y, info, begin, end, ctx, bias_too=False)
                form = f"x {op.format(kind + '({})')}".format("mean(x**2)" + _eps_form(eps))
                kwargs = {"dim": dim}
                if weight is not None:
                    kwargs["weight"] = weight
                    form += " * weight"
                kwargs["eps"] = eps
                return NormMatch(
                    kind="RMSNorm", written_as=f"hand-written {form}", helper="fused_rms_norm_over_dims",
                    args=(x,), kwargs=kwargs, output=output,
                    matched=ctx.sorted([sq, ms, den, root] + chain + affine_nodes),
                    x=info, begin=begin, end=end, weight=weight is not None, bias=False,
                    eps=gp.value_of(eps, ctx.gm), eps_source=gp.source_text(eps))
    return f"{where}: not followed by sqrt/rsqrt (+ eps) and a division or scaling of {x.name}"


# ----------------------------------------------------------------------------------------------
# LayerNorm


def variance_args(node):
    """(operand, dim, keepdim, biased) of torch.var / Tensor.var / torch.var_mean; None otherwise."""
    if not (gp.is_function(node, torch.var, torch.var_mean) or gp.is_method(node, "var")):
        return None
    if set(node.kwargs) - {"dim", "unbiased", "correction", "keepdim"} or len(node.args) > 4:
        return None
    rest = list(node.args[1:])
    dim, unbiased, correction, keepdim = node.kwargs.get("dim"), None, node.kwargs.get("correction"), False
    if rest and isinstance(node_value(rest[0]), bool):  # var(x, unbiased)
        unbiased = node_value(rest.pop(0))
    elif rest:
        dim = rest.pop(0)
    if rest:
        unbiased = node_value(rest.pop(0))
    if rest:
        keepdim = rest.pop(0)
    unbiased = node_value(node.kwargs.get("unbiased", unbiased))
    keepdim = node.kwargs.get("keepdim", keepdim)
    correction = node_value(correction)
    biased = unbiased is False or (unbiased is None and gp.number(correction) and float(correction) == 0.0)
    return node.args[0], dim, keepdim, biased


def _getitem(node, index):
    return [u for u in node.users if gp.is_function(u, operator.getitem) and u.args[1] == index]


def _variances(x, dims, centered, ndim):
    """(var node, nodes computing it, text, unbiased, broadcasts) for each variance of x over `dims`."""
    def same(dim):
        return gp.normalize_dims(dim, ndim) == dims

    def broadcasts(keepdim):
        return gp.dims_problem(dims, keepdim, ndim) is None

    for user in x.users:
        parsed = variance_args(user)
        if parsed is None or parsed[0] is not x or not same(parsed[1]):
            continue
        _, _, keepdim, biased = parsed
        if gp.is_function(user, torch.var_mean):
            for var in _getitem(user, 0):
                yield var, [user, var], "var_mean(x)", not biased, broadcasts(keepdim)
        else:
            yield user, [user], "var(x)", not biased, broadcasts(keepdim)
    for c in centered:
        for sq in c.users:
            if gp.square_of(sq) is not c:
                continue
            for mean in sq.users:
                parsed = gp.mean_of(mean)
                if parsed and parsed[0] is sq and same(parsed[1]):
                    yield mean, [sq, mean], "mean((x - mean)**2)", False, broadcasts(parsed[2])


def match_layer_norm(mean: fx.Node, x, dim, keepdim, ctx: Context, mean_nodes: list):
    """(x - mean) / sqrt(var + eps) [* weight] [+ bias] given the mean of x over `dim` (a mean node or a
    var_mean's second output; `mean_nodes` computes it)."""
    info = gp.float_tensor(x)
    if info is None:
        return None
    centered = [u for u in x.users if gp.difference(u) == (x, mean)]
    if not centered:
        return None
    dims = gp.normalize_dims(dim, info.ndim)
    variances = list(_variances(x, dims, centered, info.ndim)) if dims is not None else []
    if not variances:
        return None  # x - mean(x) without a variance: centering, not a norm
    where = f"(x - mean) at node {centered[0].name!r}"
    problem = gp.dims_problem(dims, keepdim, info.ndim)
    if problem:
        return f"{where} looks like a LayerNorm: {problem}"
    begin, end = dims[0], dims[-1] + 1
    if all(unbiased for _, _, _, unbiased, _ in variances):
        return f"{where} looks like a LayerNorm but its variance is unbiased (LayerNorm's is biased: unbiased=False)"
    for var, var_nodes, var_text, unbiased, broadcasts in variances:
        if unbiased or not broadcasts:
            continue
        for den, eps in gp.plus_scalar(var):
            for root in list(den.users):
                kind = gp.root_kind(root, den)
                if kind is None:
                    continue
                for y, c, chain, op in gp.quotients(set(centered), root, reciprocal=kind == "rsqrt"):
                    if not _fits(y, info, ctx):
                        continue
                    output, weight, bias, affine_nodes = _affine(y, info, begin, end, ctx, bias_too=True)
                    form = f"(x - mean) {op.format(kind + '({})')}".format(var_text + _eps_form(eps))
                    form += " * weight" if weight is not None else ""
                    form += " + bias" if bias is not None else ""
                    kwargs = {"dim": dim}
                    kwargs.update({k: v for k, v in (("weight", weight), ("bias", bias)) if v is not None})
                    kwargs["eps"] = eps
                    return NormMatch(
                        kind="LayerNorm", written_as=f"hand-written {form}", helper="fused_layer_norm_over_dims",
                        args=(x,), kwargs=kwargs, output=output,
                        matched=ctx.sorted(mean_nodes + centered + var_nodes + [den, root] + chain + affine_nodes),
                        x=info, begin=begin, end=end, weight=weight is not None, bias=bias is not None,
                        eps=gp.value_of(eps, ctx.gm), eps_source=gp.source_text(eps))
    return f"{where} looks like a LayerNorm but is not divided by sqrt(var + eps) (or times rsqrt)"


def match_var_mean(node: fx.Node, ctx: Context):
    """LayerNorm whose statistics come from torch.var_mean(x, dims, unbiased=False, keepdim=True)."""
    parsed = variance_args(node)
    if parsed is None:
        return None
    x, dim, keepdim, _ = parsed
    found = None
    for mean in _getitem(node, 1):
        found = match_layer_norm(mean, x, dim, keepdim, ctx, [node, mean])
        if isinstance(found, NormMatch):
            return found
    return found


# ----------------------------------------------------------------------------------------------
# L1 / L2 / Frobenius


@dataclass
class PNorm:
    """A p-norm of x over `dim` that some node computes."""
    x: fx.Node
    p: object              # 1.0 / 2.0, or the node / constant the reference passes (kept for the call)
    p_value: float
    mean: bool             # divided by the count (mean |x|)
    dim: object
    keepdim: object
    value: fx.Node         # the node whose value is the norm (or its reciprocal)
    reciprocal: bool
    nodes: list            # nodes computing it
    text: str              # for the report
    explicit: bool         # a norm function, so a near miss is worth reporting


def _p_value(p):
    value = node_value(p)
    if value is None or value == "fro":
        return 2.0
    if gp.number(value) and float(value) in (1.0, 2.0):
        return float(value)
    return None


_NORM_SIGNATURES = {  # (argument names, defaults) of the norm functions
    "torch.norm": (("input", "p", "dim", "keepdim", "out", "dtype"),
                   {"p": "fro", "dim": None, "keepdim": False, "out": None, "dtype": None}),
    "Tensor.norm": (("input", "p", "dim", "keepdim", "dtype"), {"p": "fro", "dim": None, "keepdim": False,
                                                                "dtype": None}),
    "torch.linalg.vector_norm": (("input", "p", "dim", "keepdim", "dtype"),
                                 {"p": 2.0, "dim": None, "keepdim": False, "dtype": None}),
    "torch.linalg.norm": (("input", "p", "dim", "keepdim", "out", "dtype"),
                          {"p": None, "dim": None, "keepdim": False, "out": None, "dtype": None}),
}


def _norm_function(node) -> Optional[str]:
    if gp.is_function(node, torch.norm):
        return "torch.norm"
    if gp.is_method(node, "norm"):
        return "Tensor.norm"
    if gp.is_function(node, torch.linalg.vector_norm):
        return "torch.linalg.vector_norm"
    if gp.is_function(node, torch.linalg.norm):
        return "torch.linalg.norm"
    return None


def is_norm_call(node) -> bool:
    return _norm_function(node) is not None


def _norm_call(node):
    """PNorm of a norm function call, or a string saying why it is not a vector 1- or 2-norm."""
    label = _norm_function(node)
    names, defaults = _NORM_SIGNATURES[label]
    bound = gp.bind(node, names, defaults, rename={"ord": "p"})
    where = f"{label} at node {node.name!r}"
    if bound is None:
        return f"{where}: unusual arguments"
    if bound.get("out") is not None or bound.get("dtype") is not None:
        return f"{where}: out= or dtype= given"
    p, dim = bound["p"], bound["dim"]
    p_text = node_value(p)
    info = gp.float_tensor(bound["input"])
    if info is None:
        return None
    if label == "torch.linalg.norm" and p_text is not None:
        dims = gp.normalize_dims(dim, info.ndim)
        vector = isinstance(node_value(dim), int) or (dims is not None and len(dims) == 1)
        if not vector and not (p_text == "fro" and dims is not None and len(dims) == 2):
            return f"{where}: ord={p_text!r} over {len(dims or [])} dims is a matrix norm"
    p_value = _p_value(p)
    if p_value is None:
        return f"{where}: p={p_text!r} (fastnorm fuses p=1, p=2 and 'fro')"
    keyword = "p" if label in ("torch.norm", "Tensor.norm") else "ord"
    given = "" if p_text is None else f"{keyword}={p_text!r}"
    text = f"x.norm({given})" if label == "Tensor.norm" else f"{label}(x{', ' + given if given else ''})"
    return PNorm(bound["input"], p if gp.number(p) else p_value, p_value, False, dim, bound["keepdim"], node,
                 False, [node], text, True)


def _reduction_norms(node):
    """PNorms that a mean / sum node starts: mean(|x|), sum(|x|), sqrt(sum(x**2)) (or its rsqrt)."""
    for reduce, mean in ((gp.mean_of, True), (gp.sum_of, False)):
        parsed = reduce(node)
        if parsed is None:
            continue
        operand, dim, keepdim = parsed
        x = gp.abs_of(operand) if isinstance(operand, fx.Node) else None
        name = "mean" if mean else "sum"
        if x is not None:
            yield PNorm(x, 1.0, 1.0, mean, dim, keepdim, node, False, [operand, node], f"{name}(|x|)", False)
        x = gp.square_of(operand) if isinstance(operand, fx.Node) and not mean else None
        if x is not None:  # mean(x**2) under a root is the RMSNorm's (match_rms)
            for root in node.users:
                kind = gp.root_kind(root, node)
                if kind:
                    yield PNorm(x, 2.0, 2.0, False, dim, keepdim, root, kind == "rsqrt", [operand, node, root],
                                f"{kind}(sum(x**2))", False)


def match_p_norm(candidates, ctx: Context):
    """The first candidate PNorm that x is divided by (after an optional clamp from below)."""
    reason = None
    for norm in candidates:
        if norm is None:
            continue
        if isinstance(norm, str):
            reason = reason or norm
            continue
        info = gp.float_tensor(norm.x)
        if info is None:
            continue
        where = f"{norm.text} at node {norm.value.name!r}"
        dims = gp.normalize_dims(norm.dim, info.ndim)
        problem = gp.dims_problem(dims, norm.keepdim, info.ndim)
        if problem:
            reason = reason or f"{where}: {problem}"
            continue
        begin, end = dims[0], dims[-1] + 1
        clamps = [(norm.value, 0.0)] if norm.reciprocal else gp.clamped_below(norm.value)
        for den, eps in clamps:
            for y, _, chain, op in gp.quotients({norm.x}, den, norm.reciprocal):
                if not _fits(y, info, ctx):
                    continue
                clamp = "" if den is norm.value else ".clamp_min(eps)"
                kwargs = {"p": norm.p, "dim": norm.dim, "eps": eps}
                if norm.mean:
                    kwargs["mean"] = True
                return NormMatch(
                    kind=p_norm_kind(norm.p_value, begin, end, info.ndim),
                    written_as=f"hand-written x {op.format(norm.text + clamp)}", helper="fused_normalize",
                    args=(norm.x,), kwargs=kwargs, output=y,
                    matched=ctx.sorted(norm.nodes + ([den] if den is not norm.value else []) + chain),
                    x=info, begin=begin, end=end, weight=False, bias=False, eps=gp.value_of(eps, ctx.gm),
                    eps_source=gp.source_text(eps) if den is not norm.value else "no clamp")
        if norm.explicit:
            reason = reason or f"{where}: {norm.x.name} is not divided by it"
    return reason


def match_norm_call(node: fx.Node, ctx: Context):
    return match_p_norm([_norm_call(node)], ctx)


def match_reduction(node: fx.Node, ctx: Context):
    """A mean or sum node: the statistic of a LayerNorm, an RMSNorm or an L1 / L2 normalization."""
    reason = None
    if gp.mean_of(node) is not None:
        operand, dim, keepdim = gp.mean_of(node)
        for found in (match_layer_norm(node, operand, dim, keepdim, ctx, [node]), match_rms(node, ctx)):
            if isinstance(found, NormMatch):
                return found
            reason = reason or found
    found = match_p_norm(_reduction_norms(node), ctx)
    return found if isinstance(found, NormMatch) else reason or found
