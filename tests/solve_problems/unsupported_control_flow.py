"""A forward torch.fx cannot trace: Python control flow on a tensor's value."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.ln = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return self.ln(x)
        return x


def get_inputs():
    return [torch.randn(4, 16)]


def get_init_inputs():
    return [16]
