"""BatchNorm2d over the batch and spatial dims of each channel, affine, in training mode as built
(batch statistics; the running statistics are updated).

Input: a (64, 64, 512, 512) fp32 tensor from torch.rand.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features=num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(x)


batch_size = 64
channels = 64
height = 512
width = 512


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
