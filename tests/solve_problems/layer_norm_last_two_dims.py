"""nn.LayerNorm over the last two dims of a (4, 6, 17, 24) fp32 tensor, without affine parameters."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape, elementwise_affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.rand(4, 6, 17, 24)]


def get_init_inputs():
    return [(17, 24)]
