"""Crashes the process in forward (reads address 0)."""
import ctypes

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        return ctypes.string_at(0)
