"""fastnorm's CPU kernels against PyTorch eager, one thread and all threads (developer tool).

Usage: PYTHONPATH=src python benchmarks/cpu_timing.py [--threads 1,2] [--dtypes fp32,bf16,fp16]
                                                      [--rows NAME,...] [--budget 0.3]

Each row times fastnorm and its eager baseline alternately (one call of each per trial, so a noisy
neighbour slows both alike) after two warm-up calls, warm caches, and prints the median times and
"x eager", the median over trials of eager / fastnorm (>= 1: fastnorm is faster). Baselines:
F.layer_norm / F.rms_norm over the last dim; over the channel axis (dim 1 of NCHW) F.layer_norm of
the permuted tensor, and for RMSNorm the faster of `x / sqrt(mean(x**2, dim=1, keepdim=True) + eps)`
and F.rms_norm of the permuted tensor.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import fastnorm

EPS = 1e-5
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "fp64": torch.float64}
# name -> (shape, layout): "last" normalizes the last dim, "channel" dim 1 of NCHW.
ROWS = {
    "64x16384": ((64, 16384), "last"),
    "4096x1024": ((4096, 1024), "last"),
    "16384x4096": ((16384, 4096), "last"),
    "100000x257": ((100000, 257), "last"),
    "1x4096": ((1, 4096), "last"),
    "3x5": ((3, 5), "last"),
    "8x64x56x56": ((8, 64, 56, 56), "channel"),
    "2x3x224x224": ((2, 3, 224, 224), "channel"),
    "4x512x16x16": ((4, 512, 16, 16), "channel"),
}


def cases(shape, layout, dtype):
    """(label, fastnorm call, [eager calls]) for LayerNorm (weight + bias) and RMSNorm on one input."""
    x = torch.randn(shape, dtype=dtype)
    if layout == "last":
        n = shape[-1]
        w, b = torch.rand(n, dtype=dtype) + 0.5, torch.randn(n, dtype=dtype)
        yield ("LN", lambda: fastnorm.layer_norm(x, (n,), w, b, EPS),
               [lambda: F.layer_norm(x, (n,), w, b, EPS)])
        yield ("RMS", lambda: fastnorm.rms_norm(x, (n,), w, EPS),
               [lambda: F.rms_norm(x, (n,), w, EPS)])
        return
    c = shape[1]
    w, b = torch.rand(c, dtype=dtype) + 0.5, torch.randn(c, dtype=dtype)
    yield ("LN", lambda: fastnorm.layer_norm(x, None, w, b, EPS, dim=1),
           [lambda: F.layer_norm(x.permute(0, 2, 3, 1), (c,), w, b, EPS).permute(0, 3, 1, 2)])
    yield ("RMS", lambda: fastnorm.rms_norm(x, eps=EPS, dim=1),
           [lambda: x / torch.sqrt(x.pow(2).mean(dim=1, keepdim=True) + EPS),
            lambda: F.rms_norm(x.permute(0, 2, 3, 1), (c,), None, EPS).permute(0, 3, 1, 2)])


def median_times(fns, budget):
    """Median seconds per call of each of `fns`, timed alternately within about `budget` s each, and
    the median over trials of min(others) / first: on a shared machine a paired ratio shrugs off the
    slow stretches that hit both sides of a trial alike."""
    for fn in fns:
        fn()
        fn()
    start = time.perf_counter()
    fns[0]()
    once = max(time.perf_counter() - start, 1e-7)
    trials = int(min(500, max(9, budget / once)))
    times = [[] for _ in fns]
    for _ in range(trials):
        for fn, ts in zip(fns, times):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
    ratios = [min(ts[i] for ts in times[1:]) / times[0][i] for i in range(trials)]
    return [statistics.median(ts) for ts in times], statistics.median(ratios)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}")
    parser.add_argument("--dtypes", default="fp32,bf16,fp16")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--budget", type=float, default=0.3, help="seconds of timing per implementation")
    args = parser.parse_args()
    threads = sorted({int(t) for t in args.threads.split(",")})
    print(f"{'row':<14} {'op':<4} {'dtype':<5} {'thr':>3} {'fastnorm us':>12} {'eager us':>10} {'x eager':>8}")
    worst = None
    for row in args.rows.split(","):
        shape, layout = ROWS[row]
        for dname in args.dtypes.split(","):
            for label, ours, eagers in cases(shape, layout, DTYPES[dname]):
                for t in threads:
                    torch.set_num_threads(t)
                    times, ratio = median_times([ours] + eagers, args.budget)
                    eager = min(times[1:])
                    worst = ratio if worst is None else min(worst, ratio)
                    print(f"{row:<14} {label:<4} {dname:<5} {t:>3} {times[0] * 1e6:>12.1f} {eager * 1e6:>10.1f} "
                          f"{ratio:>8.2f}", flush=True)
    print(f"worst x eager: {worst:.2f}")


if __name__ == "__main__":
    main()
