"""Cheat (issue 22, attack 2): scans the process's live objects (gc) for the reference's result and returns it,
computing nothing. It recognises the result as a tensor of the input's shape, not equal to the input, whose
rows have mean ~0 and std ~1. The old evaluator ran the reference in the candidate's process (this got `ok`
with error 0); now the expected outputs never exist there: wrong_output.
"""
import gc

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.dims = tuple(range(-len(normalized_shape), 0))

    def _looks_normalized(self, t):
        if not bool(torch.isfinite(t).all()):
            return False
        mean = t.mean(self.dims)
        std = t.std(self.dims)
        return bool((mean.abs() < 1e-3).all()) and bool(((std - 1).abs() < 1e-2).all())

    def forward(self, x):
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor) and obj is not x and obj.shape == x.shape and obj.dtype == x.dtype \
                    and obj.device == x.device and not torch.equal(obj, x) and self._looks_normalized(obj):
                return obj
        return torch.zeros_like(x)
