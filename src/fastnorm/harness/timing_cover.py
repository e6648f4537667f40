"""The device-timing cover: kernels/timing_cover.cuh, built on first use by nvcc into a plain shared library (a
few seconds; as a torch extension it took 40-65 s on the H100), cached in fastnorm's build folder, shared by
every judge, and called through ctypes: a callable that queues the L2 flush and a ~1 ms spin holding every
thread slot of every SM (see the .cuh). None where it cannot be built (no CUDA compiler): timing.py then covers
with torch.cuda._sleep, a one-thread spin beside which a kernel of another stream can run unseen."""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import torch

from fastnorm.harness.isolation import fastnorm_builds_dir

SOURCE = Path(__file__).resolve().parent.parent / "kernels" / "timing_cover.cuh"
COVER_CYCLES = 2_000_000  # about 1 ms at the H100's clocks: longer than any candidate's host issuing


def _nvcc() -> str:
    from torch.utils.cpp_extension import CUDA_HOME

    path = Path(CUDA_HOME) / "bin" / "nvcc" if CUDA_HOME else None
    found = str(path) if path and path.exists() else shutil.which("nvcc")
    if found is None:
        raise RuntimeError("no nvcc (CUDA_HOME or PATH)")
    return found


def _arch_flags() -> list:
    """torch's -gencode flags for this machine (TORCH_CUDA_ARCH_LIST, else the visible GPUs)."""
    from torch.utils.cpp_extension import _get_cuda_arch_flags

    return list(_get_cuda_arch_flags())


def _name(text: str, flags: list) -> str:
    digest = hashlib.sha256((text + " ".join(flags)).encode())
    return f"fastnorm_timing_cover_{digest.hexdigest()[:12]}"


@functools.lru_cache(maxsize=None)
def _module():
    text, flags = SOURCE.read_text(), ["-O2"] + _arch_flags()
    name = _name(text, flags)
    build_dir = fastnorm_builds_dir(dict(os.environ)) / name
    library = build_dir / f"{name}.so"
    if not library.exists():
        print(f"fastnorm: building the device-timing cover in {build_dir} (first use only, a few seconds)...",
              file=sys.stderr, flush=True)
        build_dir.mkdir(parents=True, exist_ok=True)
        source = build_dir / f"{name}.cu"
        source.write_text(text)
        # Renamed when complete: a judge building at the same time never loads half a file.
        partial = build_dir / f"{name}.{os.getpid()}.so"
        result = subprocess.run([_nvcc(), *flags, "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-o", str(partial),
                                 str(source)], capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"nvcc failed: {(result.stderr or result.stdout).strip()[-300:]}")
        os.replace(partial, library)
    lib = ctypes.CDLL(str(library))
    lib.fastnorm_timing_cover.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p,
                                          ctypes.c_longlong, ctypes.c_longlong, ctypes.c_void_p]
    lib.fastnorm_timing_cover.restype = ctypes.c_int
    lib.fastnorm_timing_cover_error.argtypes = [ctypes.c_int]
    lib.fastnorm_timing_cover_error.restype = ctypes.c_char_p
    return lib


@functools.lru_cache(maxsize=None)
def _loaded():
    """The built module, or None (said once) where it cannot be built or FASTNORM_TIMING_COVER=sleep."""
    if os.environ.get("FASTNORM_TIMING_COVER") == "sleep":
        return None
    try:
        return _module()
    except Exception as error:  # no nvcc, a failed build: the weaker cover
        print(f"fastnorm: the full timing cover could not be built ({type(error).__name__}: "
              f"{str(error).strip()[:200]}); device timing covers with torch.cuda._sleep", file=sys.stderr)
        return None


def available() -> bool:
    """Whether device timing here gets the full cover (builds it if needed; touches no GPU)."""
    return torch.cuda.is_available() and _loaded() is not None


@functools.lru_cache(maxsize=None)
def full_cover(device: torch.device, flush: torch.Tensor) -> Callable[[], None] | None:
    """A callable queuing the cover on `device`'s current stream (overwriting `flush`), or None."""
    module = _loaded() if device.type == "cuda" else None
    if module is None:
        return None
    if not (flush.is_cuda and flush.is_contiguous() and flush.nbytes % 16 == 0):
        raise ValueError("timing cover: the flush buffer must be a contiguous CUDA tensor of whole 16-byte vectors")
    index = device.index if device.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    blocks = props.multi_processor_count * max(1, props.max_threads_per_multi_processor // 1024)
    arrivals = torch.zeros(1, dtype=torch.long, device=device)

    def launch():
        stream = torch.cuda.current_stream(device).cuda_stream
        code = module.fastnorm_timing_cover(index, flush.data_ptr(), flush.nbytes // 16, arrivals.data_ptr(), blocks,
                                            COVER_CYCLES, stream)
        if code != 0:
            raise RuntimeError(f"timing cover launch failed: {module.fastnorm_timing_cover_error(code).decode()}")

    return launch
