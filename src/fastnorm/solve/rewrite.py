"""Replace the recognized norm subgraphs by fused-helper calls and generate the new forward's source.

A forward that is nothing but norms gets a hand-readable one-line body; anything else gets the code
torch.fx generates for the rewritten graph (one statement per op, other ops kept as PyTorch calls).
"""
import ast
import builtins
import io
import keyword
import math
import re
import tokenize
import warnings
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from fastnorm.solve.fused_helpers import HELPERS
from fastnorm.solve.norm_match import AttrRef


@dataclass
class ForwardCode:
    source: str                 # "def forward(self, ...):\n    ..." at indentation 0
    helpers: list               # names of the fused helpers it calls, in HELPERS order
    globals: dict = field(default_factory=dict)  # other global names it uses -> the objects they name
    direct: bool = False        # True: hand-written body; False: torch.fx generated


_HELPER_NAMES = {id(f): name for name, f in HELPERS.items()}


def apply_matches(graph: fx.Graph, matches: list) -> None:
    """Rewrite `graph` in place: each match's output is computed by its fused helper instead."""
    replaced = {}  # output node of an earlier match -> its fused node (later matches may read it)
    for match in matches:
        with graph.inserting_before(match.output), warnings.catch_warnings():
            # get_attr of a float (self.ln.eps) is fine for code generation; fx warns about it.
            warnings.simplefilter("ignore", UserWarning)
            materialized = {}

            def node_for(value):
                if isinstance(value, AttrRef):
                    if value.path not in materialized:
                        materialized[value.path] = graph.get_attr(value.path)
                    return materialized[value.path]
                if isinstance(value, (tuple, list)):
                    return type(value)(node_for(v) for v in value)
                return replaced.get(value, value) if isinstance(value, fx.Node) else value

            fused = graph.create_node(
                "call_function", HELPERS[match.helper], tuple(node_for(a) for a in match.args),
                {k: node_for(v) for k, v in match.kwargs.items()}, name="norm")
        fused.meta.update(match.output.meta)
        match.output.replace_all_uses_with(fused)
        replaced[match.output] = fused
        for node in reversed(match.matched):
            if not node.users:
                graph.erase_node(node)
    for node in list(graph.nodes):  # attribute reads left without a use
        if node.op == "get_attr" and not node.users:
            graph.erase_node(node)


def fuse_activations(gm: fx.GraphModule) -> None:
    """A fused GroupNorm whose only use is a SiLU (nn.SiLU, F.silu) takes it as the kernel's
    epilogue, the GroupNorm -> SiLU pair of diffusion ResNet blocks: one pass writes the activated output.
    (The kernel rounds once; eager rounds the norm's output first, so a half-precision output may sit two
    steps from eager's.)"""
    helper = HELPERS["fused_group_norm"]
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not helper or len(node.users) != 1:
            continue
        if "activation" in node.kwargs or len(node.args) > 5:
            continue
        user = next(iter(node.users))
        if not _is_silu_of(gm, user, node):
            continue
        node.kwargs = {**node.kwargs, "activation": "silu"}
        user.replace_all_uses_with(node)
        gm.graph.erase_node(user)


def _is_silu_of(gm: fx.GraphModule, node: fx.Node, operand: fx.Node) -> bool:
    """node is silu(operand) (in place or not: operand has no other use), and nothing else."""
    if not node.args or node.args[0] is not operand or any(a is operand for a in node.args[1:]):
        return False
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)) is torch.nn.SiLU and len(node.args) == 1 and not node.kwargs
    if node.op == "call_function":
        return node.target is torch.nn.functional.silu and set(node.kwargs) <= {"inplace"} and len(node.args) <= 2
    return False


def generate_forward(graph: fx.Graph, signature: str = None) -> ForwardCode:
    """Source of `forward` for the rewritten graph. `signature`: the reference's own `def forward(...):`
    line, used when the body can be written by hand (its parameter names must be the graph's)."""
    direct = _direct_forward(graph, signature) if signature else None
    if direct is not None:
        return direct
    return _fx_forward(graph)


# ----------------------------------------------------------------------------------------------


def _is_helper_call(node) -> bool:
    return node.op == "call_function" and id(node.target) in _HELPER_NAMES


def _literal(value, exprs: dict):
    """Python source of an argument (nodes as their expressions), or None when it cannot be written."""
    if isinstance(value, fx.Node):
        return exprs.get(value)
    if value is None or isinstance(value, (bool, int, str)):
        return repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else None
    if isinstance(value, (tuple, list)):
        parts = [_literal(v, exprs) for v in value]
        if any(p is None for p in parts):
            return None
        if isinstance(value, tuple):
            return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
        return "[" + ", ".join(parts) + "]"
    return None


