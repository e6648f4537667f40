"""Cheat through ctypes: points the time.perf_counter object at a new method-table entry whose C function
(a ctypes callback) runs three times slow. The object - and every reference the evaluator bound to it before
the import - keeps its identity. Must be cheating: the evaluator also fingerprints the C function behind each
builtin (and on CPU its own clock, in the judge's process, disagrees)."""
import ctypes
import time

import torch.nn as nn


class _MethodDef(ctypes.Structure):
    _fields_ = [("ml_name", ctypes.c_char_p), ("ml_meth", ctypes.c_void_p), ("ml_flags", ctypes.c_int),
                ("ml_doc", ctypes.c_char_p)]


_real = time.monotonic
_anchor = _real()
_callback = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object, ctypes.c_void_p)(
    lambda module, _: _anchor + (_real() - _anchor) / 3)
_definition = _MethodDef(b"perf_counter", ctypes.cast(_callback, ctypes.c_void_p), 0x0004, None)  # METH_NOARGS
ctypes.c_void_p.from_address(id(time.perf_counter) + 2 * ctypes.sizeof(ctypes.c_void_p)).value = \
    ctypes.addressof(_definition)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return self.ln(x)
