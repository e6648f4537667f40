"""fastnorm.normalize(x, p, dim=1) against torch.nn.functional.normalize on the CPU: wall-clock medians of
alternating calls (fp32, rows of 256 KB and 16 KB). Results: benchmarks/results/cpu-2core-normalize.txt.

    python benchmarks/cpu_normalize.py [--reps 15]
"""
import argparse
import statistics
import time

import torch

import fastnorm


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=15)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    for shape in [(1024, 65535), (4096, 4096)]:
        x = torch.randn(*shape)
        for order in (1.0, 2.0):
            calls = {"fastnorm": lambda: fastnorm.normalize(x, order, 1),
                     "eager": lambda: torch.nn.functional.normalize(x, order, 1)}
            times = {name: [] for name in calls}
            for fn in calls.values():
                fn()
            for _ in range(args.reps):
                for name, fn in calls.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            ours, eager = statistics.median(times["fastnorm"]), statistics.median(times["eager"])
            print(f"{shape} p={order:g}: fastnorm {ours * 1e3:.1f} ms, eager {eager * 1e3:.1f} ms, {eager / ours:.2f}x",
                  flush=True)


if __name__ == "__main__":
    main()
