"""The judge and the candidate's process talk through a pair of pipes: one JSON object per line.

Only plain data crosses (never pickles: the judge must not run anything the other side sends). Tensors cross
as descriptors of shared memory (fastnorm.harness.shared_tensors); Python values (init arguments, scalar
inputs, scalar outputs) in the small tagged form of encode_value.
"""
from __future__ import annotations

import json
import os

import torch

MAX_LINE_BYTES = 1 << 24
_write = os.write
_read = os.read


class ProtocolError(Exception):
    """The other side sent something that is not the next message of the protocol."""


class Channel:
    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd
        self._pending = b""

    def send(self, kind: str, **fields) -> None:
        data = memoryview(json.dumps({"kind": kind, **fields}).encode() + b"\n")
        while data:
            data = data[_write(self.write_fd, data):]

    def recv(self) -> dict | None:
        """The next message, or None when the other side has closed its end (exited or died)."""
        while b"\n" not in self._pending:
            if len(self._pending) > MAX_LINE_BYTES:
                raise ProtocolError(f"a message longer than {MAX_LINE_BYTES} bytes")
            chunk = _read(self.read_fd, 1 << 16)
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        try:
            message = json.loads(line)
        except ValueError:
            raise ProtocolError(f"not a JSON message: {line[:80]!r}") from None
        if not isinstance(message, dict) or not isinstance(message.get("kind"), str):
            raise ProtocolError(f"not a protocol message: {line[:80]!r}")
        return message

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------------------
# Python values

DTYPES = {str(d).replace("torch.", ""): d for d in (
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128, torch.uint8,
    torch.int8, torch.int16, torch.int32, torch.int64, torch.bool)}


def dtype_name(dtype: torch.dtype) -> str:
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise ValueError(f"tensors of {dtype} cannot be passed between the evaluator's processes")
    return name


def encode_value(value, tensor=None):
    """A JSON-able form of `value` (nested tuples, lists, dicts of numbers, strings, dtypes, devices);
    tensor(t) gives the form of a tensor leaf (ValueError without it)."""
    if value is None or type(value) in (bool, int, float, str):
        return value
    if type(value) in (tuple, list):
        return {type(value).__name__: [encode_value(v, tensor) for v in value]}
    if type(value) is dict and all(type(k) is str for k in value):
        return {"dict": {k: encode_value(v, tensor) for k, v in value.items()}}
    if type(value) is torch.dtype:
        return {"dtype": dtype_name(value)}
    if type(value) is torch.device:
        return {"device": str(value)}
    if isinstance(value, torch.Tensor) and tensor is not None:
        return {"tensor": tensor(value)}
    raise ValueError(f"a {type(value).__name__} cannot be passed between the evaluator's processes")


def tensor_leaves(value) -> list:
    """The tensors in `value`, in the order encode_value meets them."""
    if isinstance(value, torch.Tensor):
        return [value]
    if type(value) in (tuple, list):
        return [t for v in value for t in tensor_leaves(v)]
    if type(value) is dict:
        return [t for v in value.values() for t in tensor_leaves(v)]
    return []


def decode_value(form, tensor=None):
    """The inverse of encode_value; tensor(x) turns a tensor leaf's form back into a tensor."""
    if form is None or type(form) in (bool, int, float, str):
        return form
    if type(form) is dict and len(form) == 1:
        (tag, inner), = form.items()
        if tag in ("tuple", "list") and type(inner) is list:
            items = [decode_value(v, tensor) for v in inner]
            return tuple(items) if tag == "tuple" else items
        if tag == "dict" and type(inner) is dict:
            return {k: decode_value(v, tensor) for k, v in inner.items()}
        if tag == "dtype" and inner in DTYPES:
            return DTYPES[inner]
        if tag == "device" and type(inner) is str:
            return torch.device(inner)
        if tag == "tensor" and tensor is not None:
            return tensor(inner)
    raise ProtocolError(f"not an encoded value: {str(form)[:80]}")
