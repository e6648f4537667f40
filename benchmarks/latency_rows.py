"""Device timing of latency-bound rows (fewer rows than SMs, short rows), fastnorm against torch.compile.

A developer tool for A/B runs on the GPU machine: run it once per build (different PYTHONPATH /
TORCH_EXTENSIONS_DIR) and alternate the builds a few times; one line of results per run.
Usage: python benchmarks/latency_rows.py LABEL [--compile]
"""
import sys

import torch

from fastnorm.ops import extension
from quick_timing import affine_params, bench, torch_norm

SHAPES = [(1, 4096), (32, 4096), (64, 1024), (100, 2048)]


def main():
    ext = extension.load("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    with_compile = "--compile" in sys.argv
    cells = []
    for dt in (torch.bfloat16, torch.float32):
        for m, n in SHAPES:
            x = torch.randn(m, n, device="cuda", dtype=dt)
            w, b = affine_params(n, dt)
            for rms in (False, True):
                def call():
                    return ext.norm_forward(x, w, None if rms else b, 1, 2, 1e-5, rms, 0, 0)
                ref = torch_norm(x, w, b, rms)()
                wrong = (call().float() - ref.float()).abs().max().item() > 5e-2
                cell = f"{'RMS' if rms else 'LN'} {m}x{n} {str(dt)[6:]}: {bench(call, flush, reps=200) * 1e6:.2f}"
                cell += " WRONG" if wrong else ""
                if with_compile:
                    cell += f" compile {bench(torch_norm(x, w, b, rms, compiled=True), flush, reps=200) * 1e6:.2f}"
                cells.append(cell)
    print(sys.argv[1] + " | " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
