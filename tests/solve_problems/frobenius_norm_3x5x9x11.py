"""x divided by its Frobenius norm, taken over the whole tensor.

Input: a (3, 5, 9, 11) fp32 tensor from torch.rand; a small copy of
problems/frobenius_norm_112x64x512x512.py.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fro = torch.norm(x, p="fro")
        return x / fro


batch_size = 3
channels = 5
height = 9
width = 11


def get_inputs():
    return [torch.rand(batch_size, channels, height, width)]


def get_init_inputs():
    return []
