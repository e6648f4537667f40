"""Cheat that rebinds nothing: from inside each timed call it walks up the stack to the evaluator's timing loop
and edits the loop's own data - on CPU it divides the previous call's recorded time by three, on CUDA it puts an
event recorded after its work in place of the call's start event. Identity checks cannot see it; the judge's own
clock, in another process, must: cheating."""
import sys

import torch
import torch.nn as nn


def _timing_loop():
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name not in ("_time_host", "_time_cuda"):
        frame = frame.f_back
    return frame


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        out = self.ln(x)
        loop = _timing_loop()
        if loop is not None and "trial" in loop.f_locals:
            trial, loop_data = loop.f_locals["trial"], loop.f_locals
            if x.is_cuda:
                late_start = torch.cuda.Event(enable_timing=True)
                late_start.record()
                loop_data["starts"][trial] = late_start
            elif trial > 0:
                loop_data["samples_ms"][trial - 1] /= 3
        return out
