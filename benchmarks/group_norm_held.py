"""GroupNorm on CUDA: the held chains against the lag chains they replace on sets of 2 MB and more, one process,
CUDA events, 5 interleaved rounds, medians, as % of a device-to-device copy timed in the same rounds.

    python benchmarks/group_norm_held.py             # forward: held_chain_kernel against FASTNORM_FAMILY_CHAIN_HOLD=0
    python benchmarks/group_norm_held.py --backward  # backward alone (autograd.grad of x, w, b): held, lag
                                                     # (FASTNORM_FAMILY_BWD_HOLD=0), plane kernels (..._BWD_CHAIN_KB=0)

The backward's % is of 1.5 copies (x and dy read, dx written). Sets under 2 MB take the lag chain under every
variant (their spread is run-to-run). Results: benchmarks/results/h100-family-ab.txt (session 33).
"""
import argparse
import os

import torch

CASES = [((112, 64, 512, 512), 8, torch.float32), ((112, 64, 512, 512), 8, torch.bfloat16),
         ((16, 128, 256, 256), 8, torch.float32), ((64, 32, 256, 256), 4, torch.float16),
         ((8, 512, 64, 64), 32, torch.bfloat16), ((4, 64, 256, 256), 16, torch.float32),
         ((2, 320, 128, 128), 32, torch.float32)]
SWITCHES = ("FASTNORM_FAMILY_CHAIN_HOLD", "FASTNORM_FAMILY_BWD_HOLD", "FASTNORM_FAMILY_BWD_CHAIN_KB")
FORWARD = {"held": {}, "lag": {"FASTNORM_FAMILY_CHAIN_HOLD": "0"}}
BACKWARD = {"held": {}, "lag": {"FASTNORM_FAMILY_BWD_HOLD": "0"}, "planes": {"FASTNORM_FAMILY_BWD_CHAIN_KB": "0"}}


def timed(fn, reps):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backward", action="store_true", help="time the backward alone")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("group_norm_held.py: needs a CUDA GPU")
    import fastnorm
    from fastnorm.ops import extension

    ext = extension.load("cuda")
    variants = BACKWARD if args.backward else FORWARD
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {'backward' if args.backward else 'forward'}")
    for shape, groups, dtype in CASES:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w = torch.randn(shape[1], device="cuda", dtype=dtype)
        b = torch.randn_like(w)
        copy_out = torch.empty_like(x)
        if args.backward:
            leaves = [t.clone().requires_grad_() for t in (x, w, b)]
            y = fastnorm.group_norm(leaves[0], groups, leaves[1], leaves[2])
            dy = torch.randn_like(y)
            call = lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)
        else:
            call = lambda: ext.group_norm_forward(x, w, b, groups, 1e-5)
        scale = 1.5 if args.backward else 1.0
        reps = max(3, min(50, int(2e9 // (2 * scale * x.numel() * x.element_size()))))
        times, copies = {v: [] for v in variants}, []
        for _ in range(5):
            copies.append(timed(lambda: copy_out.copy_(x), reps) * scale)
            for name, env in variants.items():
                for key in SWITCHES:
                    os.environ.pop(key, None)
                os.environ.update(env)
                call()
                times[name].append(timed(call, reps))
        for key in SWITCHES:
            os.environ.pop(key, None)
        copy = sorted(copies)[2]
        set_mb = x.numel() // (shape[0] * groups) * x.element_size() / 2**20
        line = f"{str(dtype)[6:]:8} {str(shape):22} g{groups:<3} set {set_mb:6.2f} MB  copy {copy:.4f} ms |"
        for name in variants:
            t = sorted(times[name])[2]
            line += f"  {name} {t:.4f} ms ({100 * copy / t:.1f}%)"
        print(line, flush=True)
        x = w = b = copy_out = call = None
        leaves = y = dy = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
