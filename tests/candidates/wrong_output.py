"""A common bug with a multi-dimensional normalized_shape: normalizes over the last dimension only."""
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], None, None, 1e-5)
