"""Honest LayerNorm that records which process imports it (in $FASTNORM_TEST_IMPORT_LOG): the evaluator must
import a candidate only in the candidate's own process, never in the judge's."""
import os
import sys

import torch.nn as nn

if os.environ.get("FASTNORM_TEST_IMPORT_LOG"):
    with open(os.environ["FASTNORM_TEST_IMPORT_LOG"], "a") as log:
        log.write(" ".join(sys.argv[:1]) + "\n")


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)

    def forward(self, x):
        return self.ln(x)
