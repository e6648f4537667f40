"""Cheat: makes torch.cuda.synchronize a no-op at import, so that a timing loop built on it would start its
clock while the previous call (and the cache flush) still run. Must be cheating naming torch.cuda.synchronize."""
import torch
import torch.nn as nn

torch.cuda.synchronize = lambda device=None: None


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return self.ln(x)
