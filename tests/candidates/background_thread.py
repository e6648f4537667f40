"""Cheat (CPU analogue of a side stream): returns at once, a thread writes the output 0.3 s later."""
import threading
import time

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        out = torch.empty_like(x)

        def work():
            time.sleep(0.3)
            with torch.no_grad():
                out.copy_(self.ln(x))

        threading.Thread(target=work, daemon=True).start()
        return out
