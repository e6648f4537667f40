"""InstanceNorm2d over the spatial dims of each sample's channel, no affine parameters.

Input: a (3, 6, 9, 11) fp32 tensor from torch.rand; a small copy of
problems/instance_norm_112x64x512x512.py.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.norm = nn.InstanceNorm2d(num_features=num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


batch_size = 3
channels = 6
height = 9
width = 11


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
