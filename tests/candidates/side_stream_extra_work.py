"""Cheat (CUDA): the output is right on the caller's stream, but device work is left running on a private
stream after forward returns, so events undercount the device time each call costs."""
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
        out = self.ln(x)
        self.stream.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(5_000_000)  # ~3 ms of hidden device time
        return out
