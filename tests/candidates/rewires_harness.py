"""Cheat (issue 22, attack 3): at import, walks sys.modules and replaces the comparison functions it finds in
fastnorm's harness modules with ones that always pass, then returns zeros. Must not be ok: the comparison runs
in the judge's process, and the rebinding is noticed in the candidate's."""
import sys

import torch
import torch.nn as nn

_PASS = {"compare": None, "bitwise_equal": lambda *a, **k: True, "count_differences": lambda *a, **k: 0,
         "storages_overlap": lambda *a, **k: False, "check_run": lambda *a, **k: (0.0, 0.0)}

for name, module in list(sys.modules.items()):
    if name.startswith("fastnorm.harness") or name == "__main__":
        for attr, fake in _PASS.items():
            if hasattr(module, attr) and fake is not None:
                setattr(module, attr, fake)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        return torch.zeros_like(x)
