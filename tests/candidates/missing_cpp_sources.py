"""Like seed001: calls load_inline without the required cpp_sources - fails before any build."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

layer_norm = load_inline(
    name="layer_norm",
    cuda_sources="__global__ void k() {}",
    functions=["k"],
)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        return x
