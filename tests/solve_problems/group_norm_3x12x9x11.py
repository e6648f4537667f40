"""GroupNorm of 4 groups of channels with the spatial dims, affine.

Input: a (3, 12, 9, 11) fp32 tensor from torch.rand; a small copy of
problems/group_norm_112x64x512x512.py.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_channels: int, num_groups: int):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=num_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gn(x)


batch_size = 3
channels = 12
height = 9
width = 11
groups = 4


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, groups]
