"""Times the split-row kernel under several (threads, blocks_per_row) overrides on long-row shapes."""
import math

import torch
from quick_timing import bench  # this folder is on sys.path when run as a script

from fastnorm.ops import extension

ext = extension.load("cuda")
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")


for dt in (torch.float32, torch.bfloat16):
    for m, n in [(1024, 65536), (256, 262144), (16, 4194304)]:
        x = torch.randn(m, n, device="cuda", dtype=dt)
        w = torch.rand(n, device="cuda", dtype=dt)
        b = torch.randn(n, device="cuda", dtype=dt)
        g = math.ceil(n * x.element_size() / (64 << 10))
        row = []
        for t, blocks in [(0, 0), (256, 2 * g), (512, 2 * g), (256, g), (128, 4 * g), (1024, 0)]:
            us = bench(lambda: ext.norm_forward(x, w, b, 1, 2, 1e-5, False, t, blocks), flush) * 1e6  # seconds -> us
            row.append(f"t{t}/g{blocks}:{us:7.1f}")
        print(f"{m}x{n} {str(dt)[6:]:<9}", "  ".join(row), flush=True)
        del x, w, b
