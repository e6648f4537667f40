"""Defines the model under another name: load_error unless --class LayerNormFast is given."""
import torch.nn as nn


class LayerNormFast(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return self.ln(x)
