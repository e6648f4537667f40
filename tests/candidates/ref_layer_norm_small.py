"""Small LayerNorm reference (KernelBench format) so that CPU tests of the evaluator run fast."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


def get_inputs():
    return [torch.randn(4, 16, 32, 33) * 2.0 + 0.5]


def get_init_inputs():
    return [(32, 33)]
