"""x divided by its Frobenius norm, taken over the whole tensor.

Input: a (112, 64, 512, 512) fp32 tensor from torch.rand.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fro = torch.norm(x, p="fro")
        return x / fro


batch_size = 112
channels = 64
height = 512
width = 512


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return []
