"""Quick timing of fastnorm vs PyTorch eager / torch.compile on key shapes (developer tool for a GPU run).

Usage: python benchmarks/quick_timing.py [--no-compile]
"""
import sys

import torch
import torch.nn.functional as F

import fastnorm


def bench(fn, flush, reps=30):
    times = []
    for _ in range(3):
        fn()
    for _ in range(reps):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    times.sort()
    return times[len(times) // 2] * 1e-3


def copy_bandwidth(flush, reps=30):
    """Bytes read + written per second by a 1 GiB device-to-device copy (random bytes)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    return 2 * src.numel() / bench(lambda: dst.copy_(src), flush, reps)


def affine_params(shape, dtype):
    """Weight in [0.5, 1.5) and a standard-normal bias of `shape` on the GPU (the developer tools' parameters)."""
    return (torch.rand(shape, device="cuda", dtype=dtype) + 0.5, torch.randn(shape, device="cuda", dtype=dtype))


def torch_norm(x, w, b, rms, compiled=False, eps=1e-5):
    """PyTorch's norm over the last dim of x (F.rms_norm, or F.layer_norm with bias b) as a call with no
    arguments; compiled: torch.compile of it, from a fresh dynamo cache."""
    fn = F.rms_norm if rms else F.layer_norm
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn)
    args = (x, (x.shape[-1],), w, eps) if rms else (x, (x.shape[-1],), w, b, eps)
    return lambda: fn(*args)


def channel_rms_ref(x, eps=1e-5):
    """The channel RMSNorm seed in PyTorch ops: over dim 1, float32 accumulation, no weight."""
    xf = x.float()
    return (xf / torch.sqrt(torch.mean(xf ** 2, dim=1, keepdim=True) + eps)).to(x.dtype)


def main():
    use_compile = "--no-compile" not in sys.argv
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    bw = copy_bandwidth(flush)
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e9:.0f} GB/s", flush=True)

    cases = []
    for dt in (torch.float32, torch.bfloat16):
        cases.append(("LN seed", (16, 64, 256, 256), dt, "ln3"))
        cases.append(("RMS seed", (112, 64, 512, 512), dt, "rmsc"))
        for m, n in [(16384, 4096), (4096, 16384), (65536, 1024), (1024, 65536), (256, 262144), (16, 4194304),
                     (1, 4096), (32, 4096)]:
            cases.append((f"LN {m}x{n}", (m, n), dt, "ln1"))
            cases.append((f"RMS {m}x{n}", (m, n), dt, "rms1"))
    print(f"{'case':<22}{'dtype':<10}{'fastnorm us':>12}{'%copy':>7}{'eager us':>10}{'compile us':>11}{'err':>10}",
          flush=True)
    for name, shape, dt, kind in cases:
        torch.cuda.empty_cache()
        x = torch.randn(shape, device="cuda", dtype=dt)
        if kind == "ln3":
            w, b = affine_params(shape[1:], dt)
            ours = lambda: fastnorm.layer_norm(x, shape[1:], w, b, 1e-5)
            eager = lambda: F.layer_norm(x, shape[1:], w, b, 1e-5)
            nbytes = 2 * x.numel() * x.element_size() + 2 * w.numel() * w.element_size()
        elif kind == "rmsc":
            ours = lambda: fastnorm.rms_norm(x, None, None, 1e-5, dim=1)
            eager = lambda: channel_rms_ref(x)
            nbytes = 2 * x.numel() * x.element_size()
        elif kind == "ln1":
            w, b = affine_params(shape[-1], dt)
            ours = lambda: fastnorm.layer_norm(x, shape[-1:], w, b, 1e-5)
            eager = lambda: F.layer_norm(x, shape[-1:], w, b, 1e-5)
            nbytes = 2 * x.numel() * x.element_size() + 2 * w.numel() * w.element_size()
        else:
            w = torch.rand(shape[-1], device="cuda", dtype=dt) + 0.5
            ours = lambda: fastnorm.rms_norm(x, shape[-1:], w, 1e-5)
            eager = lambda: F.rms_norm(x, shape[-1:], w, 1e-5)
            nbytes = 2 * x.numel() * x.element_size() + w.numel() * w.element_size()
        try:
            ref = eager()
            err = (ours().float() - ref.float()).abs().max().item()
            del ref
            t_ours = bench(ours, flush)
            t_eager = bench(eager, flush, reps=10)
            t_comp = float("nan")
            if use_compile:
                torch._dynamo.reset()
                comp = torch.compile(eager)
                t_comp = bench(comp, flush, reps=10)
            print(f"{name:<22}{str(dt)[6:]:<10}{t_ours * 1e6:>12.1f}{100 * nbytes / t_ours / bw:>7.1f}"
                  f"{t_eager * 1e6:>10.1f}{t_comp * 1e6:>11.1f}{err:>10.2e}", flush=True)
        except torch.OutOfMemoryError:
            print(f"{name:<22}{str(dt)[6:]:<10} skipped: out of memory", flush=True)
        del x
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
