"""LayerNorm forward + backward (weight and bias) on the CPU: fastnorm against eager, warm caches.

Per shape: the train step through autograd (fastnorm.layer_norm / F.layer_norm, then backward), and
its parts called straight: the forward kernel, the backward kernel (all gradients; dx only), and
forward + backward without autograd (the difference to the train step is host time: Python,
autograd). Implementations take turns in rounds (a shared, noisy machine); each round keeps its
fastest of `inner` calls, and the median over rounds is printed (us).

    PYTHONPATH=src python benchmarks/cpu_train_step.py [--threads 2] [--rounds 15] [--inner 20]
        [--shapes 32x1024:float32,256x1024:bfloat16]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.ops import extension

SHAPES = [(2048, 1024, torch.float32), (2048, 1024, torch.bfloat16), (64, 4096, torch.bfloat16),
          (16, 16384, torch.float32), (32, 5120, torch.bfloat16), (256, 1024, torch.bfloat16),
          (4, 65536, torch.float32), (16, 14336, torch.float16)]


def bench(fns, rounds, inner):
    res = {k: [] for k in fns}
    for f in fns.values():
        for _ in range(5):
            f()
    for _ in range(rounds):
        for k, f in fns.items():
            best = float("inf")
            for _ in range(inner):
                t = time.perf_counter()
                f()
                best = min(best, time.perf_counter() - t)
            res[k].append(best)
    return {k: statistics.median(v) * 1e6 for k, v in res.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--inner", type=int, default=20)
    ap.add_argument("--shapes", default=None, help="MxN:dtype,... in place of the default shapes")
    args = ap.parse_args()
    shapes = SHAPES
    if args.shapes:
        shapes = [(int(mn.split("x")[0]), int(mn.split("x")[1]), getattr(torch, dt))
                  for mn, dt in (item.split(":") for item in args.shapes.split(","))]
    torch.set_num_threads(args.threads)
    ext = extension.load("cpu")
    print(f"threads {args.threads}; us, median of {args.rounds} rounds of the fastest of {args.inner}")
    print(f"{'shape':18s} {'train eager':>11s} {'fastnorm':>9s} {'ratio':>6s} | {'fwd eager':>9s} {'fn':>6s} | "
          f"{'bwd eager':>9s} {'fn':>6s} {'fn dx':>6s} | {'f+b eager':>9s} {'fn':>6s}")
    for m, n, dt in shapes:
        torch.manual_seed(0)
        x = torch.randn(m, n, dtype=dt, requires_grad=True)
        w = torch.randn(n, dtype=dt, requires_grad=True)
        b = torch.randn(n, dtype=dt, requires_grad=True)
        dy = torch.randn(m, n, dtype=dt)
        xd, wd, bd = x.detach(), w.detach(), b.detach()
        _, mean, rstd = torch.ops.aten.native_layer_norm(xd, (n,), wd, bd, 1e-5)

        def train(fn):
            def step():
                y = fn(x, (n,), w, b, 1e-5)
                torch.autograd.backward(y, dy)
                x.grad = w.grad = b.grad = None
            return step

        e_fwd = lambda: torch.ops.aten.native_layer_norm(xd, (n,), wd, bd, 1e-5)
        f_fwd = lambda: ext.norm_forward(xd, wd, bd, 1, 2, 1e-5, False, 0, 0)
        e_bwd = lambda: torch.ops.aten.native_layer_norm_backward(dy, xd, (n,), mean, rstd, wd, bd, [True] * 3)
        f_bwd = lambda: ext.norm_backward(dy, xd, wd, bd, 1, 2, 1e-5, False, True, True, True, None)
        f_dx = lambda: ext.norm_backward(dy, xd, wd, bd, 1, 2, 1e-5, False, True, False, False, None)
        r = bench({"e_train": train(F.layer_norm), "f_train": train(fastnorm.layer_norm), "e_fwd": e_fwd,
                   "f_fwd": f_fwd, "e_bwd": e_bwd, "f_bwd": f_bwd, "f_dx": f_dx,
                   "e_fb": lambda: (e_fwd(), e_bwd()), "f_fb": lambda: (f_fwd(), f_bwd())}, args.rounds, args.inner)
        name = f"{m}x{n} {str(dt).replace('torch.', '')}"
        print(f"{name:18s} {r['e_train']:11.1f} {r['f_train']:9.1f} {r['f_train'] / r['e_train']:6.2f} | "
              f"{r['e_fwd']:9.1f} {r['f_fwd']:6.1f} | {r['e_bwd']:9.1f} {r['f_bwd']:6.1f} {r['f_dx']:6.1f} | "
              f"{r['e_fb']:9.1f} {r['f_fb']:6.1f}", flush=True)


if __name__ == "__main__":
    main()
