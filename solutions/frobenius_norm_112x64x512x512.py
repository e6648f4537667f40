"""ModelNew for problems/frobenius_norm_112x64x512x512.py: x / torch.norm(x, p="fro"), the 2-norm of the
whole tensor, on the fastnorm family kernels (a statistics pass over every element, then the scale)."""
import torch
import torch.nn as nn

import fastnorm


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fastnorm.normalize(x, 2.0, dim=None, eps=0.0)
