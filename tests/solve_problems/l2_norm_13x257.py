"""Each row divided by its Euclidean norm.

Input: a (13, 257) fp32 tensor from torch.rand; a small copy of
problems/l2_norm_32768x65535.py.
"""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / torch.norm(x, p=2, dim=1, keepdim=True)


rows = 13
cols = 257


def get_inputs():
    return [torch.rand(rows, cols)]


def get_init_inputs():
    return []
