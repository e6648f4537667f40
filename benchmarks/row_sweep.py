"""Device timing of the last-dim kernels under each threads-per-row override, against torch.compile
(developer tool for a GPU run; the planner's own choice is threads=0).

Usage: python benchmarks/row_sweep.py [--quick] [MxN ...]   (default: the bf16 rows where Triton leads;
--quick: the planner's choice only, no torch.compile)
"""
import sys

import torch

from fastnorm.ops import extension
from quick_timing import affine_params, bench, copy_bandwidth, torch_norm  # same folder: on sys.path as a script


def main():
    ext = extension.load("cuda")
    quick = "--quick" in sys.argv
    args = [a for a in sys.argv[1:] if a != "--quick"]
    shapes = [tuple(int(v) for v in a.split("x")) for a in args] or [(16384, 4096), (4096, 16384), (65536, 1024)]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    bw = copy_bandwidth(flush, reps=40)
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e9:.0f} GB/s", flush=True)
    for dt in (torch.bfloat16, torch.float32):
        for m, n in shapes:
            x = torch.randn(m, n, device="cuda", dtype=dt)
            w, b = affine_params(n, dt)
            for rms in (False, True):
                nbytes = 2 * x.numel() * x.element_size() + (1 if rms else 2) * n * w.element_size()
                ref = torch_norm(x, w, b, rms)()
                cells = []
                if not quick:
                    comp = torch_norm(x, w, b, rms, compiled=True)
                    cells.append(f"compile {100 * nbytes / bench(comp, flush, reps=40) / bw:5.1f}")
                for t in (0,) if quick else (0, 32, 64, 128, 256, 512):
                    call = lambda: ext.norm_forward(x, w, None if rms else b, 1, 2, 1e-5, rms, t, 0)
                    err = (call().float() - ref.float()).abs().max().item()
                    tol = 5e-2 if dt == torch.bfloat16 else 1e-3
                    mark = "" if err < tol else "!"
                    cells.append(f"t{t} {100 * nbytes / bench(call, flush, reps=40) / bw:5.1f}{mark}")
                print(f"{'RMS' if rms else 'LN':<4}{m}x{n} {str(dt)[6:]:<9}" + "  ".join(cells), flush=True)
            del x, w, b, ref
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
