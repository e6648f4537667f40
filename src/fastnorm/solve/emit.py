"""Write the single-file solution: the reference's Model class turned into ModelNew, plus inline kernels.

ModelNew is the reference's own class text with its name changed and its forward replaced by the
rewritten one, so the constructor signature, the submodules and parameters (state_dict keys) and every
non-norm op stay exactly the reference's. Module-level names the class uses (imports, helpers,
constants) are copied along; nothing else from the reference file is.
"""
import ast
import difflib
import hashlib
import inspect
import math
import re
import symtable
import sys
from typing import Optional

from fastnorm.kernels.selection import FUNCTIONS, KernelSelection
from fastnorm.solve import fused_helpers
from fastnorm.solve.problem import ReferenceProblem, UnsupportedProblem
from fastnorm.solve.rewrite import ForwardCode

# The functions of the kernels' binding a solution can call (issue 21's contract for the last three); a
# solution's load_inline builds those its helpers use (fused_helpers.extension_calls), or those of its
# KernelSelection.
EXTENSION_FUNCTIONS = list(FUNCTIONS)
# Compiler flags of the inline build. The sources #define what they need, so no -D flags here.
CFLAGS = {"cpu": ["-O3", "-fopenmp"], "cuda": ["-O3"]}
LDFLAGS = {"cpu": ["-fopenmp"], "cuda": []}
CUDA_CFLAGS = ["-O3", "--expt-relaxed-constexpr"]

_PROBLEM_ONLY = {"get_inputs", "get_init_inputs"}
# Module-level names of the solution file itself.
LOAD_OPTIONS = "_LOAD_OPTIONS"  # load_inline's keyword arguments that not every torch has
SHARED_SOURCE = "_SHARED_SOURCE"  # the text the C++ and CUDA sources share (their parameter structs), written once
RESERVED_NAMES = {"THREADS", "BLOCKS_PER_ROW", "_ext", "_CPP_SOURCE", "_CUDA_SOURCE", SHARED_SOURCE, LOAD_OPTIONS,
                  "load_inline", "inspect", "ModelNew"} | set(fused_helpers.HELPERS) | set(fused_helpers.SUPPORT)


def _stdlib_modules() -> set:
    names = set(getattr(sys, "stdlib_module_names", ()))
    return names | set(sys.builtin_module_names) | {"__future__"}


def _allowed_module(name: str) -> bool:
    top = name.split(".")[0]
    return top == "torch" or top in _stdlib_modules()


# ----------------------------------------------------------------------------------------------
# The reference's Model class, renamed and with a new forward


def _model_class(problem: ReferenceProblem) -> ast.ClassDef:
    for node in problem.tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Model":
            return node
    raise UnsupportedProblem("Model is not defined by a `class Model` statement in the reference file "
                             "(fastnorm solve copies that class's constructor into ModelNew)")


def _forward_def(cls: ast.ClassDef) -> ast.FunctionDef:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "forward":
            return node
    raise UnsupportedProblem("class Model defines no forward method of its own")


def forward_signature(problem: ReferenceProblem) -> str:
    """The reference's `def forward(...) -> ...:` line, normalized by ast."""
    fn = _forward_def(_model_class(problem))
    returns = f" -> {ast.unparse(fn.returns)}" if fn.returns else ""
    return f"def forward({ast.unparse(fn.args)}){returns}:"


def _first_line(node) -> int:
    return min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])


def model_new_class(problem: ReferenceProblem, forward: ForwardCode) -> str:
    """Text of `class ModelNew`: the reference's class, renamed, with `forward` replaced."""
    cls = _model_class(problem)
    fn = _forward_def(cls)
    lines = problem.source.splitlines()
    first = _first_line(cls)
    # Occurrences of the name `Model` inside the class (super(Model, self), ...), outside forward.
    renames = [(n.lineno, n.col_offset) for n in ast.walk(cls)
               if isinstance(n, ast.Name) and n.id == "Model" and not (_first_line(fn) <= n.lineno <= fn.end_lineno)]
    text = {i: lines[i - 1] for i in range(first, cls.end_lineno + 1)}
    for lineno, col in sorted(renames, reverse=True):
        raw = text[lineno].encode()  # ast columns count UTF-8 bytes
        text[lineno] = (raw[:col] + b"ModelNew" + raw[col + len("Model"):]).decode()
    text[cls.lineno] = re.sub(r"\bclass\s+Model\b", "class ModelNew", text[cls.lineno], count=1)
    indent = " " * fn.col_offset
    new_forward = [indent + line if line else "" for line in forward.source.rstrip("\n").splitlines()]
    out = []
    for lineno in range(first, cls.end_lineno + 1):
        if lineno == _first_line(fn):
            out.extend(new_forward)
        elif _first_line(fn) < lineno <= fn.end_lineno:
            continue
        else:
            out.append(text[lineno])
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------
# Module-level names the class needs


