"""Device code: CUDA and C++ kernel sources, compiled by torch.utils.cpp_extension on first use.

`sources(device_type)` lists the files the package builds; `inline_sources(device_type)` returns the
same code as self-contained strings for `load_inline`, which is how single-file solutions carry it.
"""
from pathlib import Path
import re

KERNELS_DIR = Path(__file__).resolve().parent

# Tensor-level entry points (C++, part of single-file solutions): the LayerNorm / RMSNorm ones and the family's.
_BINDINGS = ("binding.cpp", "family_binding.cpp")
_MODULE = "module.cpp"  # the Python module; load_inline writes its own, so single-file solutions leave it out
# Translation units per device type besides the binding: the CUDA forward is one unit per dtype pair
# (forward_*.cu) plus the entry points (forward.cu), so that ninja compiles them in parallel.
_UNITS = {"cpu": ("norm_cpu*.cpp",), "cuda": ("*.cu",)}
_HEADERS = {"cpu": ("*.h",), "cuda": ("*.h", "*.cuh")}
# The build macro the binding needs, per device type.
DEFINES = {"cpu": [], "cuda": ["FASTNORM_CUDA"]}


def sources(device_type: str) -> list:
    """Source files of the package's extension for `device_type` ("cpu" or "cuda")."""
    return [KERNELS_DIR / b for b in _BINDINGS] + [KERNELS_DIR / _MODULE] + _glob(_UNITS, device_type)


def headers(device_type: str) -> list:
    """Header files the sources of `device_type` may include (their text is part of a build's identity)."""
    return _glob(_HEADERS, device_type)


def _glob(table: dict, device_type: str) -> list:
    if device_type not in table:
        raise ValueError(f"fastnorm: no kernels for device type {device_type!r} (cpu or cuda)")
    return sorted({path for pattern in table[device_type] for path in KERNELS_DIR.glob(pattern)})


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


def inline_sources(device_type: str):
    """(cpp_source, cuda_source or None) for `load_inline(..., functions=["norm_forward"])`.

    The C++ source holds the binding (and, for "cpu", the kernels); the CUDA source the CUDA kernels.
    """
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