def _direct_forward(graph: fx.Graph, signature: str):
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if any(n.target.startswith("*") for n in placeholders):
        return None
    params = _signature_params(signature)
    if params != [n.target for n in placeholders]:
        return None
    exprs = {}
    helpers = []
    for node in graph.nodes:
        if node.op == "placeholder":
            exprs[node] = node.target
        elif node.op == "get_attr":
            exprs[node] = attribute_expression(node.target)
        elif _is_helper_call(node) and len(node.users) == 1:
            parts = []
            parts = [_literal(a, exprs) for a in node.args]
            for k, v in node.kwargs.items():
                text = _literal(v, exprs)
                parts.append(None if text is None else f"{k}={text}")
            if any(p is None for p in parts):
                return None
            name = _HELPER_NAMES[id(node.target)]
            helpers.append(name)
            exprs[node] = f"{name}({', '.join(parts)})"
        elif node.op == "output":
            body = _literal(node.args[0], exprs)
            if body is None:
                return None
            return ForwardCode(f"{signature}\n    return {body}\n", _ordered(helpers), {}, direct=True)
        else:
            return None
    return None


def attribute_expression(path: str) -> str:
    """`self.a.b`, with getattr(.., "0") for the parts that are not identifiers (nn.Sequential indices)."""
    expr = "self"
    for part in path.split("."):
        expr = f"{expr}.{part}" if part.isidentifier() and not keyword.iskeyword(part) else f"getattr({expr}, {part!r})"
    return expr


def _signature_params(signature: str) -> list:
    tree = ast.parse(signature.strip() + "\n    pass\n")
    args = tree.body[0].args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        return None
    return [a.arg for a in args.args][1:]


def _ordered(names) -> list:
    return [n for n in HELPERS if n in set(names)]


def _fx_forward(graph: fx.Graph) -> ForwardCode:
    for node in graph.nodes:  # a local variable named like a helper would shadow it
        if node.name in HELPERS or keyword.iskeyword(node.name):
            node._rename(node.name + "_value")
    code = graph.python_code(root_module="self")
    source = code.src
    used = {tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.NAME}
    renames, helpers, others = {}, [], {}
    for name, obj in code.globals.items():
        if name not in used:
            continue
        helper = _HELPER_NAMES.get(id(obj))
        if helper is not None and HELPERS[helper] is obj:
            renames[name] = helper
            helpers.append(helper)
        elif (name == "torch" and obj is torch) or getattr(builtins, name, None) is obj:
            continue
        else:
            others[name] = obj
    if renames:
        pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in renames) + r")\b")
        source = pattern.sub(lambda m: renames[m.group(0)], source)
    reads = {n.name: n.target for n in graph.nodes if n.op == "get_attr"}
    lines = [line.rstrip() for line in source.strip("\n").splitlines()]
    lines = _inline_attribute_reads(lines, reads)
    source = _PRIVATE_FUNCTIONAL.sub(_public_functional, "\n".join(lines))
    return ForwardCode(source.rstrip() + "\n", _ordered(helpers), others, direct=False)


_DELETIONS = re.compile(r";  ((?:\w+ = )+)None$")


def _inline_attribute_reads(lines: list, reads: dict) -> list:
    """Drop fx's `name = self.a.b` lines (one per get_attr node) and write `self.a.b` where `name` was
    used: shorter, and it reads like the reference. fx's `;  name = None` clean-ups lose those names."""
    inlined, definitions = {}, set()
    for i, line in enumerate(lines):
        match = re.fullmatch(r"    (\w+) = ([^;]+)", line)
        if match and match.group(1) in reads and match.group(1) not in inlined:
            inlined[match.group(1)] = match.group(2)
            definitions.add(i)
    out = []
    for i, line in enumerate(lines):
        if i in definitions:
            continue
        statement, deletions = line, None
        tail = _DELETIONS.search(line)
        if tail:
            statement = line[:tail.start()]
            kept = [n for n in tail.group(1).split(" = ") if n and n not in inlined]
            deletions = " = ".join(kept) + " = None" if kept else None
        out.append(_replace_names(statement, inlined) + (f";  {deletions}" if deletions else ""))
    return out


def _replace_names(line: str, replacements: dict) -> str:
    """Replace variable names (not attributes after a dot, not keyword-argument names) in one line."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, IndentationError):
        return line
    indent = len(line) - len(line.lstrip())
    edits = []
    for i, tok in enumerate(tokens):
        if tok.type != tokenize.NAME or tok.string not in replacements:
            continue
        before = tokens[i - 1].string if i else ""
        after = tokens[i + 1].string if i + 1 < len(tokens) else ""
        if before == "." or after == "=":
            continue
        edits.append((indent + tok.start[1], indent + tok.end[1], replacements[tok.string]))
    for start, end, text in reversed(edits):
        line = line[:start] + text + line[end:]
    return line


# fx spells some torch.nn.functional ops by their C binding (torch._C._nn.gelu); use the public name.
_PRIVATE_FUNCTIONAL = re.compile(r"\btorch\._C\._nn\.(\w+)\b")


def _public_functional(match) -> str:
    name = match.group(1)
    private = getattr(torch._C._nn, name, None)
    if private is not None and getattr(torch.nn.functional, name, None) is private:
        return f"torch.nn.functional.{name}"
    return match.group(0)
