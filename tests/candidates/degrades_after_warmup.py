"""Cheat: correct for its first calls (the correctness trials), then returns zeros while it is being timed."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.ln(x) if self.calls <= 2 else torch.zeros_like(x)
