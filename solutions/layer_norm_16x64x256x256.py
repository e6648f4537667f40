"""ModelNew for problems/layer_norm_16x64x256x256.py, backed by the fastnorm package."""
import torch
import torch.nn as nn

import fastnorm


class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = fastnorm.LayerNorm(normalized_shape=normalized_shape)  # same state_dict keys as the reference

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)
