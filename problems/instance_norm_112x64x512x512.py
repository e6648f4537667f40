"""InstanceNorm2d over the spatial dims of each sample's channel, no affine parameters.

Input: a (112, 64, 512, 512) fp32 tensor from torch.rand.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.norm = nn.InstanceNorm2d(num_features=num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


batch_size = 112
channels = 64
height = 512
width = 512


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
