"""Runs a few cases twice (warm-up, then the one to profile) for `ncu --launch-skip`.

Usage: python benchmarks/profile_cases.py CASE[:dtype] ...   (dtype: fp32 or bf16, default fp32)
"""
import sys

import torch

import fastnorm

cases = {
    "ln_seed": ((16, 64, 256, 256), (64, 256, 256)),
    "ln_16x4194304": ((16, 4194304), (4194304,)),
    "ln_16384x4096": ((16384, 4096), (4096,)),
    "ln_1024x65536": ((1024, 65536), (65536,)),
}
for arg in sys.argv[1:]:
    name, _, dt = arg.partition(":")
    dtype = torch.bfloat16 if dt == "bf16" else torch.float32
    shape, nshape = cases[name]
    x = torch.randn(shape, device="cuda", dtype=dtype)
    w = torch.rand(nshape, device="cuda", dtype=dtype) + 0.5
    b = torch.randn(nshape, device="cuda", dtype=dtype)
    for _ in range(2):
        fastnorm.layer_norm(x, nshape, w, b)
    torch.cuda.synchronize()
    del x, w, b
print("profile_cases done")
