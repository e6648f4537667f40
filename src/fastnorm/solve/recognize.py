"""Find the LayerNorms and RMSNorms in a traced model graph, however they are written.

Recognized (each becomes one call of a fused helper in the generated forward):
- nn.LayerNorm modules, F.layer_norm / torch.layer_norm calls (trailing dims, affine or not);
- nn.RMSNorm modules, F.rms_norm / torch.rms_norm calls;
- hand-written RMSNorm over any consecutive dims of x:
      x / sqrt(mean(x**2, dim, keepdim=True) + eps)       (sqrt, .sqrt(), ** 0.5, pow(.., 0.5))
      x * rsqrt(mean(x**2, dim, keepdim=True) + eps)      (rsqrt, .rsqrt(), ** -0.5, 1 / sqrt, reciprocal)
  with x**2 written as x ** 2, x.pow(2), torch.pow(x, 2), x * x, torch.square(x), x.square(); the eps
  term optional, a constant or a float attribute; optionally followed by `* weight` where the weight is
  a parameter (or a view of one) of x's dtype that varies only along the normalized dims. The
  mean must keep dims (or reduce everything). A cast to float32 before and back after (LLaMA style)
  stays as written around the fused norm; the weight is then not fused.

Other ops stay as they are. Norms of other kinds (BatchNorm, GroupNorm, ...) are reported, not fused.
"""
import operator
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from fastnorm.solve.trace import TensorInfo, node_value


@dataclass(frozen=True)
class AttrRef:
    """`self.<path>` of the model, read at forward time (so constructor arguments are honoured)."""
    path: str


@dataclass
class NormMatch:
    kind: str                  # "LayerNorm" or "RMSNorm"
    written_as: str            # how the reference wrote it, for the report
    helper: str                # the fused helper of the generated file that replaces it
    args: tuple                # helper's positional arguments: fx Nodes, constants or AttrRefs
    kwargs: dict               # helper's keyword arguments, same kinds of values
    output: fx.Node            # the node whose uses the fused call takes over
    matched: list              # nodes of the reference subgraph (dropped once unused)
    x: TensorInfo              # the normalized input as traced
    begin: int                 # normalized dims [begin, end) of x
    end: int
    weight: bool
    bias: bool
    eps: Any                   # value for the report; None means torch.finfo(dtype).eps
    eps_source: str            # where eps comes from, for the report

    @property
    def dims_text(self) -> str:
        return f"dim {self.begin}" if self.end == self.begin + 1 else f"dims {self.begin}..{self.end - 1}"

    def describe(self) -> str:
        dims = self.dims_text
        affine = " + ".join(n for n, present in (("weight", self.weight), ("bias", self.bias)) if present)
        eps = "finfo(dtype).eps" if self.eps is None else f"{self.eps:g}"
        return (f"{self.kind} over {dims} of {self.x.describe()}"
                f"{', ' + affine if affine else ', no weight'}, eps={eps} ({self.eps_source}); "
                f"written as {self.written_as}")


@dataclass
class Recognition:
    matches: list
    other_norms: list = field(default_factory=list)   # norm-like things found but not fused, with why
    ops: list = field(default_factory=list)           # every op of the graph, for "what was found"


# ----------------------------------------------------------------------------------------------
# Small graph helpers


