"""Device code: CUDA and C++ kernel sources, compiled by torch.utils.cpp_extension on first use.

`sources(device_type)` lists the files the package builds; `inline_sources(device_type)` (kernels/inline.py)
returns the same code as self-contained strings for `load_inline`, which is how single-file solutions carry it.
"""
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent

# Tensor-level entry points (C++, part of single-file solutions): the LayerNorm / RMSNorm ones and the family's.
_BINDINGS = ("binding.cpp", "family_binding.cpp")
_MODULE = "module.cpp"  # the Python module; load_inline writes its own, so single-file solutions leave it out
# Translation units per device type besides the binding: the CUDA forward is one unit per dtype pair
# (forward_*.cu) plus the entry points (forward.cu), so that ninja compiles them in parallel.
# loss_binding.cpp: the CUDA cross-entropy's entry points, which no single-file solution holds.
_UNITS = {"cpu": ("norm_cpu*.cpp",), "cuda": ("*.cu", "loss_binding.cpp")}
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


def __getattr__(name: str):
    # inline_sources (the tests' and the solver's entry) is imported on first use: its modules
    # (inline, reachable, ...) cost 11 ms of `import fastnorm`, which only the solver needs.
    if name == "inline_sources":
        from fastnorm.kernels.inline import inline_sources

        return inline_sources
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