def _free_names(source: str) -> set:
    """Global names a piece of module-level code reads (over-approximated: unknown names are ignored)."""
    found = set()

    def walk(table):
        for sym in table.get_symbols():
            if not sym.is_referenced():
                continue
            if table.get_type() == "function" and sym.is_global():
                found.add(sym.get_name())
            elif table.get_type() != "function" and not sym.is_assigned() and not sym.is_imported():
                found.add(sym.get_name())
        for child in table.get_children():
            walk(child)

    walk(symtable.symtable(source, "<solution>", "exec"))
    return found


def _bound_names(stmt) -> set:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _is_main_guard(stmt) -> bool:
    return isinstance(stmt, ast.If) and "__name__" in ast.unparse(stmt.test)


def _segment(problem: ReferenceProblem, stmt) -> str:
    lines = problem.source.splitlines()
    return "\n".join(lines[_first_line(stmt) - 1: stmt.end_lineno])


def module_context(problem: ReferenceProblem, needed: set) -> tuple:
    """(future imports, imports, other statements) of the reference file that define the `needed` names,
    transitively, in file order. Refuses imports of anything but torch and the standard library."""
    statements = [s for s in problem.tree.body
                  if not (isinstance(s, ast.ClassDef) and s.name == "Model")
                  and not (isinstance(s, ast.FunctionDef) and s.name in _PROBLEM_ONLY)
                  and not _is_main_guard(s)]
    keep = set()
    pending = set(needed)
    while pending:
        name = pending.pop()
        for i, stmt in enumerate(statements):
            if i not in keep and name in _bound_names(stmt):
                keep.add(i)
                pending |= _free_names(_segment(problem, stmt)) if not isinstance(stmt, (ast.Import, ast.ImportFrom)) else set()
    future = [_segment(problem, s) for s in problem.tree.body
              if isinstance(s, ast.ImportFrom) and s.module == "__future__"]
    imports, kept = [], []
    for i in sorted(keep):
        stmt = statements[i]
        if isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__":
            continue
        modules = [a.name for a in stmt.names] if isinstance(stmt, ast.Import) else \
            [stmt.module or ""] if isinstance(stmt, ast.ImportFrom) else []
        for module in modules:
            if (isinstance(stmt, ast.ImportFrom) and stmt.level) or not _allowed_module(module):
                raise UnsupportedProblem(
                    f"the reference's Model needs `{ast.unparse(stmt)}`; a solution file may import only torch "
                    "and the Python standard library")
        (imports if modules else kept).append(_segment(problem, stmt))
    return future, imports, kept


def _import_for(name: str, obj) -> Optional[str]:
    """An import statement that binds `name` to `obj` (a global of fx-generated code), if one exists."""
    if isinstance(obj, type(sys)):
        if not _allowed_module(obj.__name__):
            return None
        return f"import {obj.__name__}" if obj.__name__ == name else f"import {obj.__name__} as {name}"
    if isinstance(obj, float) and (math.isinf(obj) or math.isnan(obj)):
        return f"{name} = float({str(obj)!r})"
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if obj is type(None):
        return f"{name} = type(None)"
    if module and qualname and "." not in qualname and _allowed_module(module):
        public = {"torch.device": "torch", "torch.dtype": "torch"}.get(f"{module}.{qualname}", module)
        return (f"from {public} import {qualname}" if qualname == name
                else f"from {public} import {qualname} as {name}")
    return None


def forward_globals(problem: ReferenceProblem, forward: ForwardCode) -> tuple:
    """(import lines, reference names) that define the non-torch globals of an fx-generated forward.
    Functions of the reference module keep their own names (the forward source is edited to match)."""
    imports, names = [], set()
    for name, obj in forward.globals.items():
        if getattr(obj, "__module__", None) == problem.module.__name__ and hasattr(obj, "__name__"):
            names.add(obj.__name__)
            if obj.__name__ != name:
                forward.source = re.sub(rf"\b{re.escape(name)}\b", obj.__name__, forward.source)
            continue
        line = _import_for(name, obj)
        if line is None:
            raise UnsupportedProblem(f"the rewritten forward needs {name!r} ({obj!r}), which a self-contained "
                                     "solution cannot import")
        imports.append(line)
    return imports, names


