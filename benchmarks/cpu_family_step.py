"""fastnorm's GroupNorm / InstanceNorm / BatchNorm (training) against PyTorch eager on the CPU: the forward
alone and a training step (forward + backward of x, weight and bias), wall-clock medians of alternating
calls; err: the forward's max |fastnorm - float64 torch|. Results: benchmarks/results/cpu-2core-family.txt.

    PYTHONPATH=src python benchmarks/cpu_family_step.py [--reps 9]
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import fastnorm

GROUP_SHAPES = [((8, 64, 56, 56), 8), ((4, 512, 16, 16), 32), ((2, 128, 64, 64), 32), ((16, 32, 8, 8), 4)]
CHANNEL_SHAPES = [(8, 64, 56, 56), (4, 512, 16, 16), (16, 32, 8, 8)]


def medians(calls, reps):
    """Median seconds of each call, the calls alternating."""
    times = {name: [] for name in calls}
    for fn in calls.values():
        fn()
    for _ in range(reps):
        for name, fn in calls.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def pair(name, groups):
    """(fastnorm's call, eager's call), each f(x, weight, bias)."""
    if name == "group_norm":
        return (lambda x, w, b: fastnorm.group_norm(x, groups, w, b, 1e-5),
                lambda x, w, b: F.group_norm(x, groups, w, b, 1e-5))
    if name == "instance_norm":
        return (lambda x, w, b: fastnorm.instance_norm(x, weight=w, bias=b),
                lambda x, w, b: F.instance_norm(x, weight=w, bias=b))
    return (lambda x, w, b: fastnorm.batch_norm(x, None, None, w, b, training=True),
            lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=9)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        cases += [("group_norm", dtype, shape, groups) for shape, groups in GROUP_SHAPES]
        for shape in CHANNEL_SHAPES:
            cases += [("instance_norm", dtype, shape, None), ("batch_norm", dtype, shape, None)]
    print(f"threads {torch.get_num_threads()}; ms, median of {args.reps}; x: eager / fastnorm")
    print(f"{'op':14s} {'dtype':9s} {'shape':12s} {'fwd':>8s} {'eager':>8s} {'x':>6s} | {'train':>8s} {'eager':>8s}"
          f" {'x':>6s}  err")
    for name, dtype, shape, groups in cases:
        channels = shape[1]
        x = torch.randn(*shape, dtype=dtype)
        w, b = torch.randn(channels, dtype=dtype), torch.randn(channels, dtype=dtype)
        ours, eager = pair(name, groups)
        err = (ours(x, w, b).double() - eager(x.double(), w.double(), b.double())).abs().max().item()
        fwd = medians({"ours": lambda: ours(x, w, b), "eager": lambda: eager(x, w, b)}, args.reps)
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        dy = torch.randn_like(x)

        def step(fn):
            def run():
                torch.autograd.backward(fn(*leaves), dy)
                for t in leaves:
                    t.grad = None
            return run

        train = medians({"ours": step(ours), "eager": step(eager)}, args.reps)
        print(f"{name:14s} {str(dtype)[6:]:9s} {'x'.join(map(str, shape)):12s} {fwd['ours'] * 1e3:8.3f}"
              f" {fwd['eager'] * 1e3:8.3f} {fwd['eager'] / fwd['ours']:5.2f}x | {train['ours'] * 1e3:8.3f}"
              f" {train['eager'] * 1e3:8.3f} {train['eager'] / train['ours']:5.2f}x  {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
