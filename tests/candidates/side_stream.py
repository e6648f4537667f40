"""Cheat (CUDA): computes on a private stream and returns without making the caller's stream wait for it.

CUDA events on the caller's stream see almost nothing; a reader of the output sees it half written.
"""
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
        out = torch.empty_like(x)
        self.stream.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(20_000_000)  # ~10 ms of device time the caller's events never see
            out.copy_(self.ln(x))
        return out
