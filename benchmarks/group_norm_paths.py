"""GroupNorm on CUDA: the chained kernels against the paths they replace, same process, CUDA events, median
of 3 rounds. Forward: family_chain_kernel.cuh (sets of 256 KB - 16 MB) against the multi-kernel path
(FASTNORM_FAMILY_CHAIN_KB=0). --backward: the backward alone (autograd.grad of x, weight and bias) with
family_backward.cuh's chain_backward_kernel (sets of 256 KB - 16 MB of x and dy) against the plane kernels
(FASTNORM_FAMILY_BWD_CHAIN_KB=0).

    python benchmarks/group_norm_paths.py [--backward]

Rows whose sets take the block-a-set path (1 MB or less, sets for 3/4 of the SMs) time the same path twice.
Results: benchmarks/results/h100-family-ab.txt (session 28).
"""
import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fastnorm_dev.measure import events_ms, group_norm_call  # noqa: E402

CASES = [((112, 64, 512, 512), 8, torch.float32), ((112, 64, 512, 512), 8, torch.bfloat16),
         ((16, 128, 256, 256), 8, torch.float32), ((32, 256, 128, 128), 32, torch.bfloat16),
         ((8, 512, 64, 64), 8, torch.float32), ((4, 64, 256, 256), 16, torch.float32),
         ((64, 32, 256, 256), 4, torch.float16), ((2, 320, 128, 128), 32, torch.float32)]


def median_ms(fn, reps=20):
    for _ in range(3):
        fn()
    return sorted(events_ms(fn, reps) for _ in range(3))[1]


def with_chain(on, fn, switch="FASTNORM_FAMILY_CHAIN_KB"):
    if on:
        os.environ.pop(switch, None)
    else:
        os.environ[switch] = "0"
    return median_ms(fn)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backward", action="store_true", help="time the backward's chain instead")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("group_norm_paths.py: needs a CUDA GPU")
    switch = "FASTNORM_FAMILY_BWD_CHAIN_KB" if args.backward else "FASTNORM_FAMILY_CHAIN_KB"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {'backward' if args.backward else 'forward'}")
    for shape, groups, dtype in CASES:
        call, x = group_norm_call(shape, groups, dtype, args.backward)
        first = with_chain(True, call, switch)
        multi = with_chain(False, call, switch)
        chain = min(first, with_chain(True, call, switch))  # the chain before and after the path it replaces
        set_mb = x.numel() // (shape[0] * groups) * x.element_size() / 2**20
        print(f"{str(dtype)[6:]:8} {str(shape):22} g{groups:<3} set {set_mb:6.2f} MB  chain {chain:.4f} ms  "
              f"multi {multi:.4f} ms  ratio {multi / chain:.3f}", flush=True)
        x = call = None  # free this shape's tensors before the next


if __name__ == "__main__":
    main()
