"""Fused residual add + norm (fastnorm.rms_norm / layer_norm with residual=): device time and % of copy
of (y, h) = (norm(x + r), x + r), with environment switches of the fused kernel timed in one process,
and torch.compile of the same function beside (--compile). Bytes: x and r read, h and y written.

usage: python benchmarks/residual_ab.py [--compile] [VARIANT ...]   (VARIANT: - or NAME=V[,NAME=V])
e.g.   python benchmarks/residual_ab.py --compile - FASTNORM_RESIDUAL_VECS=4
"""
import statistics
import sys

import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.harness.timing import time_callable
from fastnorm_dev.overrides import _apply, _parse_variant

CASES = [("RMS", torch.bfloat16, (16384, 4096), False), ("LN", torch.bfloat16, (16384, 4096), False),
         ("RMS", torch.bfloat16, (8192, 2048), False), ("RMS", torch.bfloat16, (8192, 5120), False),
         ("RMS", torch.bfloat16, (65536, 1024), False), ("RMS", torch.float32, (16384, 4096), False),
         ("LN", torch.float16, (4096, 8192), False), ("RMS", torch.bfloat16, (16384, 4096), True)]


def main(argv):
    do_compile = "--compile" in argv
    variants = [a for a in argv if a != "--compile"] or ["-"]
    envs = [_parse_variant(v) for v in variants]
    names = {k for e in envs for k in e}

    def apply(env):
        _apply(env, names)

    dev = torch.device("cuda")

    def t_us(fn):
        return time_callable(fn, device=dev, trials=30, include_host=False).median_ms * 1000

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_bw = 2 * src.numel() / (t_us(lambda: dst.copy_(src)) * 1e-6)
    del src, dst
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: copy {copy_bw / 1e9:.0f} GB/s; us (% of copy), "
          f"median of 3 rounds of 30; variants: {' | '.join(variants)}" + (" | compile" if do_compile else ""), flush=True)
    torch.manual_seed(0)
    for norm, dt, shape, fp32_residual in CASES:
        n = shape[-1]
        hdt = torch.float32 if fp32_residual else dt
        x = torch.randn(shape, device="cuda", dtype=dt)
        r = torch.randn(shape, device="cuda", dtype=hdt) + 3
        w = torch.rand(n, device="cuda", dtype=dt) + 0.5
        b = torch.randn(n, device="cuda", dtype=dt)
        if norm == "RMS":
            def ours():
                return fastnorm.rms_norm(x, (n,), w, 1e-6, residual=r, residual_in_fp32=fp32_residual)

            def eager(x, r, w, b):
                h = x.float() + r if fp32_residual else x + r
                return F.rms_norm(h.to(x.dtype), (n,), w, 1e-6), h
        else:
            def ours():
                return fastnorm.layer_norm(x, (n,), w, b, 1e-5, residual=r, residual_in_fp32=fp32_residual)

            def eager(x, r, w, b):
                h = x.float() + r if fp32_residual else x + r
                return F.layer_norm(h.to(x.dtype), (n,), w, b, 1e-5), h
        h64 = (x.double() + r.double()).to(hdt).double()
        y64 = (F.rms_norm(h64, (n,), w.double(), 1e-6) if norm == "RMS"
               else F.layer_norm(h64, (n,), w.double(), b.double(), 1e-5))
        moved = x.numel() * (2 * x.element_size() + 2 * torch.empty((), dtype=hdt).element_size())
        errs = []
        for env in envs:
            apply(env)
            y, h = ours()
            errs.append(max((y.double() - y64).abs().max().item() / y64.abs().max().item(),
                            (h.double() - h64).abs().max().item() / h64.abs().max().item()))
        fns = [(env, ours) for env in envs]
        if do_compile:
            torch._dynamo.reset()
            compiled = torch.compile(eager, dynamic=False)
            compiled(x, r, w, b)
            fns.append((None, lambda: compiled(x, r, w, b)))
        times = [[] for _ in fns]
        for _ in range(3):
            for i, (env, fn) in enumerate(fns):
                if env is not None:
                    apply(env)
                times[i].append(t_us(fn))
        med = [statistics.median(t) for t in times]
        label = f"{norm} {str(dt)[6:]} {'x'.join(map(str, shape))}{' h32' if fp32_residual else ''}"
        print(f"{label:26} " + " | ".join(f"{m:7.1f} ({moved / (m * 1e-6) / copy_bw * 100:4.1f}%)" for m in med)
              + f"   err {max(errs):.1e}", flush=True)
        del x, r, w, b, h64, y64
        torch.cuda.empty_cache()
    apply({})


if __name__ == "__main__":
    main(sys.argv[1:])
