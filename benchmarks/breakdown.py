"""Where the time of a call goes (developer tool for a GPU run): for each last-dim shape, the median
CUDA-event time with the host path counted (synchronize after the L2 flush, as `fastnorm bench` does)
and with it hidden behind the flush (no synchronize: close to kernel time), for fastnorm, eager and
a device-to-device copy of the same bytes. Also host microseconds per call on a tiny tensor.

Usage: python benchmarks/breakdown.py [--dtype fp32|bf16] [--shapes 16384x4096,...]
"""
import argparse
import time

import torch
import torch.nn.functional as F

import fastnorm

SHAPES = "16384x4096,4096x16384,65536x1024,1024x65536,256x262144,16x4194304,1x4096,32x4096"


def timed(fn, flush, sync, reps=40):
    for _ in range(3):
        fn()
    out = []
    for _ in range(reps):
        flush.add_(1)
        if sync:
            torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) * 1e3)
    out.sort()
    return out[len(out) // 2]


def host_us(fn, n=3000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    dt = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="fp32,bf16")
    ap.add_argument("--shapes", default=SHAPES)
    args = ap.parse_args()
    flush = torch.empty(64 << 20, dtype=torch.int32, device="cuda")
    src = torch.empty(1 << 28, dtype=torch.int32, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    copy_us = timed(lambda: dst.copy_(src), flush, sync=False)
    bw = 2 * src.numel() * 4 / (copy_us * 1e-6)
    del src, dst
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e9:.0f} GB/s", flush=True)
    x = torch.randn(4, 64, device="cuda")
    w, b = torch.rand(64, device="cuda"), torch.randn(64, device="cuda")
    print(f"host us/call (4x64 fp32, no sync): F.layer_norm {host_us(lambda: F.layer_norm(x, (64,), w, b)):.1f}"
          f"  fastnorm.layer_norm {host_us(lambda: fastnorm.layer_norm(x, (64,), w, b)):.1f}"
          f"  F.rms_norm {host_us(lambda: F.rms_norm(x, (64,), w, 1e-5)):.1f}"
          f"  fastnorm.rms_norm {host_us(lambda: fastnorm.rms_norm(x, (64,), w, 1e-5)):.1f}", flush=True)
    print(f"{'op':<4}{'dtype':<6}{'shape':<12}{'ours sync':>10}{'nosync':>8}{'%copy':>7}{'%copy ns':>9}"
          f"{'eager sync':>11}{'nosync':>8}{'copy ns':>8}")
    for dname in args.dtype.split(","):
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dname]
        for shape in args.shapes.split(","):
            m, n = map(int, shape.split("x"))
            torch.cuda.empty_cache()
            x = torch.randn(m, n, device="cuda", dtype=dt)
            w = (torch.rand(n, device="cuda") + 0.5).to(dt)
            b = torch.randn(n, device="cuda").to(dt)
            xs, ys = x.view(-1).clone(), torch.empty_like(x).view(-1)
            cp = timed(lambda: ys.copy_(xs), flush, sync=False)
            del xs, ys
            for op in ("LN", "RMS"):
                if op == "LN":
                    ours = lambda: fastnorm.layer_norm(x, (n,), w, b, 1e-5)
                    eager = lambda: F.layer_norm(x, (n,), w, b, 1e-5)
                    nbytes = (2 * m * n + 2 * n) * x.element_size()
                else:
                    ours = lambda: fastnorm.rms_norm(x, (n,), w, 1e-5)
                    eager = lambda: F.rms_norm(x, (n,), w, 1e-5)
                    nbytes = (2 * m * n + n) * x.element_size()
                err = (ours().float() - eager().float()).abs().max().item()
                o_s, o_n = timed(ours, flush, True), timed(ours, flush, False)
                e_s, e_n = timed(eager, flush, True), timed(eager, flush, False)
                pc = lambda t: 100 * nbytes / (t * 1e-6) / bw
                print(f"{op:<4}{dname:<6}{shape:<12}{o_s:10.1f}{o_n:8.1f}{pc(o_s):7.1f}{pc(o_n):9.1f}"
                      f"{e_s:11.1f}{e_n:8.1f}{cp:8.1f}  err {err:.1e}", flush=True)
            del x, w, b


if __name__ == "__main__":
    main()
