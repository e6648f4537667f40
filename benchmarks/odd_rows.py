"""Scalar-row shapes (odd n, misaligned row starts) of issue 27: fastnorm against PyTorch eager and
torch.compile, device time with the L2 flushed, % of a device copy. Run on the GPU machine:
    python benchmarks/odd_rows.py [--alt VAR=VALUE]
The "alt" column times fastnorm again with VAR=VALUE set (default FASTNORM_WARP_ROWS=0: the row kernel's
scalar path, as before the warp rows; FASTNORM_WARP_PAIRS=0: 2-byte warp rows one element a lane).
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fastnorm_dev.measure import copy_bandwidth, device_line, device_time, flush_buffer, torch_norm  # noqa: E402

CASES = [((100000, 257), torch.float32, 0), ((100000, 257), torch.bfloat16, 0), ((65536, 1000), torch.float32, 1),
         ((200000, 129), torch.float16, 0), ((32768, 1023), torch.bfloat16, 1), ((100000, 256), torch.float32, 1),
         ((4096, 771), torch.float32, 0), ((1000000, 1), torch.bfloat16, 0), ((500000, 7), torch.float32, 0),
         ((122227, 17), torch.float32, 1), ((1000000, 3), torch.float16, 0), ((300000, 31), torch.bfloat16, 1)]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--alt", default="FASTNORM_WARP_ROWS=0", help="VAR=VALUE for the alt column")
    alt_var, alt_value = p.parse_args().alt.split("=", 1)
    import fastnorm
    flush = flush_buffer()
    bw = copy_bandwidth(flush)
    print(device_line(bw), f"(alt: {alt_var}={alt_value})", flush=True)
    print(f"{'case':<34}{'fastnorm us':>12}{'%copy':>7}{'alt':>11}{'eager us':>10}{'compile us':>11}"
          f"{'vs compile':>11}")
    for (m, n), dt, off in CASES:
        base = torch.randn(m * n + off, device="cuda", dtype=dt)
        x = base[off:].view(m, n)
        w, b = torch.rand(n, device="cuda", dtype=dt) + 0.5, torch.randn(n, device="cuda", dtype=dt)
        for rms in (False, True):
            ours = (lambda: fastnorm.rms_norm(x, (n,), w, 1e-5)) if rms else (lambda: fastnorm.layer_norm(x, (n,), w, b, 1e-5))
            ref = torch_norm(x, w, b, rms)
            err = (ours().float() - ref().float()).abs().max().item()
            t = device_time(ours, flush)
            os.environ[alt_var] = alt_value
            t_row = device_time(ours, flush)
            os.environ.pop(alt_var)
            te = device_time(ref, flush)
            tc = device_time(torch_norm(x, w, b, rms, compiled=True), flush)
            nbytes = 2 * x.numel() * x.element_size()
            label = f"{'RMS' if rms else 'LN'} {str(dt)[6:]} {m}x{n}{' off1' if off else ''}"
            print(f"{label:<34}{t * 1e6:>12.1f}{100 * nbytes / t / bw:>7.1f}{t_row * 1e6:>11.1f}{te * 1e6:>10.1f}"
                  f"{tc * 1e6:>11.1f}"
                  f"{tc / t:>10.2f}x  err {err:.1e}", flush=True)
        del base, x


if __name__ == "__main__":
    main()
