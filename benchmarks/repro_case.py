"""Runs one normalization call given on the command line (for compute-sanitizer): ROWSxN DTYPE [ln|rms]."""
import sys

import torch

import fastnorm

rows, n = map(int, sys.argv[1].split("x"))
dtype = getattr(torch, sys.argv[2])
x = torch.randn(rows, n, device="cuda", dtype=dtype)
w = torch.rand(n, device="cuda", dtype=dtype)
if sys.argv[3] == "ln":
    y = fastnorm.layer_norm(x, (n,), w, w)
else:
    y = fastnorm.rms_norm(x, (n,), w)
torch.cuda.synchronize()
print("ok", y.float().abs().max().item())