def _is_function(node, *targets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def _is_method(node, *names) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target in names


def _arg(node: fx.Node, index: int, name: str, default=None):
    """Argument `name` of a call given positionally at `index` (the tensor itself is index 0)."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def _tensor(node) -> Optional[TensorInfo]:
    value = node_value(node)
    return value if isinstance(value, TensorInfo) else None


def _number(value) -> bool:
    value = node_value(value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number_equal(value, target: float) -> bool:
    return not isinstance(value, fx.Node) and _number(value) and float(value) == target


def _binary_operands(node):
    """(a, b) of a + b / a * b / a / b in its function or method spelling; None otherwise."""
    if node.op == "call_function" and len(node.args) == 2 and not node.kwargs:
        return node.args
    if node.op == "call_method" and len(node.args) == 2 and not node.kwargs:
        return node.args
    return None


_ADD = ((operator.add, torch.add), ("add",))
_MUL = ((operator.mul, torch.mul, torch.multiply), ("mul", "multiply"))
_DIV = ((operator.truediv, torch.div, torch.true_divide, torch.divide), ("div", "true_divide", "divide"))
_POW = ((operator.pow, torch.pow), ("pow",))


def _is_op(node, table) -> bool:
    functions, methods = table
    return _is_function(node, *functions) or _is_method(node, *methods)


def _depends_on_input(node, memo: dict) -> bool:
    """True if the node's value is computed from a forward input (not only parameters and constants)."""
    if not isinstance(node, fx.Node):
        return False
    if node not in memo:
        memo[node] = node.op == "placeholder" or any(_depends_on_input(a, memo) for a in node.all_input_nodes)
    return memo[node]


def _normalize_dims(dim, ndim: int):
    """Sorted, non-negative dims of a reduction; None if not a plain int / sequence of ints."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) else dim
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return None
    if not all(-ndim <= d < ndim for d in dims):
        return None
    return sorted(d % ndim for d in dims)


def _source_text(value, gm) -> str:
    if isinstance(value, AttrRef):
        return f"self.{value.path}"
    if isinstance(value, fx.Node):
        if value.op == "get_attr":
            return f"self.{value.target}"
        return f"computed by node {value.name}"
    return "constant"


def _value_of(value, gm):
    if isinstance(value, AttrRef):
        return _get_attr(gm, value.path)
    if isinstance(value, fx.Node):
        if value.op == "get_attr":
            return _get_attr(gm, value.target)
        return node_value(value)
    return value


def _get_attr(root, path: str):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


# ----------------------------------------------------------------------------------------------
# Library calls: modules and functions


def _rms_norm_module_type():
    return getattr(nn, "RMSNorm", None)  # torch >= 2.4


def _match_module(node: fx.Node, gm: fx.GraphModule):
    module = gm.get_submodule(node.target)
    x = node.args[0] if node.args else None
    info = _tensor(x)
    out = _tensor(node)
    if info is None or out is None or len(node.args) != 1 or node.kwargs:
        return None
    p = node.target
    ndims = len(module.normalized_shape) if hasattr(module, "normalized_shape") else 0
    if type(module) is nn.LayerNorm:
        return NormMatch(
            kind="LayerNorm", written_as=f"nn.LayerNorm (self.{p})", helper="fused_layer_norm",
            args=(x, AttrRef(f"{p}.normalized_shape"), AttrRef(f"{p}.weight"), AttrRef(f"{p}.bias"),
                  AttrRef(f"{p}.eps")),
            kwargs={}, output=node, matched=[node], x=info, begin=info.ndim - ndims, end=info.ndim,
            weight=module.weight is not None, bias=module.bias is not None, eps=module.eps,
            eps_source=f"self.{p}.eps")
    if _rms_norm_module_type() is not None and type(module) is _rms_norm_module_type():
        return NormMatch(
            kind="RMSNorm", written_as=f"nn.RMSNorm (self.{p})", helper="fused_rms_norm",
            args=(x, AttrRef(f"{p}.normalized_shape"), AttrRef(f"{p}.weight"), AttrRef(f"{p}.eps")),
            kwargs={}, output=node, matched=[node], x=info, begin=info.ndim - ndims, end=info.ndim,
            weight=module.weight is not None, bias=False, eps=module.eps, eps_source=f"self.{p}.eps")
    return None


# name of each argument of the library functions, in order (their C++ builtins have no signature)
_LAYER_NORM_FUNCTIONS = {F.layer_norm: ("input", "normalized_shape", "weight", "bias", "eps"),
                         torch.layer_norm: ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable")}
_RMS_NORM_FUNCTIONS = {f: ("input", "normalized_shape", "weight", "eps")
                       for f in (getattr(F, "rms_norm", None), getattr(torch, "rms_norm", None)) if f is not None}
_DEFAULTS = {"weight": None, "bias": None, "eps": None, "cudnn_enable": True}


def _bind(node: fx.Node, names: tuple):
    if len(node.args) > len(names) or any(k not in names for k in node.kwargs):
        return None
    bound = dict(zip(names, node.args))
    bound.update(node.kwargs)
    return bound if all(n in bound or n in _DEFAULTS for n in names) else None


def _match_function(node: fx.Node, gm: fx.GraphModule):
    layer = node.target in _LAYER_NORM_FUNCTIONS
    names = _LAYER_NORM_FUNCTIONS[node.target] if layer else _RMS_NORM_FUNCTIONS[node.target]
    bound = _bind(node, names)
    if bound is None:
        return None
    x = bound["input"]
    info = _tensor(x)
    shape = node_value(bound["normalized_shape"])
    shape = (shape,) if isinstance(shape, int) else shape
    if info is None or not isinstance(shape, (tuple, list)) or _tensor(node) is None:
        return None
    weight, bias = bound.get("weight"), bound.get("bias")
    eps = bound.get("eps", 1e-5 if layer else None)
    label = f"{'torch' if node.target in (torch.layer_norm, getattr(torch, 'rms_norm', None)) else 'F'}." \
            f"{'layer_norm' if layer else 'rms_norm'}"
    if layer:
        args = (x, bound["normalized_shape"], weight, bias, eps)
    else:
        args = (x, bound["normalized_shape"], weight, eps)
    return NormMatch(
        kind="LayerNorm" if layer else "RMSNorm", written_as=label,
        helper="fused_layer_norm" if layer else "fused_rms_norm", args=args, kwargs={}, output=node,
        matched=[node], x=info, begin=info.ndim - len(shape), end=info.ndim, weight=weight is not None,
        bias=bias is not None, eps=_value_of(eps, gm), eps_source=_source_text(eps, gm))


# ----------------------------------------------------------------------------------------------
# Hand-written RMSNorm, followed forward from mean(x**2)


def _square_of(node):
    """x if node computes x**2 (any spelling), else None."""
    if _is_op(node, _POW):
        base, exponent = node.args[0], _arg(node, 1, "exponent")
        if _number_equal(exponent, 2.0) and len(node.args) <= 2:
            return base
    if _is_function(node, torch.square) or _is_method(node, "square"):
        return node.args[0] if node.args else None
    if _is_op(node, _MUL):
        ops = _binary_operands(node)
        if ops and ops[0] is ops[1] and isinstance(ops[0], fx.Node):
            return ops[0]
    return None


def _mean_of(node):
    """(operand, dim, keepdim) of mean(operand, dim, keepdim) without a dtype; None otherwise."""
    if not (_is_function(node, torch.mean) or _is_method(node, "mean")):
        return None
    if len(node.args) > 3 or node.kwargs.get("dtype") is not None or "out" in node.kwargs:
        return None
    return node.args[0], _arg(node, 1, "dim"), _arg(node, 2, "keepdim", False)


def _sqrt_kind(node, operand):
    """'sqrt' or 'rsqrt' if node is the (reciprocal) square root of operand."""
    if (_is_function(node, torch.sqrt) or _is_method(node, "sqrt")) and node.args[0] is operand:
        return "sqrt"
    if (_is_function(node, torch.rsqrt) or _is_method(node, "rsqrt")) and node.args[0] is operand:
        return "rsqrt"
    if _is_op(node, _POW) and node.args[0] is operand and len(node.args) == 2 and not node.kwargs:
        if _number_equal(node.args[1], 0.5):
            return "sqrt"
        if _number_equal(node.args[1], -0.5):
            return "rsqrt"
    return None


def _is_reciprocal_of(node, operand) -> bool:
    if (_is_function(node, torch.reciprocal) or _is_method(node, "reciprocal")) and node.args[0] is operand:
        return True
    ops = _binary_operands(node) if _is_op(node, _DIV) else None
    return bool(ops) and _number_equal(ops[0], 1.0) and ops[1] is operand


def _scaled_by(node, factor):
    """The other operand if node is factor * other or other * factor; None otherwise."""
    ops = _binary_operands(node) if _is_op(node, _MUL) else None
    if not ops:
        return None
    if ops[1] is factor:
        return ops[0]
    if ops[0] is factor:
        return ops[1]
    return None


def _divided_by(node, divisor):
    ops = _binary_operands(node) if _is_op(node, _DIV) and "rounding_mode" not in node.kwargs else None
    return ops[0] if ops and ops[1] is divisor else None


def _denominators(ms):
    """(den, eps) pairs: ms + eps with a scalar eps, or ms itself (eps = 0)."""
    yield ms, 0.0
    for user in ms.users:
        if _is_op(user, _ADD) and not user.kwargs:
            ops = _binary_operands(user)
            if not ops:
                continue
            other = ops[1] if ops[0] is ms else ops[0] if ops[1] is ms else None
            if other is not None and _number(other):
                yield user, other


def _normalized_outputs(ms, x):
    """(y, eps, chain, form) for every way ms flows into x normalized by its root mean square."""
    for den, eps in _denominators(ms):
        for root in den.users:
            kind = _sqrt_kind(root, den)
            if kind == "sqrt":
                for user in root.users:
                    if _divided_by(user, root) is x:
                        yield user, eps, [den, root, user], "x / sqrt({})"
                    elif _is_reciprocal_of(user, root):
                        for y in user.users:
                            if _scaled_by(y, user) is x:
                                yield y, eps, [den, root, user, y], "x * (1 / sqrt({}))"
            elif kind == "rsqrt":
                for y in root.users:
                    if _scaled_by(y, root) is x:
                        yield y, eps, [den, root, y], "x * rsqrt({})"


def _fusable_weight(y: fx.Node, x: TensorInfo, begin: int, end: int, memo: dict):
    """(weight node, product node) if y's only use is y * weight with a per-normalized-element weight."""
    if len(y.users) != 1:
        return None
    product = next(iter(y.users))
    weight = _scaled_by(product, y)
    info = _tensor(weight)
    out = _tensor(product)
    if weight is None or info is None or out is None or _depends_on_input(weight, memo):
        return None
    if info.dtype != x.dtype or out.dtype != x.dtype or out.shape != x.shape or info.ndim > x.ndim:
        return None
    aligned = (1,) * (x.ndim - info.ndim) + tuple(info.shape)
    wanted = tuple(x.shape[d] if begin <= d < end else 1 for d in range(x.ndim))
    return (weight, product) if aligned == wanted else None


def _match_hand_written_rms(ms: fx.Node, gm, claimed: set, memo: dict):
    """NormMatch, a reason string (a near miss worth reporting), or None (not an RMS at all)."""
    mean = _mean_of(ms)
    if mean is None:
        return None
    sq, dim, keepdim = mean
    x = _square_of(sq) if isinstance(sq, fx.Node) else None
    info = _tensor(x)
    if info is None:
        return None
    where = f"mean({x.name}**2) at node {ms.name!r}"
    dims = _normalize_dims(node_value(dim), info.ndim)
    if dims is None:
        return f"{where}: reduction dims {dim!r} are not plain ints"
    if dims != list(range(dims[0], dims[-1] + 1)):
        return f"{where}: dims {tuple(dims)} are not consecutive"
    if not node_value(keepdim) and len(dims) != info.ndim:
        return f"{where}: keepdim=False, so it does not broadcast back over {x.name}"
    begin, end = dims[0], dims[-1] + 1
    for y, eps, chain, form in _normalized_outputs(ms, x):
        out = _tensor(y)
        if out is None or out.shape != info.shape or out.dtype != info.dtype:
            continue
        if y in claimed:
            continue
        weight = _fusable_weight(y, info, begin, end, memo)
        output = weight[1] if weight else y
        form = form.format("mean(x**2)" + ("" if _number_equal(eps, 0.0) else " + eps"))
        kwargs = {"dim": dim}
        if weight:
            kwargs["weight"] = weight[0]
            form += " * weight"
        kwargs["eps"] = eps
        return NormMatch(
            kind="RMSNorm", written_as=f"hand-written {form}", helper="fused_rms_norm_over_dims",
            args=(x,), kwargs=kwargs, output=output,
            matched=[sq, ms] + [n for n in chain if n is not ms] + ([output] if weight else []),
            x=info, begin=begin, end=end, weight=bool(weight), bias=False, eps=_value_of(eps, gm),
            eps_source=_source_text(eps, gm))
    return f"{where}: not followed by sqrt/rsqrt (+ eps) and a division or scaling of {x.name}"


# ----------------------------------------------------------------------------------------------
# Norms fastnorm does not fuse, reported by name

_OTHER_NORM_MODULES = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LocalResponseNorm, nn.CrossMapLRN2d)
_OTHER_NORM_FUNCTIONS = {F.batch_norm: "F.batch_norm", F.group_norm: "F.group_norm",
                         F.instance_norm: "F.instance_norm", F.local_response_norm: "F.local_response_norm",
                         F.normalize: "F.normalize", torch.batch_norm: "torch.batch_norm",
                         torch.group_norm: "torch.group_norm", torch.instance_norm: "torch.instance_norm",
                         torch.norm: "torch.norm"}


