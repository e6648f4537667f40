"""Runs every CUDA kernel path once on small inputs, for compute-sanitizer (memcheck / racecheck)."""
import torch

import fastnorm
from fastnorm.ops import extension

ext = extension.load("cuda")
for dtype in (torch.float32, torch.bfloat16, torch.float64):
    for shape in [(5, 33), (7, 1024), (3, 4097), (2, 40000)]:  # row kernel (vector and scalar), split rows
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w = torch.rand(shape[-1], device="cuda", dtype=dtype)
        fastnorm.layer_norm(x, shape[-1:], w, w)
        fastnorm.rms_norm(x, shape[-1:], w)
    for shape in [(300, 3 * 8192 + 8), (140, 30001)]:  # cluster rows (vector and scalar), several a cluster
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w = torch.rand(shape[-1], device="cuda", dtype=dtype)
        fastnorm.layer_norm(x, shape[-1:], w, w)
        fastnorm.rms_norm(x, shape[-1:], None)
    # Few rows of 4 MB and more: resident rows (4-8 MB in two row groups; 16 MB float32 LayerNorm stages
    # its next row in L2), streamed rows (too long to hold on chip).
    for rows, n in [(3, (8 << 20) // torch.finfo(dtype).bits * 8 + 16), (3, (4 << 20) // torch.finfo(dtype).bits * 8),
                    (2, 9 << 20), (3, 1 << 22)]:
        big = torch.randn(rows, n, device="cuda", dtype=dtype)
        wb = torch.rand(n, device="cuda", dtype=dtype)
        fastnorm.layer_norm(big, big.shape[-1:], wb, wb)
        fastnorm.rms_norm(big, big.shape[-1:], wb)
        del big, wb
    ext.norm_forward(torch.randn(3, 9000, device="cuda", dtype=dtype), None, None, 1, 2, 1e-5, False, 128, 7)
    # More slices than the chip holds with a cache: the split kernel without one.
    ext.norm_forward(torch.randn(3, 50000, device="cuda", dtype=dtype), None, None, 1, 2, 1e-5, False, 32, 6000)
    for shape in [(2, 5, 3, 7), (2, 64, 8, 16), (1, 300, 4, 4), (1, 3000, 4, 4)]:  # strided: tiled, registers
        x = torch.randn(shape, device="cuda", dtype=dtype)
        fastnorm.rms_norm(x, None, None, 1e-5, dim=1)
        fastnorm.layer_norm(x, None, torch.rand(shape[1], device="cuda", dtype=dtype), None, dim=1)
torch.cuda.synchronize()
print("sanitize_paths: all paths ran")
