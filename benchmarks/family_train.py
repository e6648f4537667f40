"""Forward + backward of the family's affine norms (GroupNorm, GroupNorm + SiLU, InstanceNorm, BatchNorm) in
one process: fastnorm as it runs, fastnorm without the set path (FASTNORM_FAMILY_SET_KB=0: the
multi-kernel forward and backward), fastnorm with the torch-op backward the fused kernels replaced, PyTorch
eager and torch.compile of the eager code. Device timing (L2 flushed, host work overlapped), medians.

    python3 benchmarks/family_train.py                    # the default cases
    python3 benchmarks/family_train.py --case gn_silu_8x512x64x64 --dtype bf16 --trials 50

% of copy counts the least a step moves: the forward reads x and writes y, the backward reads x and dy and
writes dx (5 x the tensor's bytes), against a device-to-device copy timed in the same run.
"""
import argparse
import os

import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.harness.timing import copy_bandwidth, time_callable
from fastnorm.ops import family_ops

# name -> (shape, fastnorm call, eager call); calls take (x, weight, bias)
CASES = {
    "gn_silu_8x512x64x64": ((8, 512, 64, 64), lambda x, w, b: fastnorm.group_norm(x, 32, w, b, 1e-6, activation="silu"),
                            lambda x, w, b: F.silu(F.group_norm(x, 32, w, b, 1e-6))),
    "gn_8x512x64x64": ((8, 512, 64, 64), lambda x, w, b: fastnorm.group_norm(x, 32, w, b),
                       lambda x, w, b: F.group_norm(x, 32, w, b)),
    "gn_silu_4x256x128x128": ((4, 256, 128, 128),
                              lambda x, w, b: fastnorm.group_norm(x, 32, w, b, 1e-6, activation="silu"),
                              lambda x, w, b: F.silu(F.group_norm(x, 32, w, b, 1e-6))),
    "gn_112x64x512x512": ((112, 64, 512, 512), lambda x, w, b: fastnorm.group_norm(x, 8, w, b),
                          lambda x, w, b: F.group_norm(x, 8, w, b)),  # KernelBench 35's shape
    "in_16x64x256x256": ((16, 64, 256, 256), lambda x, w, b: fastnorm.instance_norm(x, weight=w, bias=b),
                         lambda x, w, b: F.instance_norm(x, weight=w, bias=b)),
    "bn_64x64x512x512": ((64, 64, 512, 512), lambda x, w, b: fastnorm.batch_norm(x, None, None, w, b, True),
                         lambda x, w, b: F.batch_norm(x, None, None, w, b, True)),  # KernelBench 33's shape
    "bn_32x256x56x56": ((32, 256, 56, 56), lambda x, w, b: fastnorm.batch_norm(x, None, None, w, b, True),
                        lambda x, w, b: F.batch_norm(x, None, None, w, b, True)),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_op_backward(enabled: bool):
    """Switches fastnorm's family backward to the torch-op version (what the kernels replaced)."""
    kernel = torch_op_backward.kernel = getattr(torch_op_backward, "kernel", family_ops._affine_norm_backward_kernel)
    family_ops._affine_norm_backward_kernel = (lambda *a: None) if enabled else kernel


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", action="append", choices=list(CASES))
    p.add_argument("--dtype", action="append", choices=list(DTYPES))
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--no-compile", dest="use_compile", action="store_false")
    args = p.parse_args(argv)
    device = torch.device("cuda")
    copy_bw = copy_bandwidth(device, 1 << 30, include_host=False)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy {copy_bw / 1e9:.0f} GB/s; device timing; "
          f"forward + backward (autograd.grad of x, weight, bias); ms, median of {args.trials}")
    print(f"{'case':24} {'dtype':5} {'fastnorm':>9} {'no sets':>8} {'torch-op bwd':>12} {'eager':>8} {'compile':>8} "
          f"{'vs eager':>8} {'vs compile':>10} {'% copy':>6}")
    for name in args.case or ["gn_silu_8x512x64x64", "gn_8x512x64x64", "gn_112x64x512x512", "in_16x64x256x256",
                              "bn_64x64x512x512", "bn_32x256x56x56"]:
        shape, ours, eager = CASES[name]
        for dname in args.dtype or (["bf16", "fp32"] if shape[0] * shape[1] * shape[2] * shape[3] < 2 ** 30 else ["fp32"]):
            dtype = DTYPES[dname]
            torch.manual_seed(0)
            x = torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
            w = (torch.rand(shape[1], device=device) + 0.5).to(dtype).requires_grad_()
            b = torch.randn(shape[1], device=device).to(dtype).requires_grad_()
            dy = torch.randn(shape, device=device, dtype=dtype)

            def step(fn):
                return lambda: torch.autograd.grad(fn(x, w, b), (x, w, b), dy)

            def ms(fn):
                try:
                    return time_callable(step(fn), device=device, trials=args.trials, include_host=False).median_ms
                except torch.OutOfMemoryError:  # the torch-op backward's float32 temporaries at 7.5 GB inputs
                    torch.cuda.empty_cache()
                    return float("nan")

            t = {"fastnorm": ms(ours), "eager": ms(eager)}
            knob = os.environ.get("FASTNORM_FAMILY_SET_KB")
            os.environ["FASTNORM_FAMILY_SET_KB"] = "0"
            t["no sets"] = ms(ours)
            if knob is None:
                del os.environ["FASTNORM_FAMILY_SET_KB"]
            else:
                os.environ["FASTNORM_FAMILY_SET_KB"] = knob
            torch_op_backward(True)
            t["torch-op"] = ms(ours)
            torch_op_backward(False)
            t["compile"] = ms(torch.compile(eager)) if args.use_compile else None
            pct = 100 * 5 * x.numel() * x.element_size() / (t["fastnorm"] * 1e-3) / copy_bw
            vs_c = f"{t['compile'] / t['fastnorm']:.2f}x" if t["compile"] else "-"
            print(f"{name:24} {dname:5} {t['fastnorm']:9.3f} {t['no sets']:8.3f} {t['torch-op']:12.3f} {t['eager']:8.3f} "
                  f"{t['compile'] or float('nan'):8.3f} {t['eager'] / t['fastnorm']:7.2f}x {vs_c:>10} {pct:6.0f}",
                  flush=True)
            del x, w, b, dy
            torch.cuda.empty_cache()
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