# ----------------------------------------------------------------------------------------------
# Kernel sources and their build


def _string_literal(text: str) -> str:
    """A readable literal: a raw triple-quoted string when the text allows one."""
    if '"""' not in text and not text.endswith(("\\", '"')) and "\r" not in text:
        return 'r"""' + text + '"""'
    return "(\n" + "".join(f"    {line!r}\n" for line in text.splitlines(keepends=True)) + ")"


def _shared_lines(cpp: str, cuda: str, least: int = 400) -> Optional[tuple]:
    """The longest run of whole lines both sources hold (the parameter structs and macros both include), where it is
    worth a string of its own: (shared, C++ source before and after it, CUDA source before and after it)."""
    a, b = cpp.splitlines(keepends=True), cuda.splitlines(keepends=True)
    m = difflib.SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b))
    shared = "".join(a[m.a:m.a + m.size])
    if len(shared) < least:
        return None
    return (shared, "".join(a[:m.a]), "".join(a[m.a + m.size:]), "".join(b[:m.b]), "".join(b[m.b + m.size:]))


def _source_expression(before: str, after: str) -> str:
    """A source written as `before + _SHARED_SOURCE + after`, its own parts as literals (left out where empty)."""
    parts = [_string_literal(before)] * bool(before) + [SHARED_SOURCE] + [_string_literal(after)] * bool(after)
    return " + ".join(parts)


def extension_name(device_type: str, cpp: str, cuda: Optional[str], functions=None) -> str:
    """Build name with a hash of everything that goes into the build: solutions with different kernels
    or bound functions never share a cached build, identical ones share it."""
    digest = hashlib.sha256()
    for part in (device_type, cpp, cuda or "", repr(CFLAGS[device_type]), repr(CUDA_CFLAGS),
                 repr(LDFLAGS[device_type]), repr(list(functions or EXTENSION_FUNCTIONS))):
        digest.update(part.encode())
        digest.update(b"\0")
    return f"fastnorm_solution_{device_type}_{digest.hexdigest()[:16]}"


def kernel_block(device_type: str, kernel_sources=None, functions=None,
                 selection: Optional[KernelSelection] = None) -> str:
    """Kernel source strings and the load_inline call that builds `_ext` from them, binding `functions`
    (default: all of EXTENSION_FUNCTIONS). With a `selection`: its sources and functions only."""
    from fastnorm.kernels import inline_sources

    if selection is not None:
        functions = selection.functions
        kernel_sources = kernel_sources or inline_sources(device_type, selection)
    functions = list(functions or EXTENSION_FUNCTIONS)
    if kernel_sources is None:
        kernel_sources = inline_sources(device_type)
    cpp, cuda = kernel_sources
    name = extension_name(device_type, cpp, cuda, functions)
    what = "only the code this solution calls" if selection is not None else "all #includes inlined"
    lines = [f"# ---- {device_type.upper()} kernels (fastnorm), {what} " + "-" * 30]
    if selection is not None:
        lines += [f"# What the calls traced on the problem's inputs need: {selection.describe()}.",
                  "# Another dtype, or a shape the planner gives another family, fails with \"not in this build\"."]
    split = _shared_lines(cpp, cuda) if cuda else None
    if split:
        shared, cpp_before, cpp_after, cuda_before, cuda_after = split
        lines += ["", f"{SHARED_SOURCE} = {_string_literal(shared)}", "",
                  f"_CPP_SOURCE = {_source_expression(cpp_before, cpp_after)}", "",
                  f"_CUDA_SOURCE = {_source_expression(cuda_before, cuda_after)}", ""]
    else:
        lines += ["", f"_CPP_SOURCE = {_string_literal(cpp)}", ""]
        if cuda:
            lines += [f"_CUDA_SOURCE = {_string_literal(cuda)}", ""]
    if selection is not None:
        lines += [
            "# The sources include the little of torch they use: load_inline's blanket torch/extension.h",
            "# (and torch/types.h before CUDA sources), most of a build's time, stay out where it allows.",
            f"{LOAD_OPTIONS} = {{'no_implicit_headers': True}} if 'no_implicit_headers' in "
            "inspect.signature(load_inline).parameters else {}",
            "",
        ]
    lines += [
        "# Built on first import and cached by torch under TORCH_EXTENSIONS_DIR. The name carries a hash",
        "# of the sources and flags, so different kernels never reuse each other's build.",
        "_ext = load_inline(",
        f"    name={name!r},",
        "    cpp_sources=[_CPP_SOURCE],",
        f"    cuda_sources={'[_CUDA_SOURCE]' if cuda else '[]'},",
        f"    functions={functions!r},",
        f"    extra_cflags={CFLAGS[device_type]!r},",
    ]
    if cuda:
        lines.append(f"    extra_cuda_cflags={CUDA_CFLAGS!r},")
    if LDFLAGS[device_type]:
        lines.append(f"    extra_ldflags={LDFLAGS[device_type]!r},")
    lines.append("    verbose=False,")
    if selection is not None:
        lines.append(f"    **{LOAD_OPTIONS},")
    lines += [")", ""]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------


