"""Cheat: times itself. Correct while its calls come one at a time (correctness checks), but once it sees two
calls back to back - an evaluator's warm-up before timing - it returns uninitialised memory from then on.
Must not be ok: the judge checks the output of timed calls picked at random after they returned."""
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)
        self.last_return = None
        self.timed = False

    def forward(self, x):
        now = time.monotonic()
        if self.last_return is not None and now - self.last_return < 0.002:
            self.timed = True
        out = torch.empty_like(x) if self.timed else self.ln(x)
        self.last_return = time.monotonic()
        return out
