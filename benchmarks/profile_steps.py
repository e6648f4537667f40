"""Kernel-by-kernel device time of fastnorm training steps (forward + backward of one norm), for A/B runs of
two builds on the GPU machine (run once per build, each with its own PYTHONPATH / TORCH_EXTENSIONS_DIR).

Prints, per case: the step's median time between CUDA events (L2 flushed before each step, the step issued
while the flush runs, as `fastnorm bench --timing device`), the same with the GPU idle at the start (host
time counts, as `--timing host`), and torch.profiler's mean device time of every kernel the step launches.

Usage: python benchmarks/profile_steps.py [--label NAME] [--cases ln-bf16-16384x4096,rms-bf16-16384x4096]
"""
import argparse

import torch

FLUSH_BYTES = 256 << 20
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEFAULT_CASES = ("ln-bf16-16384x4096", "rms-bf16-16384x4096", "ln-bf16-8192x5120", "ln-fp32-4096x16384",
                 "ln-bf16-65536x1024", "rms-fp32-112x64x512x512-dim1")


def parse_case(text):
    """op-dtype-shape[-dim1]: LN/RMS over the last dim with weight (+ bias), or over dim 1: the RMSNorm
    seed (no weight) or LayerNorm with weight and bias of shape (C,)."""
    parts = text.split("-")
    op, dtype, shape = parts[0], DTYPES[parts[1]], tuple(int(v) for v in parts[2].split("x"))
    return op, dtype, shape, "dim1" in parts[3:]


def make_step(fastnorm, op, dtype, shape, channel):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
    dy = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    c = shape[1] if channel else shape[-1]
    w = (torch.rand(c, device="cuda", dtype=dtype, generator=gen) + 0.5).requires_grad_(True)
    b = torch.randn(c, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
    if channel and op == "rms":  # the RMSNorm seed: no weight
        inputs = [x]
        fn = lambda: fastnorm.rms_norm(x, None, None, 1e-5, dim=1)
    elif channel:
        inputs = [x, w, b]
        fn = lambda: fastnorm.layer_norm(x, None, w, b, 1e-5, dim=1)
    elif op == "ln":
        inputs = [x, w, b]
        fn = lambda: fastnorm.layer_norm(x, (c,), w, b, 1e-5)
    else:
        inputs = [x, w]
        fn = lambda: fastnorm.rms_norm(x, (c,), w, 1e-5)
    return lambda: torch.autograd.grad(fn(), inputs, dy)


def event_median(step, flush, idle_start, reps=30):
    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        flush.zero_()
        if idle_start:
            torch.cuda.synchronize()
        else:
            torch.cuda._sleep(1_000_000)  # keeps the GPU busy while the host issues the step
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def kernel_table(step, flush, reps=10):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.zero_()
            step()
        torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        total = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if total and ev.count and "zero_" not in ev.key and "fill" not in ev.key.lower():
            rows.append((total / reps, ev.count / reps, ev.key))
    rows.sort(reverse=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--label", default="")
    p.add_argument("--cases", default=",".join(DEFAULT_CASES))
    args = p.parse_args()
    import fastnorm
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    print(f"== {args.label} fastnorm from {fastnorm.__file__}", flush=True)
    for text in args.cases.split(","):
        op, dtype, shape, channel = parse_case(text)
        torch.cuda.empty_cache()
        step = make_step(fastnorm, op, dtype, shape, channel)
        dev = event_median(step, flush, idle_start=False)
        host = event_median(step, flush, idle_start=True)
        print(f"{args.label} {text}: step {dev:.1f} us device, {host:.1f} us idle start", flush=True)
        for us, count, name in kernel_table(step, flush):
            print(f"    {us:9.1f} us  x{count:g}  {name[:110]}", flush=True)
        del step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
