"""Each row divided by the mean of its absolute values (KernelBench's L1 normalization).

Input: a (13, 257) fp32 tensor from torch.rand; a small copy of
problems/l1_norm_32768x65535.py.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.mean(torch.abs(x), dim=1, keepdim=True)


rows = 13
cols = 257


def get_inputs():
    return [torch.rand(rows, cols)]


def get_init_inputs():
    return []
