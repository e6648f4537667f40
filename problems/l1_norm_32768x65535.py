"""Each row divided by the mean of its absolute values (KernelBench's L1 normalization).

Input: a (32768, 65535) fp32 tensor from torch.rand.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.mean(torch.abs(x), dim=1, keepdim=True)


rows = 32768
cols = 65535


def get_inputs():
    return [torch.rand(rows, cols)]


def get_init_inputs():
    return []
