"""Kills the judge (its parent, the worker process) in forward with SIGKILL: the worker dies mid-run."""
import os
import signal

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        os.kill(os.getppid(), signal.SIGKILL)
        return x
