"""Kernel sources as self-contained strings for `load_inline`, which is how single-file solutions carry them.

`inline_sources(device_type)` is the package's whole extension (every binding, translation unit and
header). With a KernelSelection it is only what that selection needs: the units of its entry points
and dtypes (never the backward's), the FASTNORM_WANT_* guards of kernel_set.h resolved in the text,
the declarations nothing reaches dropped, and comments, blank lines, repeated includes and alignment
spaces stripped.
"""
import re

from fastnorm.kernels import _BINDINGS, DEFINES, KERNELS_DIR, sources
from fastnorm.kernels.conditionals import resolve
from fastnorm.kernels.reachable import keep_reachable
from fastnorm.kernels.selection import KernelSelection
from fastnorm.kernels.source_text import drop_repeated_includes, squeeze_spaces, strip_comments

_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)".*$', re.M)  # a trailing comment may follow
_PRAGMA_ONCE = re.compile(r'^\s*#\s*pragma\s+once\s*$', re.M)  # meaningless (and warned about) once inlined


def _inline_includes(text: str, seen: set) -> str:
    """Replace #include "local.h" lines by the file's text (once per file), recursively."""

    def substitute(match):
        name = match.group(1)
        if name in seen:
            return ""
        seen.add(name)
        return _inline_includes(_PRAGMA_ONCE.sub("", (KERNELS_DIR / name).read_text()), seen)

    return _LOCAL_INCLUDE.sub(substitute, text)


def inline_sources(device_type: str, selection: KernelSelection = None):
    """(cpp_source, cuda_source or None) for `load_inline`. The C++ source holds the bindings (and, for
    "cpu", the kernels); the CUDA source the CUDA kernels. Without a selection: everything, for
    `functions=` any of the package's entry points."""
    if selection is not None:
        return _selected_sources(selection)
    files = sources(device_type)
    bindings, units = files[:len(_BINDINGS)], files[len(_BINDINGS) + 1:]
    defines = "".join(f"#define {d}\n" for d in DEFINES[device_type] + ["FASTNORM_INLINE"])
    seen = set()
    cpp = defines + "\n".join(_inline_includes(b.read_text(), seen) for b in bindings)
    # The units become one translation unit (the CPU's together with the binding; CUDA's its own), each
    # local header inlined once, where it is first included.
    unit_seen = seen if device_type == "cpu" else set()
    kernels = "\n".join(_inline_includes(unit.read_text(), unit_seen) for unit in units)
    if device_type == "cpu":
        return cpp + "\n" + kernels, None
    return cpp, kernels


def selected_units(selection: KernelSelection) -> tuple:
    """(binding files, kernel unit files) a selection compiles."""
    units = []
    if selection.device_type == "cpu":
        units += ["norm_cpu.cpp"] if selection.needs_norm_forward else []
        units += ["norm_cpu_family.cpp"] if selection.needs_family else []
    else:
        if selection.needs_norm_forward:  # the entry points, then a unit per (input, weight) dtype pair
            units.append("forward.cu")
            for code in sorted(selection.dtypes):
                units += [name for name in (f"forward_{code}.cu", f"forward_{code}_wf32.cu")
                          if (KERNELS_DIR / name).exists()]
        units += ["family.cu"] if selection.needs_family else []
    return _BINDINGS, tuple(units)


# What the Python module load_inline appends to the C++ source needs of torch (pybind11 with torch's
# type casters, torch::wrap_pybind_function): all of torch a selected source needs besides the
# per-operator ATen headers of the bindings, so it builds without torch/extension.h.
_MODULE_HEADERS = "#include <torch/csrc/Exceptions.h>\n#include <torch/csrc/utils/pybind.h>\n"


def _selected_sources(selection: KernelSelection):
    bindings, units = selected_units(selection)
    seen = set()
    cpp = _MODULE_HEADERS + "\n".join(_inline_includes((KERNELS_DIR / b).read_text(), seen) for b in bindings)
    unit_seen = seen if selection.device_type == "cpu" else set()
    kernels = "\n".join(_inline_includes((KERNELS_DIR / u).read_text(), unit_seen) for u in units)
    texts = [cpp + "\n" + kernels] if selection.device_type == "cpu" else [cpp, kernels]
    known = selection.symbols()
    texts = keep_reachable([resolve(strip_comments(t), known) for t in texts], selection.functions)
    texts = [squeeze_spaces(drop_repeated_includes(t)) for t in texts]
    note = f"// fastnorm {selection.device_type} kernels, only what this solution calls: {selection.describe()}\n"
    texts = [note + t for t in texts]
    return (texts[0], None) if selection.device_type == "cpu" else (texts[0], texts[1])
