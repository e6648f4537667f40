"""Cheat: swaps fastnorm's checks module in sys.modules for a fake whose comparisons always pass (so that code
looking it up by name gets the fake), then returns zeros. Must not be ok."""
import sys
import types

import torch
import torch.nn as nn

_fake = types.ModuleType("fastnorm.harness.checks")
_fake.__dict__.update(vars(sys.modules["fastnorm.harness.checks"]) if "fastnorm.harness.checks" in sys.modules else {})
_fake.bitwise_equal = lambda *a, **k: True
_fake.count_differences = lambda *a, **k: 0
sys.modules["fastnorm.harness.checks"] = _fake


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        return torch.zeros_like(x)
