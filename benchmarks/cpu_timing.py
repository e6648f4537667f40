"""fastnorm's CPU kernels against PyTorch eager, one thread and all threads (developer tool).

Usage: PYTHONPATH=src python benchmarks/cpu_timing.py [--threads 1,2] [--dtypes fp32,bf16,fp16]
                                  [--rows NAME,...] [--budget 0.3] [--rounds 1] [--trim-heap]

Each row times fastnorm and its eager baseline alternately (one call of each per trial, so a noisy
neighbour slows both alike; who goes first alternates) after two warm-up calls, warm caches, and
prints the median times and
"x eager", the median over trials of eager / fastnorm (>= 1: fastnorm is faster). Baselines:
F.layer_norm / F.rms_norm over the last dim; over the channel axis (dim 1 of NCHW) F.layer_norm of
the permuted tensor, and for RMSNorm the faster of `x / sqrt(mean(x**2, dim=1, keepdim=True) + eps)`
and F.rms_norm of the permuted tensor.

Heap: glibc serves outputs up to 32 MB from its heap and gives the heap's top back to the OS on a free
that leaves enough of it unused. Which call of a trial does that depends on the order of allocations
(eager's LayerNorm frees mean and rstd besides its output), and the next output then page-faults in
full (4096x1024 fp32, fresh process: 4080 faults per fastnorm call, none per eager call, 0.8x). The
script fixes glibc's thresholds (outputs up to 32 MB from the heap, no trimming), the steady state
of a long-running process; --trim-heap keeps glibc's defaults.
"""
import argparse
import ctypes
import ctypes.util
import statistics
import sys
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


def steady_heap():
    """glibc only: mmap threshold at its dynamic maximum (32 MB), no trimming of the heap's top."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 2**31 - 1))
    except (OSError, AttributeError):
        return False


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
    for trial in range(trials):
        # Who goes first alternates: the first call of a trial can inherit the allocator's state from
        # the last one (a heap trimmed after a free and grown again on the next 16 MB output).
        order = range(len(fns)) if trial % 2 == 0 else reversed(range(len(fns)))
        for i in order:
            t0 = time.perf_counter()
            fns[i]()
            times[i].append(time.perf_counter() - t0)
    ratios = [min(ts[i] for ts in times[1:]) / times[0][i] for i in range(trials)]
    return [statistics.median(ts) for ts in times], statistics.median(ratios)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default=f"1,{torch.get_num_threads()}")
    parser.add_argument("--dtypes", default="fp32,bf16,fp16")
    parser.add_argument("--rows", default=",".join(ROWS))
    parser.add_argument("--budget", type=float, default=0.3, help="seconds of timing per implementation")
    parser.add_argument("--rounds", type=int, default=1,
                        help="passes over all rows; the table shows medians over them, and the lowest ratio")
    parser.add_argument("--trim-heap", action="store_true", help="keep glibc's heap thresholds (see above)")
    args = parser.parse_args()
    if not args.trim_heap:
        print(f"steady heap: {steady_heap()}")
    threads = sorted({int(t) for t in args.threads.split(",")})
    results = {}  # (row, op, dtype, threads) -> [(fastnorm s, eager s, ratio)] over rounds
    for round_ in range(args.rounds):
        for row in args.rows.split(","):
            shape, layout = ROWS[row]
            for dname in args.dtypes.split(","):
                for label, ours, eagers in cases(shape, layout, DTYPES[dname]):
                    for t in threads:
                        torch.set_num_threads(t)
                        times, ratio = median_times([ours] + eagers, args.budget)
                        results.setdefault((row, label, dname, t), []).append((times[0], min(times[1:]), ratio))
        print(f"round {round_ + 1} of {args.rounds} done", file=sys.stderr, flush=True)
    print(f"{'row':<14} {'op':<4} {'dtype':<5} {'thr':>3} {'fastnorm us':>12} {'eager us':>10} {'x eager':>8} "
          f"{'lowest':>7}")
    for (row, label, dname, t), runs in results.items():
        ours, eager, ratio = (statistics.median(r[i] for r in runs) for i in range(3))
        print(f"{row:<14} {label:<4} {dname:<5} {t:>3} {ours * 1e6:>12.1f} {eager * 1e6:>10.1f} {ratio:>8.2f} "
              f"{min(r[2] for r in runs):>7.2f}")
    worst = min(statistics.median(r[2] for r in runs) for runs in results.values())
    print(f"worst x eager (median over rounds): {worst:.2f}")


if __name__ == "__main__":
    main()
