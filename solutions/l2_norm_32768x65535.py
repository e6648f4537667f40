"""ModelNew for problems/l2_norm_32768x65535.py: x / ||x||_2 over dim 1 on the fastnorm family kernels."""
import torch
import torch.nn as nn

import fastnorm


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fastnorm.normalize(x, 2.0, dim=1, eps=0.0)
