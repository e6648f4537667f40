"""ModelNew for problems/instance_norm_112x64x512x512.py: InstanceNorm2d without parameters or running
statistics, i.e. a LayerNorm of each (sample, channel) plane, on fastnorm's LayerNorm kernels."""
import torch
import torch.nn as nn

import fastnorm


class ModelNew(nn.Module):
    def __init__(self, num_features: int):
        super().__init__()
        self.norm = fastnorm.InstanceNorm2d(num_features=num_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)
