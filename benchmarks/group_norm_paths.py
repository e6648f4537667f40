"""GroupNorm forward on CUDA: the chained kernel (family_chain_kernel.cuh, the default for sets of 256 KB - 16 MB)
against the multi-kernel path (FASTNORM_FAMILY_CHAIN_KB=0), same process, CUDA events, median of 3 rounds.

    python benchmarks/group_norm_paths.py

Rows whose sets take the block-a-set path (1 MB or less, sets for 3/4 of the SMs) time the same path twice.
Results: benchmarks/results/h100-family-ab.txt (session 28).
"""
import os

import torch

from fastnorm.ops import extension

CASES = [((112, 64, 512, 512), 8, torch.float32), ((112, 64, 512, 512), 8, torch.bfloat16),
         ((16, 128, 256, 256), 8, torch.float32), ((32, 256, 128, 128), 32, torch.bfloat16),
         ((8, 512, 64, 64), 8, torch.float32), ((4, 64, 256, 256), 16, torch.float32),
         ((64, 32, 256, 256), 4, torch.float16), ((2, 320, 128, 128), 32, torch.float32)]


def median_ms(fn, reps=20):
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    rounds = []
    for _ in range(3):
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        rounds.append(start.elapsed_time(end) / reps)
    return sorted(rounds)[1]


def with_chain(on, fn):
    if on:
        os.environ.pop("FASTNORM_FAMILY_CHAIN_KB", None)
    else:
        os.environ["FASTNORM_FAMILY_CHAIN_KB"] = "0"
    return median_ms(fn)


def main():
    if not torch.cuda.is_available():
        raise SystemExit("group_norm_paths.py: needs a CUDA GPU")
    ext = extension.load("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for shape, groups, dtype in CASES:
        x = torch.randn(shape, device="cuda", dtype=dtype)
        w = torch.randn(shape[1], device="cuda", dtype=dtype)
        b = torch.randn_like(w)
        call = lambda: ext.group_norm_forward(x, w, b, groups, 1e-5)
        first = with_chain(True, call)
        multi = with_chain(False, call)
        chain = min(first, with_chain(True, call))  # the chain before and after the multi-kernel path
        set_mb = x.numel() // (shape[0] * groups) * x.element_size() / 2**20
        print(f"{str(dtype)[6:]:8} {str(shape):22} g{groups:<3} set {set_mb:6.2f} MB  chain {chain:.4f} ms  "
              f"multi {multi:.4f} ms  ratio {multi / chain:.3f}", flush=True)
        del x


if __name__ == "__main__":
    main()
