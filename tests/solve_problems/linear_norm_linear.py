"""A LayerNorm between two Linear layers, with a GELU: only the norm is replaced."""
import torch
import torch.nn as nn
import torch.nn.functional as F

HIDDEN = 48


class Model(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return [32, 24]
