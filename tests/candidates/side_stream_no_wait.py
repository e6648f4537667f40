"""Cheat (CUDA) that only device timing lets through (a known gap, see test_harness_gpu.py): computes on a
private stream that does not wait for the caller's stream, then makes the caller's stream wait for it. The
output is complete when forward's end event fires, so the correctness checks and the device-wide tail see
nothing wrong. With host timing the device is idle when the call starts and the events measure all of it; with
device timing the private stream starts at once, while the caller's stream is still busy with the evaluator's L2
flush and ~1 ms cover spin, so up to ~1 ms of work is done before the start event fires."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)
        self.stream = None

    def forward(self, x):
        if self.stream is None:
            self.stream = torch.cuda.Stream(device=x.device)
        with torch.cuda.stream(self.stream):  # no self.stream.wait_stream(current): starts ahead of the cover
            out = self.ln(x)
        torch.cuda.current_stream(x.device).wait_stream(self.stream)
        return out
