"""Cheat that goes after the evaluator's own defences in its process: at import it finds the object that holds
the module snapshot (gc) and removes it, so that rebinding is no longer noticed there, then swaps the clock the
timing loop bound at import (fastnorm.harness.timing's globals) for one that runs three times slow. Must be
cheating: the judge's clock, in another process, disagrees."""
import gc
import sys

import torch.nn as nn

for holder in gc.get_objects():
    if hasattr(type(holder), "check_tampering") and hasattr(holder, "snapshot"):
        holder.snapshot = None

_timing = sys.modules["fastnorm.harness.timing"]
_clock, _elapsed = _timing._perf_counter, _timing._event_elapsed_ms
_anchor = _clock()
_timing._perf_counter = lambda: _anchor + (_clock() - _anchor) / 3
_timing._event_elapsed_ms = lambda start, end: _elapsed(start, end) / 3


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return self.ln(x)
