"""nn.LayerNorm over the last dim of a (5, 33, 96) fp32 tensor, affine."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


def get_inputs():
    return [torch.randn(5, 33, 96) * 3 + 100]


def get_init_inputs():
    return [96]
