"""A CUDA kernel that writes far outside its output (a bad index): an illegal memory access that poisons the
CUDA context of its process. The evaluator must report it and carry on with the next candidate."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void scale_kernel(const float* x, float* out, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) out[i + (1LL << 36)] = 2.0f * x[i];  // index off by 2^36 elements: 256 GiB past the buffer
}

torch::Tensor scale(torch::Tensor x) {
    auto out = torch::empty_like(x);
    long long n = x.numel();
    scale_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), out.data_ptr<float>(), n);
    return out;
}
"""

ext = load_inline(name="layer_norm", cpp_sources="torch::Tensor scale(torch::Tensor x);",
                  cuda_sources=cuda_source, functions=["scale"])


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        return ext.scale(x.contiguous())
