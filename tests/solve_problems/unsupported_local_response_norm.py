"""A normalization fastnorm does not implement: LocalResponseNorm (a sum over neighbouring channels)."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.lrn = nn.LocalResponseNorm(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lrn(x)


def get_inputs():
    return [torch.randn(2, 8, 5, 5)]


def get_init_inputs():
    return [3]
