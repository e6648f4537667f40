"""Device code: CUDA and C++ kernel sources, compiled by torch.utils.cpp_extension on first use.

`sources(device_type)` lists the files the package builds; `inline_sources(device_type)` returns the
same code as self-contained strings for `load_inline`, which is how single-file solutions carry it.
"""
from pathlib import Path
import re

KERNELS_DIR = Path(__file__).resolve().parent

_BINDING = "binding.cpp"
_KERNELS = {"cpu": "norm_cpu.cpp", "cuda": "norm_cuda.cu"}
# The build macro the binding needs, per device type.
DEFINES = {"cpu": [], "cuda": ["FASTNORM_CUDA"]}


def sources(device_type: str) -> list:
    """Source files of the package's extension for `device_type` ("cpu" or "cuda")."""
    if device_type not in _KERNELS:
        raise ValueError(f"fastnorm: no kernels for device type {device_type!r} (cpu or cuda)")
    return [KERNELS_DIR / _BINDING, KERNELS_DIR / _KERNELS[device_type]]


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.M)


def _inline_includes(text: str, seen: set) -> str:
    """Replace #include "local.h" lines by the file's text (once per file), recursively."""

    def substitute(match):
        name = match.group(1)
        if name in seen:
            return ""
        seen.add(name)
        return _inline_includes((KERNELS_DIR / name).read_text(), seen)

    return _LOCAL_INCLUDE.sub(substitute, text)


def inline_sources(device_type: str):
    """(cpp_source, cuda_source or None) for `load_inline(..., functions=["norm_forward"])`.

    The C++ source holds the binding (and, for "cpu", the kernels); the CUDA source the CUDA kernels.
    """
    binding, kernels = sources(device_type)
    defines = "".join(f"#define {d}\n" for d in DEFINES[device_type] + ["FASTNORM_INLINE"])
    cpp = defines + _inline_includes(binding.read_text(), set())
    if device_type == "cpu":
        # One translation unit: the header is already inlined above, keep it out of the second copy.
        return cpp + "\n" + _inline_includes(kernels.read_text(), {"norm_params.h"}), None
    return cpp, _inline_includes(kernels.read_text(), set())
