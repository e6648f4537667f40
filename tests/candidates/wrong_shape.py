"""Returns the right numbers in the wrong shape (flattened normalized dims)."""
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)
        self.ndim = len(normalized_shape)

    def forward(self, x):
        return self.ln(x).flatten(-self.ndim)
