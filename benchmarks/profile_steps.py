"""Kernel-by-kernel device time of fastnorm training steps (forward + backward of one norm), for A/B runs of
two builds on the GPU machine (run once per build, each with its own PYTHONPATH / TORCH_EXTENSIONS_DIR).

Prints, per case: the step's median time between CUDA events (L2 flushed before each step, the step issued
while the flush runs, as `fastnorm bench --timing device`), the same with the GPU idle at the start (host
time counts, as `--timing host`), and torch.profiler's mean device time of every kernel the step launches.

With --impl compile the same steps run through torch.compile of the eager op (F.layer_norm, F.rms_norm, or the
channel formulas), to set inductor's kernels beside ours. With --ncu each case runs one step between
cudaProfilerStart/Stop instead (after warm-up), for `ncu --profile-from-start off`.

Usage: python benchmarks/profile_steps.py [--label NAME] [--impl fastnorm|compile] [--ncu]
                                          [--cases ln-bf16-16384x4096,rms-bf16-16384x4096]
"""
import argparse
import types

import torch

from fastnorm_dev.measure import channel_rms_ref, profiled_call  # beside this file: on sys.path as a script

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


def compiled_ops():
    """torch.compile of the eager ops, with fastnorm's call signatures (the channel forms as formulas)."""
    import torch.nn.functional as F

    def layer_norm(x, shape, w, b, eps, dim=None):
        if dim is None:
            return F.layer_norm(x, shape, w, b, eps)
        mean = x.float().mean(dim, keepdim=True)
        var = x.float().var(dim, unbiased=False, keepdim=True)
        view = [1] * x.dim()
        view[dim] = -1
        return ((x.float() - mean) * torch.rsqrt(var + eps) * w.view(view) + b.view(view)).to(x.dtype)

    def rms_norm(x, shape, w, eps, dim=None):
        return F.rms_norm(x, shape, w, eps) if dim is None else channel_rms_ref(x, eps)  # (the seed: dim 1)

    return types.SimpleNamespace(layer_norm=torch.compile(layer_norm), rms_norm=torch.compile(rms_norm))


def make_step(ops, op, dtype, shape, channel):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(shape, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
    dy = torch.randn(shape, device="cuda", dtype=dtype, generator=gen)
    c = shape[1] if channel else shape[-1]
    w = (torch.rand(c, device="cuda", dtype=dtype, generator=gen) + 0.5).requires_grad_(True)
    b = torch.randn(c, device="cuda", dtype=dtype, generator=gen).requires_grad_(True)
    if channel and op == "rms":  # the RMSNorm seed: no weight
        inputs = [x]
        fn = lambda: ops.rms_norm(x, None, None, 1e-5, dim=1)
    elif channel:
        inputs = [x, w, b]
        fn = lambda: ops.layer_norm(x, None, w, b, 1e-5, dim=1)
    elif op == "ln":
        inputs = [x, w, b]
        fn = lambda: ops.layer_norm(x, (c,), w, b, 1e-5)
    else:
        inputs = [x, w]
        fn = lambda: ops.rms_norm(x, (c,), w, 1e-5)
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
    p.add_argument("--impl", choices=("fastnorm", "compile"), default="fastnorm")
    p.add_argument("--ncu", action="store_true", help="one step a case between cudaProfilerStart/Stop, no timing")
    args = p.parse_args()
    if args.impl == "compile":
        ops = compiled_ops()
        print(f"== {args.label} torch.compile of the eager ops", flush=True)
    else:
        import fastnorm as ops
        print(f"== {args.label} fastnorm from {ops.__file__}", flush=True)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for text in args.cases.split(","):
        op, dtype, shape, channel = parse_case(text)
        torch.cuda.empty_cache()
        if args.impl == "compile":
            torch._dynamo.reset()  # a fresh static-shape graph per case, as fastnorm bench compiles each row
        step = make_step(ops, op, dtype, shape, channel)
        if args.ncu:
            profiled_call(step, warmups=3)
            del step
            continue
        dev = event_median(step, flush, idle_start=False)
        host = event_median(step, flush, idle_start=True)
        print(f"{args.label} {text}: step {dev:.1f} us device, {host:.1f} us idle start", flush=True)
        for us, count, name in kernel_table(step, flush):
            print(f"    {us:9.1f} us  x{count:g}  {name[:110]}", flush=True)
        del step
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
