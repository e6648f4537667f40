"""Which GPUs `fastnorm eval` may use, found without initializing CUDA in the evaluator's own process.

The parent never imports torch (a candidate's crash must not poison a context it holds), so it counts GPUs
from CUDA_VISIBLE_DEVICES when set, else from `nvidia-smi -L`, else in a short child process that asks torch.
Each id is what a worker's CUDA_VISIBLE_DEVICES is set to, so that it sees exactly that one GPU.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

_SMI_TIMEOUT_S = 30
_TORCH_TIMEOUT_S = 120


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES entries (indices, GPU-/MIG- UUIDs)."""
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        return parse_visible_devices(os.environ["CUDA_VISIBLE_DEVICES"])
    listed = _nvidia_smi_ids()
    if listed is not None:
        return listed
    return [str(i) for i in range(_torch_device_count())]


def parse_visible_devices(value: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES' entries as CUDA reads them: the list ends at the first empty or negative one."""
    ids = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        ids.append(entry)
    return ids


def parse_nvidia_smi_list(text: str) -> list[str]:
    """`nvidia-smi -L` -> ids: GPU indices, or the MIG instances' UUIDs where a GPU is split (CUDA then sees
    the instances, not the GPU)."""
    ids = []
    for line in text.splitlines():
        gpu = re.match(r"GPU (\d+):", line.strip())
        mig = re.search(r"\(UUID: (MIG-[^)\s]+)\)", line)
        if mig:
            if ids and ids[-1].isdigit():
                ids.pop()  # the GPU that holds this instance
            ids.append(mig.group(1))
        elif gpu:
            ids.append(gpu.group(1))
    return ids


def _nvidia_smi_ids() -> list[str] | None:
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=_SMI_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_nvidia_smi_list(done.stdout) if done.returncode == 0 else None


def _torch_device_count() -> int:
    """torch's count, in a child process so that this one never initializes CUDA."""
    try:
        done = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                              capture_output=True, text=True, timeout=_TORCH_TIMEOUT_S, stdin=subprocess.DEVNULL)
        return int(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else 0
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return 0
