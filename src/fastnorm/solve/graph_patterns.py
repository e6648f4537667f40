"""Small pattern-matching helpers over a traced torch.fx graph, shared by the norm recognizers.

Every op is accepted in its function and its method spelling (torch.mul(a, b), a.mul(b), a * b), and a
node's propagated value (trace.node_value) tells shapes, dtypes and constants apart.
"""
import operator
from typing import Optional

import torch
import torch.fx as fx

from fastnorm.solve.norm_match import AttrRef
from fastnorm.solve.trace import TensorInfo, node_value


def is_function(node, *targets) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_function" and node.target in targets


def is_method(node, *names) -> bool:
    return isinstance(node, fx.Node) and node.op == "call_method" and node.target in names


def arg(node: fx.Node, index: int, name: str, default=None):
    """Argument `name` of a call given positionally at `index` (the tensor itself is index 0)."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def bind(node: fx.Node, names: tuple, defaults: dict, rename: Optional[dict] = None) -> Optional[dict]:
    """The call's arguments by name (positional ones bound in `names` order, missing ones from
    `defaults`, keywords renamed by `rename`); None when they do not fit the signature."""
    kwargs = {(rename or {}).get(k, k): v for k, v in node.kwargs.items()}
    if len(node.args) > len(names) or any(k not in names for k in kwargs):
        return None
    bound = dict(defaults)
    bound.update(zip(names, node.args))
    bound.update(kwargs)
    return bound if all(n in bound for n in names) else None


def tensor(node) -> Optional[TensorInfo]:
    value = node_value(node)
    return value if isinstance(value, TensorInfo) else None


def float_tensor(node) -> Optional[TensorInfo]:
    info = tensor(node)
    return info if info is not None and info.dtype.is_floating_point else None


def number(value) -> bool:
    value = node_value(value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def number_equal(value, target: float) -> bool:
    return not isinstance(value, fx.Node) and number(value) and float(value) == target


def binary_operands(node):
    """(a, b) of a + b / a * b / a / b / a - b in its function or method spelling; None otherwise."""
    if node.op in ("call_function", "call_method") and len(node.args) == 2 and not node.kwargs:
        return node.args
    return None


ADD = ((operator.add, torch.add), ("add",))
SUB = ((operator.sub, torch.sub, torch.subtract), ("sub", "subtract"))
MUL = ((operator.mul, torch.mul, torch.multiply), ("mul", "multiply"))
DIV = ((operator.truediv, torch.div, torch.true_divide, torch.divide), ("div", "true_divide", "divide"))
POW = ((operator.pow, torch.pow), ("pow",))


def is_op(node, table) -> bool:
    functions, methods = table
    return is_function(node, *functions) or is_method(node, *methods)


def depends_on_input(node, memo: dict) -> bool:
    """True if the node's value is computed from a forward input (not only parameters and constants)."""
    if not isinstance(node, fx.Node):
        return False
    if node not in memo:
        memo[node] = node.op == "placeholder" or any(depends_on_input(a, memo) for a in node.all_input_nodes)
    return memo[node]


# ----------------------------------------------------------------------------------------------
# Reduction dims


