"""Memory the candidate's process allocates and the judge maps: the candidate's inputs and the copies of its
outputs. Always allocated by the candidate's side and mapped by the judge, never the other way, so nothing of
the judge's (expected outputs, saved inputs) is ever mapped into the candidate's address space.

CUDA: a caching-allocator block shared through a CUDA IPC handle (torch.multiprocessing's reductions, sent as
plain data and rebuilt by the judge from a whitelist, never unpickled). The memory is the candidate's own, so a
kernel reads its inputs exactly as it would in a process of its own. CPU: a file in a shared-memory folder,
mapped by both (MAP_SHARED), which the judge unlinks once mapped.
"""
from __future__ import annotations

import base64
import os
from pathlib import Path

import torch

from fastnorm.harness.channel import DTYPES, ProtocolError

if torch.cuda.is_available():  # torch.multiprocessing registers reducers when imported: do it before candidates
    from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor
else:
    rebuild_cuda_tensor = reduce_tensor = None

_CLASSES = {"Tensor": torch.Tensor, "TypedStorage": torch.storage.TypedStorage,
            "UntypedStorage": torch.UntypedStorage}


def view(raw: torch.Tensor, dtype: torch.dtype, size, stride, offset: int) -> torch.Tensor:
    """A tensor of `dtype` over the bytes of the flat uint8 tensor `raw` (bounds checked by torch)."""
    return torch.empty(0, dtype=dtype, device=raw.device).set_(raw.untyped_storage(), offset, tuple(size),
                                                               tuple(stride))


def contiguous_strides(shape) -> list:
    strides, step = [], 1
    for size in reversed(list(shape)):
        strides.append(step)
        step *= max(int(size), 1)
    return list(reversed(strides))


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole storage under `t` as a flat uint8 tensor."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(storage, 0, (storage.nbytes(),), (1,))


class Exporter:
    """The candidate's side: allocates shareable flat byte buffers and describes them for the judge."""

    def __init__(self, device: torch.device, folder: str):
        self.device, self.folder, self.count = device, Path(folder), 0

    def empty(self, nbytes: int) -> tuple[torch.Tensor, dict]:
        self.count += 1
        if nbytes == 0:
            return torch.empty(0, dtype=torch.uint8, device=self.device), {"nbytes": 0}
        if self.device.type == "cuda":
            raw = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            _, args = reduce_tensor(raw)
            return raw, {"nbytes": nbytes, "ipc": [_encode(a) for a in args]}
        name = f"buffer-{os.getpid()}-{self.count}"
        raw = torch.from_file(str(self.folder / name), shared=True, size=nbytes, dtype=torch.uint8)
        return raw, {"nbytes": nbytes, "file": name}


def open_exported(desc, device: torch.device, folder: str) -> torch.Tensor:
    """The judge's side: map a buffer the candidate's process described (validated, raises ProtocolError)."""
    if not isinstance(desc, dict) or type(desc.get("nbytes")) is not int or desc["nbytes"] < 0:
        raise ProtocolError(f"not a buffer description: {str(desc)[:80]}")
    nbytes = desc["nbytes"]
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device=device)
    if device.type == "cuda":
        if type(desc.get("ipc")) is not list:
            raise ProtocolError("a CUDA buffer without an IPC handle")
        raw = rebuild_cuda_tensor(*[_decode(a) for a in desc["ipc"]])
    else:
        name = desc.get("file")
        if type(name) is not str or not name.startswith("buffer-") or "/" in name or name in (".", ".."):
            raise ProtocolError(f"not a buffer file name: {str(name)[:80]}")
        path = Path(folder) / name
        if not path.is_file() or path.stat().st_size < nbytes:
            raise ProtocolError(f"buffer file {name} is missing or shorter than {nbytes} bytes")
        raw = torch.from_file(str(path), shared=True, size=nbytes, dtype=torch.uint8)
        path.unlink()  # the mappings stay; nothing is left behind if either process dies
    if type(raw) is not torch.Tensor or raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != nbytes \
            or raw.device.type != device.type:
        raise ProtocolError("a shared buffer that is not what its description says")
    return raw


def _encode(arg):
    if arg is None or type(arg) in (bool, int):
        return arg
    if type(arg) is bytes:
        return {"bytes": base64.b64encode(arg).decode()}
    if type(arg) is torch.dtype:
        return {"dtype": str(arg).replace("torch.", "")}
    if isinstance(arg, (tuple, list)) and all(type(v) is int for v in arg):
        return {"ints": list(arg)}
    for name, cls in _CLASSES.items():
        if arg is cls:
            return {"class": name}
    raise TypeError(f"cannot describe a {type(arg).__name__} of a CUDA IPC handle")


def _decode(form):
    if form is None or type(form) in (bool, int):
        return form
    if type(form) is dict and len(form) == 1:
        (tag, value), = form.items()
        if tag == "bytes" and type(value) is str:
            return base64.b64decode(value)
        if tag == "dtype" and value in DTYPES:
            return DTYPES[value]
        if tag == "ints" and type(value) is list and all(type(v) is int for v in value):
            return tuple(value)
        if tag == "class" and value in _CLASSES:
            return _CLASSES[value]
    raise ProtocolError(f"not part of a CUDA IPC description: {str(form)[:80]}")