def _op_name(node: fx.Node, gm) -> str:
    if node.op == "call_module":
        return f"{type(gm.get_submodule(node.target)).__name__} (self.{node.target})"
    if node.op == "call_method":
        return f".{node.target}()"
    if node.op == "call_function":
        return getattr(node.target, "__name__", str(node.target))
    return node.op


def recognize(gm: fx.GraphModule) -> Recognition:
    """Every supported normalization of the traced graph, in graph order, without overlaps."""
    result = Recognition(matches=[])
    claimed, memo = set(), {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        result.ops.append(_op_name(node, gm))
        if node in claimed:
            continue
        match = None
        if node.op == "call_module":
            module = gm.get_submodule(node.target)
            match = _match_module(node, gm)
            if match is None and isinstance(module, _OTHER_NORM_MODULES + (nn.LayerNorm,)):
                result.other_norms.append(f"{type(module).__name__} (self.{node.target})")
            elif match is None and _rms_norm_module_type() and isinstance(module, _rms_norm_module_type()):
                result.other_norms.append(f"{type(module).__name__} (self.{node.target})")
        elif node.op == "call_function" and (node.target in _LAYER_NORM_FUNCTIONS or node.target in _RMS_NORM_FUNCTIONS):
            match = _match_function(node, gm)
            if match is None:
                result.other_norms.append(f"{_op_name(node, gm)} call at node {node.name!r} with unusual arguments")
        elif node.op == "call_function" and node.target in _OTHER_NORM_FUNCTIONS:
            result.other_norms.append(f"{_OTHER_NORM_FUNCTIONS[node.target]} at node {node.name!r}")
        elif _mean_of(node) is not None:
            found = _match_hand_written_rms(node, gm, claimed, memo)
            if isinstance(found, str):
                result.other_norms.append(found)
            else:
                match = found
        if isinstance(match, NormMatch):
            if any(n in claimed for n in match.matched):
                continue
            claimed.update(match.matched)
            result.matches.append(match)
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    result.matches.sort(key=lambda m: order[m.output])
    return result
