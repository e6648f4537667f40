"""Cheat: returns fresh memory without writing it, hoping the allocator hands back a result computed earlier (the
reference's, or its own from a previous call)."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        return torch.empty_like(x)
