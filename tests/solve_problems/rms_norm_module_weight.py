"""nn.RMSNorm with a weight over the last dim of a (6, 19, 128) fp32 tensor."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-6):
        super().__init__()
        self.rms = nn.RMSNorm(hidden, eps=eps)
        with torch.no_grad():
            self.rms.weight.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rms(x)


def get_inputs():
    return [torch.randn(6, 19, 128)]


def get_init_inputs():
    return [128]
