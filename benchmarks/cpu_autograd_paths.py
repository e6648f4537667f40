"""The eager CPU train step (forward + backward) of LayerNorm / RMSNorm by autograd path, in one process:
eager (F.layer_norm / F.rms_norm), fastnorm (the C++ CppNormFunction, recorded by the extension's
try_layer_norm / try_rms_norm), and the Python path it replaced (functional.py's checks, then
eager_autograd.NormFunction.apply). Weight and bias (RMSNorm: weight) all need gradients. Paths take
turns in rounds (a shared, noisy machine); each round keeps its fastest of `inner` steps; the median over
rounds is printed (us).

    PYTHONPATH=src python benchmarks/cpu_autograd_paths.py [--threads 1] [--rounds 11] [--inner 20]
"""
import argparse

import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.ops.direct import direct_call_ok
from fastnorm.ops.eager_autograd import NormFunction, function_call_ok
from fastnorm.ops.validate import check_affine, norm_dims

from cpu_train_step import bench  # the same rounds of fastest-of-inner calls (benchmarks/ is on the path)

SHAPES = [(32, 1024, torch.float32), (32, 1024, torch.bfloat16), (256, 1024, torch.float32),
          (256, 1024, torch.bfloat16), (2048, 1024, torch.float32), (2048, 1024, torch.bfloat16)]


def python_path(x, shape, weight, bias, eps, rms):
    """The former path of a plain call that records autograd (less the C++ entry's declining call)."""
    op = "rms_norm" if rms else "layer_norm"
    begin, end = norm_dims(x, shape, None, op)
    params = (weight,) if rms else (weight, bias)
    check_affine(x, begin, end, op, **dict(zip(("weight", "bias"), params)))
    assert not direct_call_ok(x, *params) and function_call_ok(x, *params)
    return NormFunction.apply(x, weight, bias, begin, end, float(eps), rms)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--inner", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"threads {args.threads}; us, median of {args.rounds} rounds of the fastest of {args.inner}")
    print(f"{'shape':18s} {'LN eager':>9s} {'fastnorm':>9s} {'python':>9s} {'ratio':>6s} | "
          f"{'RMS eager':>9s} {'fastnorm':>9s} {'python':>9s} {'ratio':>6s}   (ratio: fastnorm / eager)")
    for m, n, dt in SHAPES:
        torch.manual_seed(0)
        x = torch.randn(m, n, dtype=dt, requires_grad=True)
        w = torch.randn(n, dtype=dt, requires_grad=True)
        b = torch.randn(n, dtype=dt, requires_grad=True)
        dy = torch.randn(m, n, dtype=dt)
        assert "CppNormFunction" in fastnorm.layer_norm(x, (n,), w, b).grad_fn.name()

        def step(fn):
            def run():
                torch.autograd.backward(fn(), dy)
                x.grad = w.grad = b.grad = None
            return run

        fns = {
            "ln_eager": step(lambda: F.layer_norm(x, (n,), w, b, 1e-5)),
            "ln_fn": step(lambda: fastnorm.layer_norm(x, (n,), w, b, 1e-5)),
            "ln_py": step(lambda: python_path(x, (n,), w, b, 1e-5, False)),
            "rms_eager": step(lambda: F.rms_norm(x, (n,), w, 1e-6)),
            "rms_fn": step(lambda: fastnorm.rms_norm(x, (n,), w, 1e-6)),
            "rms_py": step(lambda: python_path(x, (n,), w, None, 1e-6, True)),
        }
        r = bench(fns, args.rounds, args.inner)
        name = f"{m}x{n} {str(dt).replace('torch.', '')}"
        print(f"{name:18s} {r['ln_eager']:9.1f} {r['ln_fn']:9.1f} {r['ln_py']:9.1f} {r['ln_fn'] / r['ln_eager']:6.2f} | "
              f"{r['rms_eager']:9.1f} {r['rms_fn']:9.1f} {r['rms_py']:9.1f} {r['rms_fn'] / r['rms_eager']:6.2f}",
              flush=True)


if __name__ == "__main__":
    main()
