"""Builds its extension lazily in __init__, and the build fails (a misspelt identifier in C++):
compile_error with the compiler's first error, even though the module imported fine."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ext = load_inline(name="layer_norm", cpp_sources="int twice(int x) { return 2 * y; }",
                               functions=["twice"], extra_cflags=["-include", "no_such_header.h"])

    def forward(self, x):
        return x
