"""Cheat (issue 22, attack 2, fast variant): follows gc.get_referrers from its input to the evaluator's
containers (two levels) and returns any other tensor of the input's shape and dtype found there - an expected
output, a saved input. None exist in the candidate's process any more: must be wrong_output (or cheating)."""
import gc

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        frontier, seen = [x], {id(x)}
        for _ in range(2):
            found = []
            for obj in frontier:
                for ref in gc.get_referrers(obj):
                    if id(ref) in seen or not isinstance(ref, (list, tuple, dict)):
                        continue
                    seen.add(id(ref))
                    found.append(ref)
                    for item in (ref.values() if isinstance(ref, dict) else ref):
                        if isinstance(item, torch.Tensor) and item is not x and item.shape == x.shape \
                                and item.dtype == x.dtype and not torch.equal(item, x):
                            return item.clone()
            frontier = found
        return torch.zeros_like(x)
