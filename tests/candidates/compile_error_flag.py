"""A build failure that fails fast: an unknown compiler flag (verbose=True, so the log goes to stdout, not into
the exception). Must be compile_error naming the flag."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layer_norm = load_inline(
    name="layer_norm",
    cpp_sources="int twice(int x) { return 2 * x; }",
    functions=["twice"],
    extra_cflags=["-fthis-flag-does-not-exist"],
    verbose=True,
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        return x
