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
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fastnorm_dev.measure import events_ms, group_norm_call  # noqa: E402

CASES = [((112, 64, 512, 512), 8, torch.float32), ((112, 64, 512, 512), 8, torch.bfloat16),
         ((16, 128, 256, 256), 8, torch.float32), ((64, 32, 256, 256), 4, torch.float16),
         ((8, 512, 64, 64), 32, torch.bfloat16), ((4, 64, 256, 256), 16, torch.float32),
         ((2, 320, 128, 128), 32, torch.float32)]
SWITCHES = ("FASTNORM_FAMILY_CHAIN_HOLD", "FASTNORM_FAMILY_BWD_HOLD", "FASTNORM_FAMILY_BWD_CHAIN_KB")
FORWARD = {"held": {}, "lag": {"FASTNORM_FAMILY_CHAIN_HOLD": "0"}}
BACKWARD = {"held": {}, "lag": {"FASTNORM_FAMILY_BWD_HOLD": "0"}, "planes": {"FASTNORM_FAMILY_BWD_CHAIN_KB": "0"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backward", action="store_true", help="time the backward alone")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("group_norm_held.py: needs a CUDA GPU")
    variants = BACKWARD if args.backward else FORWARD
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {'backward' if args.backward else 'forward'}")
    for shape, groups, dtype in CASES:
        call, x = group_norm_call(shape, groups, dtype, args.backward)
        copy_out = torch.empty_like(x)
        scale = 1.5 if args.backward else 1.0
        reps = max(3, min(50, int(2e9 // (2 * scale * x.numel() * x.element_size()))))
        times, copies = {v: [] for v in variants}, []
        for _ in range(5):
            copies.append(events_ms(lambda: copy_out.copy_(x), reps) * scale)
            for name, env in variants.items():
                for key in SWITCHES:
                    os.environ.pop(key, None)
                os.environ.update(env)
                call()
                times[name].append(events_ms(call, reps))
        for key in SWITCHES:
            os.environ.pop(key, None)
        copy = sorted(copies)[2]
        set_mb = x.numel() // (shape[0] * groups) * x.element_size() / 2**20
        line = f"{str(dtype)[6:]:8} {str(shape):22} g{groups:<3} set {set_mb:6.2f} MB  copy {copy:.4f} ms |"
        for name in variants:
            t = sorted(times[name])[2]
            line += f"  {name} {t:.4f} ms ({100 * copy / t:.1f}%)"
        print(line, flush=True)
        x = copy_out = call = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
