"""Notice a candidate rebinding anything that was loaded before it: a snapshot of the identities of the
callables in every module of sys.modules (torch and its submodules, time, gc, builtins, fastnorm's harness),
of the methods of the classes those modules define, and of the process's trace and profile hooks.

Runs in the candidate's process (fastnorm.harness.candidate_process), which takes the snapshot right before
importing the candidate and compares after the import, after construction, after every checked forward and
after timing. The candidate cannot change what is judged (that happens in another process), but it could
rebind what the timing loop or the output hand-off call; a change is reported as cheating, by name.
"""
from __future__ import annotations

import ctypes
import os
import sys
import threading
import types
import warnings

import torch

_FUNCTION = types.FunctionType
_HARNESS_PREFIXES = ("fastnorm.harness", "__main__")

# torch rebinds some of its own functions when parts of it load lazily (importing torch._dynamo, as any
# torch.compile does, wraps torch.manual_seed, torch.nn.Module.__init__, torch.jit.trace, optimizer methods):
# a torch function replaced by another function written in torch's own package is torch's doing. Nothing
# else is exempt, and nothing in fastnorm's harness.
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
ALLOWED = {("sys", "excepthook"), ("sys", "unraisablehook"), ("sys", "displayhook"), ("sys", "breakpointhook")}


def _c_function_offset(kind) -> int | None:
    """Where CPython keeps the method-table pointer in a builtin function / method descriptor, verified on
    `len` and `str.join` (None on other layouts: then only identities are compared)."""
    if sys.implementation.name != "cpython":
        return None
    pointer = ctypes.sizeof(ctypes.c_void_p)
    offset, probe, name = {types.BuiltinFunctionType: (object.__basicsize__, len, b"len"),
                           types.MethodDescriptorType: (object.__basicsize__ + 3 * pointer, str.join, b"join")}[kind]
    try:
        table = ctypes.c_void_p.from_address(id(probe) + offset).value
        return offset if table and ctypes.c_char_p.from_address(table).value == name else None
    except (ValueError, OSError):
        return None


_C_OFFSETS = {kind: _c_function_offset(kind) for kind in (types.BuiltinFunctionType, types.MethodDescriptorType)}


def _c_function(value) -> tuple:
    """The method-table entry and C function behind a builtin, which ctypes can rewrite without changing the
    object's identity."""
    offset = _C_OFFSETS.get(type(value))
    if offset is None:
        return ()
    table = ctypes.c_void_p.from_address(id(value) + offset).value
    return (table, ctypes.c_void_p.from_address(table + ctypes.sizeof(ctypes.c_void_p)).value if table else None)


def _fingerprint(value, deep: bool):
    """What must stay the same: the object; for a Python function also its code and defaults (and, in the
    harness's own modules, what its closure holds); for a builtin the C function behind it - all of which
    can be swapped without changing the object."""
    if type(value) in _C_OFFSETS:
        return (id(value),) + _c_function(value)
    if type(value) is _FUNCTION:
        fp = (id(value), id(value.__code__), id(value.__defaults__), id(value.__kwdefaults__))
        if deep and value.__closure__:
            fp += tuple(id(_cell_contents(c)) for c in value.__closure__)
        return fp
    if type(value) in (staticmethod, classmethod):
        return (id(value), _fingerprint(value.__func__, deep))
    if type(value) is property:
        return (id(value),) + tuple(_fingerprint(f, deep) for f in (value.fget, value.fset, value.fdel))
    return id(value)


def _cell_contents(cell):
    try:
        return cell.cell_contents
    except ValueError:  # an empty cell
        return None


def _watched(value) -> bool:
    return callable(value) or type(value) in (staticmethod, classmethod, property)


def _module_items(module) -> dict:
    try:
        return dict(vars(module))
    except TypeError:
        return {}


def _hooks() -> dict:
    """Trace and profile functions, which see (and can rewrite) the local variables of every frame."""
    return {"sys.settrace": sys.gettrace(), "sys.setprofile": sys.getprofile(),
            "threading.settrace": getattr(threading, "_trace_hook", None),
            "threading.setprofile": getattr(threading, "_profile_hook", None)}


class ModuleSnapshot:
    """Identities of what every loaded module binds, taken once; changes() lists what differs now."""

    def __init__(self):
        self.modules = {}   # name -> module object
        self.entries = {}   # (module, name) or (module, class, name) -> fingerprint
        self.hooks = {k: id(v) for k, v in _hooks().items()}
        seen_classes = set()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # some torch modules warn when their attributes are enumerated
            for name, module in list(sys.modules.items()):
                if not isinstance(module, types.ModuleType):
                    continue
                self.modules[name] = module
                deep = name.startswith(_HARNESS_PREFIXES)
                for attr, value in _module_items(module).items():
                    if (name, attr) in ALLOWED:
                        continue
                    if issubclass(type(value), type):
                        self.entries[(name, attr)] = id(value)
                        if id(value) not in seen_classes:
                            seen_classes.add(id(value))
                            for member, item in _module_items(value).items():
                                if _watched(item):
                                    self.entries[(name, attr, member)] = _fingerprint(item, deep)
                    elif deep or _watched(value):
                        # every global of the harness (its constants too); callables elsewhere
                        self.entries[(name, attr)] = _fingerprint(value, deep)

    def changes(self, limit: int = 3) -> list[str]:
        """Human-readable descriptions of what was rebound, replaced or removed since the snapshot."""
        found = []
        for label, now in _hooks().items():
            if id(now) != self.hooks.get(label):
                found.append(f"installed a hook through {label} ({_describe(now)})")
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                found.append(f"replaced sys.modules[{name!r}] (now {_describe(sys.modules.get(name))})")
        if found:
            return found[:limit]
        namespaces = {}  # (module,) or (module, class) -> its current attributes
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for key, before in self.entries.items():
                owner_key = key[:-1]
                if owner_key not in namespaces:
                    if len(owner_key) == 1:
                        namespaces[owner_key] = _module_items(self.modules[key[0]])
                    else:
                        module_items = namespaces.get(key[:1]) or _module_items(self.modules[key[0]])
                        cls = module_items.get(key[1])
                        namespaces[owner_key] = _module_items(cls) if issubclass(type(cls), type) else {}
                owner = namespaces[owner_key]
                what = ".".join(key)
                if key[-1] not in owner:
                    found.append(f"removed {what}")
                else:
                    now = owner[key[-1]]
                    if _fingerprint(now, key[0].startswith(_HARNESS_PREFIXES)) != before \
                            and not _torch_rebinding_itself(key[0], before, now):
                        found.append(_change(what, before, now))
                if len(found) >= limit:
                    break
        return found


def _torch_rebinding_itself(module: str, before, now) -> bool:
    """A Python function of torch's replaced by another one from torch's own files (C functions never)."""
    if not (module == "torch" or module.startswith("torch.")) or not isinstance(before, tuple):
        return False
    if type(now) is property:
        now = now.fget
    code = getattr(now, "__code__", None)
    return code is not None and os.path.abspath(code.co_filename).startswith(_TORCH_DIR)


def _change(what: str, before, now) -> str:
    same_object = id(now) == (before[0] if isinstance(before, tuple) else before)
    if same_object and type(now) in _C_OFFSETS:
        return f"changed the C function behind {what} in place"
    if same_object:
        return f"changed the code, defaults or closure of {what} in place"
    return f"replaced {what} (now {_describe(now)})"


def _describe(value) -> str:
    if type(value) is _FUNCTION:
        code = value.__code__
        return f"function {value.__qualname__} from {code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"
    if value is None:
        return "None"
    return f"a {type(value).__name__}"
