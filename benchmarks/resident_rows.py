"""Device timing and float64 error of a few multi-MB rows (the resident kernel), LayerNorm and RMSNorm
in fp32 and bf16, as % of the copy bandwidth measured in the same process.

A developer tool for A/B runs on the GPU machine (one line of results per run).
Usage: python benchmarks/resident_rows.py LABEL [ROWSxN, default 16x4194304]
"""
import sys

import torch

from fastnorm.ops import extension
from quick_timing import affine_params, bench, copy_bandwidth, torch_norm


def main():
    ext = extension.load("cuda")
    m, n = map(int, (sys.argv[2] if len(sys.argv) > 2 else "16x4194304").split("x"))
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    bw = copy_bandwidth(flush, reps=20)
    cells = []
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(m, n, device="cuda", dtype=dt) + 3
        w, b = affine_params(n, dt)
        for rms in (False, True):
            def call():
                return ext.norm_forward(x, w, None if rms else b, 1, 2, 1e-5, rms, 0, 0)
            xd = x.double()
            ref = torch_norm(xd, w.double(), b.double(), rms)()
            err = ((call().double() - ref).abs() / ref.abs().clamp(min=1)).max().item()
            del xd, ref
            t = bench(call, flush, reps=50)
            moved = x.numel() * x.element_size() * 2 + n * w.element_size() * (1 if rms else 2)
            cells.append(f"{'RMS' if rms else 'LN'} {str(dt)[6:]}: {t * 1e6:.1f} us {moved / t / bw * 100:.1f}% "
                         f"err {err:.1e}")
    print(f"{sys.argv[1]} {m}x{n} (copy {bw / 1e9:.0f} GB/s) | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
