"""Like seed003: passes `extra_cuda_flags` (the keyword is extra_cuda_cflags) - fails before any build."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layer_norm = load_inline(
    name="layer_norm",
    cpp_sources="int twice(int x) { return 2 * x; }",
    functions=["twice"],
    extra_cuda_flags=["-O3"],
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        return x
