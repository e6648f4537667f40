"""ModelNew for problems/rms_norm_112x64x512x512.py: channel RMSNorm, native over dim 1 (no permute/copy)."""
import torch
import torch.nn as nn

import fastnorm


class ModelNew(nn.Module):
    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.num_features = num_features
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fastnorm.rms_norm(x, None, None, self.eps, dim=1)
