"""GroupNorm of 8 groups of channels with the spatial dims, affine.

Input: a (112, 64, 512, 512) fp32 tensor from torch.rand.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_channels: int, num_groups: int):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=num_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(x)


batch_size = 112
channels = 64
height = 512
width = 512
groups = 8


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, groups]