def normalize_dims(dim, ndim: int):
    """Sorted, non-negative dims of a reduction (None or () = all); None if not plain ints in range."""
    dim = node_value(dim)
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) and not isinstance(dim, bool) else dim
    if not isinstance(dims, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
        return None
    if not all(-ndim <= d < ndim for d in dims) or len(set(d % ndim for d in dims)) != len(dims):
        return None
    return sorted(d % ndim for d in dims)


def dims_problem(dims, keepdim, ndim: int) -> Optional[str]:
    """Why a statistic reduced over `dims` cannot be a fused norm's (None when it can): the dims must be
    consecutive, and the statistic must broadcast back over x (keepdim, or the leading dims reduced)."""
    if dims is None:
        return "reduction dims are not plain ints"
    if dims != list(range(dims[0], dims[-1] + 1)):
        return f"dims {tuple(dims)} are not consecutive"
    if not node_value(keepdim) and dims[0] != 0:
        return "keepdim=False, so it does not broadcast back over the input"
    return None


# ----------------------------------------------------------------------------------------------
# Where a value comes from (for the report) and what it is at trace time


def source_text(value) -> str:
    if isinstance(value, AttrRef):
        return f"self.{value.path}"
    if isinstance(value, fx.Node):
        if value.op == "get_attr":
            return f"self.{value.target}"
        return f"computed by node {value.name}"
    return "constant"


def get_attr(root, path: str):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def value_of(value, gm):
    if isinstance(value, AttrRef):
        return get_attr(gm, value.path)
    if isinstance(value, fx.Node):
        if value.op == "get_attr":
            return get_attr(gm, value.target)
        return node_value(value)
    return value


# ----------------------------------------------------------------------------------------------
# Arithmetic shapes of a normalization


def square_of(node):
    """x if node computes x**2 (any spelling), else None."""
    if is_op(node, POW):
        base, exponent = node.args[0], arg(node, 1, "exponent")
        if number_equal(exponent, 2.0) and len(node.args) <= 2:
            return base
    if is_function(node, torch.square) or is_method(node, "square"):
        return node.args[0] if node.args else None
    if is_op(node, MUL):
        ops = binary_operands(node)
        if ops and ops[0] is ops[1] and isinstance(ops[0], fx.Node):
            return ops[0]
    return None


def abs_of(node):
    """x if node computes |x|, else None."""
    if (is_function(node, torch.abs, torch.absolute) or is_method(node, "abs", "absolute")) \
            and len(node.args) == 1 and not node.kwargs:
        return node.args[0]
    return None


def reduction_of(node, function, method: str):
    """(operand, dim, keepdim) of torch.<function>(operand, dim, keepdim) / operand.<method>(...) without a
    dtype; None otherwise."""
    if not (is_function(node, function) or is_method(node, method)):
        return None
    if len(node.args) > 3 or node.kwargs.get("dtype") is not None or "out" in node.kwargs:
        return None
    if set(node.kwargs) - {"dim", "keepdim", "dtype"}:
        return None
    return node.args[0], arg(node, 1, "dim"), arg(node, 2, "keepdim", False)


def mean_of(node):
    return reduction_of(node, torch.mean, "mean")


def sum_of(node):
    return reduction_of(node, torch.sum, "sum")


def root_kind(node, operand):
    """'sqrt' or 'rsqrt' if node is the (reciprocal) square root of operand."""
    if (is_function(node, torch.sqrt) or is_method(node, "sqrt")) and node.args[0] is operand:
        return "sqrt"
    if (is_function(node, torch.rsqrt) or is_method(node, "rsqrt")) and node.args[0] is operand:
        return "rsqrt"
    if is_op(node, POW) and node.args[0] is operand and len(node.args) == 2 and not node.kwargs:
        if number_equal(node.args[1], 0.5):
            return "sqrt"
        if number_equal(node.args[1], -0.5):
            return "rsqrt"
    return None


def is_reciprocal_of(node, operand) -> bool:
    if (is_function(node, torch.reciprocal) or is_method(node, "reciprocal")) and node.args[0] is operand:
        return True
    ops = binary_operands(node) if is_op(node, DIV) else None
    return bool(ops) and number_equal(ops[0], 1.0) and ops[1] is operand


def other_operand(node, table, operand):
    """b if node is `operand <op> b` or `b <op> operand` for a commutative op of `table`; None otherwise."""
    ops = binary_operands(node) if is_op(node, table) else None
    if not ops:
        return None
    if ops[1] is operand:
        return ops[0]
    if ops[0] is operand:
        return ops[1]
    return None


def divided_by(node, divisor):
    ops = binary_operands(node) if is_op(node, DIV) and "rounding_mode" not in node.kwargs else None
    return ops[0] if ops and ops[1] is divisor else None


def difference(node):
    """(a, b) if node is a - b; None otherwise."""
    return binary_operands(node) if is_op(node, SUB) else None


def plus_scalar(value):
    """(sum, scalar) pairs: value + scalar for each such use of value, and value itself (scalar 0)."""
    yield value, 0.0
    for user in value.users:
        scalar = other_operand(user, ADD, value)
        if scalar is not None and number(scalar):
            yield user, scalar


def clamped_below(value):
    """(node, eps) pairs: value.clamp_min(eps) / clamp(value, min=eps) for each such use, and value itself
    (eps 0: a norm is never negative, so no clamp is max(norm, 0))."""
    yield value, 0.0
    for user in value.users:
        if not (is_function(user, torch.clamp, torch.clamp_min, torch.clip)
                or is_method(user, "clamp", "clamp_min", "clip")) or user.args[0] is not value:
            continue
        if user.target in (torch.clamp_min, "clamp_min"):
            low, high = arg(user, 1, "min"), None
        else:
            low, high = arg(user, 1, "min"), arg(user, 2, "max")
        if high is None and number(low):
            yield user, low


def quotients(numerators, divisor, reciprocal: bool = False):
    """(y, numerator, chain, operator text) for each y = n / divisor, n * (1 / divisor) or
    n * reciprocal(divisor) with n in `numerators`; with `reciprocal` (divisor is already 1 / the norm,
    e.g. an rsqrt), each y = n * divisor. The operator text has `{}` where the divisor's expression goes."""
    if reciprocal:
        for y in divisor.users:
            n = other_operand(y, MUL, divisor)
            if n is not None and n in numerators:
                yield y, n, [y], "* {}"
        return
    for user in divisor.users:
        n = divided_by(user, divisor)
        if n is not None and n in numerators:
            yield user, n, [user], "/ {}"
        elif is_reciprocal_of(user, divisor):
            for y in user.users:
                n = other_operand(y, MUL, user)
                if n is not None and n in numerators:
                    yield y, n, [user, y], "* (1 / {})"


def fusable_parameter(y: fx.Node, table, x: TensorInfo, begin: int, end: int, memo: dict):
    """(parameter, result node) if y's only use is y * p (table MUL) or y + p (ADD) with p a tensor that
    does not depend on the input, of x's dtype, varying only along the normalized dims [begin, end)."""
    if len(y.users) != 1:
        return None
    result = next(iter(y.users))
    param = other_operand(result, table, y)
    info = tensor(param)
    out = tensor(result)
    if param is None or info is None or out is None or depends_on_input(param, memo):
        return None
    if info.dtype != x.dtype or out.dtype != x.dtype or out.shape != x.shape or info.ndim > x.ndim:
        return None
    aligned = (1,) * (x.ndim - info.ndim) + tuple(info.shape)
    wanted = tuple(x.shape[d] if begin <= d < end else 1 for d in range(x.ndim))
    return (param, result) if aligned == wanted else None