def _config_text(value: int) -> str:
    return f"{value}" + ("  # 0: the kernel's own choice" if value == 0 else "")


def uses_launch_config(forward: ForwardCode) -> bool:
    """True when the solution's helpers take THREADS / BLOCKS_PER_ROW (the norm_forward kernels do; the
    BatchNorm, GroupNorm and p-norm kernels choose their launch themselves)."""
    return "norm_forward" in fused_helpers.extension_calls(forward.helpers, EXTENSION_FUNCTIONS)


def render_solution(problem: ReferenceProblem, forward: ForwardCode, matches: list, device_type: str, *,
                    threads: int = 0, blocks_per_row: int = 0, tuned_on: str = "",
                    kernel_sources=None, extension_code: Optional[str] = None,
                    selection: Optional[KernelSelection] = None) -> str:
    """The whole solution file. `extension_code` replaces the kernel block (tests use a stub); `selection`:
    the kernels it holds (default: every kernel of the functions its helpers call)."""
    reference_imports, reference_names = forward_globals(problem, forward)
    class_text = model_new_class(problem, forward)
    carried = fused_helpers.required(forward.helpers)
    needed = (_free_names(class_text) | reference_names) - set(carried)
    future, context_imports, context = module_context(problem, needed)
    clashes = set()
    for text in context_imports + context:
        for stmt in ast.parse(text).body:
            clashes |= _bound_names(stmt) & RESERVED_NAMES
    if clashes:
        raise UnsupportedProblem(f"the reference defines {', '.join(sorted(clashes))} at module level, which the "
                                 "solution file uses for its own kernel code")

    summary = "\n".join(f"  - {m.written_as} -> {m.helper}: {m.kind} over {m.dims_text}, traced on {m.x.describe()}"
                        for m in matches)
    tuned = f" (chosen by timing on {tuned_on})" if tuned_on else ""
    docstring = (
        f'"""ModelNew for {problem.path.name}, written by `fastnorm solve`.\n\n'
        "Same constructor, submodules and parameters as the reference's Model; its normalizations run on\n"
        "fused kernels compiled inline with torch.utils.cpp_extension.load_inline (needs only PyTorch):\n"
        f"{summary}\n"
        "Everything else in forward is the reference's own computation.\n"
        '"""')
    imports = []
    kernel_imports = (["import inspect"] if selection is not None and extension_code is None else []) + [
        "from torch.utils.cpp_extension import load_inline"]
    for line in ["import torch"] + context_imports + reference_imports + kernel_imports:
        if line.strip() not in imports:
            imports.append(line.strip())

    parts = ["\n\n".join([docstring] + future + ["\n".join(imports)])]
    if context:
        parts.append("\n\n".join(context))
    calls = fused_helpers.extension_calls(forward.helpers, EXTENSION_FUNCTIONS)
    if uses_launch_config(forward):
        parts.append(
            f"# Kernel launch configuration{tuned}; every norm_forward call below uses it.\n"
            f"THREADS = {_config_text(threads)}\n"
            f"BLOCKS_PER_ROW = {_config_text(blocks_per_row)}")
    functions = {**fused_helpers.SUPPORT, **fused_helpers.HELPERS}
    helper_sources = [inspect.getsource(functions[name]).rstrip() for name in carried]
    parts.append("\n\n\n".join(helper_sources))
    parts.append(class_text.rstrip())
    parts.append((extension_code if extension_code is not None
                  else kernel_block(device_type, kernel_sources, calls, selection)).rstrip())
    return "\n\n\n".join(p for p in parts if p) + "\n"
