"""F.layer_norm over the last dim with parameters of its own and a non-default eps from the constructor."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, features: int, eps: float = 1e-5):
        super().__init__()
        self.features = features
        self.eps = eps
        self.weight = nn.Parameter(torch.randn(features))
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.features,), self.weight, self.bias, self.eps)


def get_inputs():
    return [torch.rand(10, 77) * 1e-2]


def get_init_inputs():
    return [77, 0.25]
