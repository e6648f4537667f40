"""A normalization fastnorm does not implement: BatchNorm2d."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


def get_inputs():
    return [torch.randn(2, 8, 5, 5)]


def get_init_inputs():
    return [8]
