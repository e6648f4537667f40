"""The device-timing cover: kernels/timing_cover.cuh, built on first use (40-65 s on the H100, then cached in
fastnorm's build folder, shared by every judge), as a callable that queues the L2 flush and a ~1 ms spin
holding every thread slot of every SM (see the .cuh). None where it cannot be built (no CUDA compiler):
timing.py then covers with torch.cuda._sleep, a one-thread spin beside which a kernel of another stream
can run unseen."""
from __future__ import annotations

import functools
import hashlib
import os
import sys
from pathlib import Path
from typing import Callable

import torch

from fastnorm.harness.isolation import fastnorm_builds_dir

SOURCE = Path(__file__).resolve().parent.parent / "kernels" / "timing_cover.cuh"
COVER_CYCLES = 2_000_000  # about 1 ms at the H100's clocks: longer than any candidate's host issuing
_DECLARATION = "void timing_cover(torch::Tensor flush, torch::Tensor arrivals, int64_t blocks, int64_t cycles);"


def _name(text: str) -> str:
    digest = hashlib.sha256((text + torch.__version__ + repr(os.environ.get("TORCH_CUDA_ARCH_LIST"))).encode())
    return f"fastnorm_timing_cover_{digest.hexdigest()[:12]}"


@functools.lru_cache(maxsize=None)
def _module():
    text = SOURCE.read_text()
    name = _name(text)
    build_dir = fastnorm_builds_dir(dict(os.environ)) / name
    build_dir.mkdir(parents=True, exist_ok=True)
    from torch.utils.cpp_extension import load_inline

    if not any(build_dir.glob(f"{name}*.so")):
        print(f"fastnorm: building the device-timing cover in {build_dir} (first use only, under a minute)...",
              file=sys.stderr, flush=True)
    return load_inline(name, cpp_sources=[_DECLARATION], cuda_sources=[text], functions=["timing_cover"],
                       build_directory=str(build_dir), extra_cuda_cflags=["-O2"], verbose=False)


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
    props = torch.cuda.get_device_properties(device)
    blocks = props.multi_processor_count * max(1, props.max_threads_per_multi_processor // 1024)
    launch, arrivals = module.timing_cover, torch.zeros(1, dtype=torch.long, device=device)
    return lambda: launch(flush, arrivals, blocks, COVER_CYCLES)
