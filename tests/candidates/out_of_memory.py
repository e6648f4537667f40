"""Asks for a petabyte in forward: the allocator raises (CPU and CUDA alike)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        scratch = torch.empty(1 << 50, dtype=torch.uint8, device=x.device)
        return scratch[: x.numel()].view_as(x)
