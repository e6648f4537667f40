"""Cheat (issue 22, attack 1 on CUDA): at import, makes torch.cuda.Event.elapsed_time report a tenth of the
time, then runs an honest eager LayerNorm (fooled the old evaluator into `ok 9.84x`). Must be cheating, naming
torch.cuda.Event.elapsed_time (on CPU too: the patch is noticed whatever the device)."""
import torch
import torch.nn as nn

_elapsed = torch.cuda.Event.elapsed_time
torch.cuda.Event.elapsed_time = lambda self, end: _elapsed(self, end) / 10


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return self.ln(x)
