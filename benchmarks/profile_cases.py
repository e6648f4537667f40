"""Runs a few cases: two warm-up calls, then one call between cudaProfilerStart/Stop, to profile with
`ncu --profile-from-start off` (torch.compile's first call compiles and may tune several kernels).

Usage: python benchmarks/profile_cases.py CASE[:dtype[:op[:impl]]] ...
  dtype: fp32 or bf16 (default fp32); op: ln or rms (default ln); impl: fastnorm or compile (default
  fastnorm; torch.compile of the eager op, to profile the Triton kernel it generates).
  rms_seed is the channel RMSNorm seed (over dim 1, no weight; op ignored).
"""
import sys

import torch
import torch.nn.functional as F

import fastnorm
from quick_timing import affine_params, channel_rms_ref  # same folder: on sys.path when run as a script

cases = {
    "ln_seed": ((16, 64, 256, 256), (64, 256, 256)),
    "ln_16x4194304": ((16, 4194304), (4194304,)),
    "ln_16384x4096": ((16384, 4096), (4096,)),
    "ln_4096x16384": ((4096, 16384), (16384,)),
    "ln_65536x1024": ((65536, 1024), (1024,)),
    "ln_1024x65536": ((1024, 65536), (65536,)),
    "ln_256x262144": ((256, 262144), (262144,)),
    "rms_seed": ((112, 64, 512, 512), None),  # channel axis
    "ln_1x4096": ((1, 4096), (4096,)),  # latency rows
    "ln_32x4096": ((32, 4096), (4096,)),
}
for arg in sys.argv[1:]:
    name, dt, op, impl = (arg.split(":") + ["", "", ""])[:4]
    dtype = torch.bfloat16 if dt == "bf16" else torch.float32
    shape, nshape = cases[name]
    x = torch.randn(shape, device="cuda", dtype=dtype)
    w, b = affine_params(nshape, dtype) if nshape else (None, None)
    if nshape is None:
        fn = torch.compile(channel_rms_ref) if impl == "compile" else lambda x: fastnorm.rms_norm(x, None, None, 1e-5, dim=1)
        call = lambda: fn(x)
    elif op == "rms":
        fn = fastnorm.rms_norm if impl != "compile" else torch.compile(F.rms_norm)
        call = lambda: fn(x, nshape, w, 1e-5)
    else:
        fn = fastnorm.layer_norm if impl != "compile" else torch.compile(F.layer_norm)
        call = lambda: fn(x, nshape, w, b, 1e-5)
    for _ in range(2):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    del x, w, b
print("profile_cases done")
