"""Same-process A/B of planner or kernel switches read from environment variables at each call
(developer tool for a GPU run): for every shape, dtype and norm, the float64 error and the device
timing (% of copy bandwidth) of each variant, over alternating rounds.

Usage: python benchmarks/ab_env.py VARIANT [VARIANT ...] -- SHAPE [SHAPE ...]
  VARIANT: NAME=VALUE[,NAME=VALUE...] set for that variant ("-" for none: the default build)
  SHAPE: MxN (norm over the last dim) or AxCxHxW (over dim 1, the channels; error of the first 4 of A)
Example: python benchmarks/ab_env.py FASTNORM_X=0 FASTNORM_X=1 -- 1024x65536 256x262144
"""
import os
import sys

import torch

from fastnorm.ops import extension
from quick_timing import affine_params, bench, copy_bandwidth  # same folder: on sys.path when run as a script

ROUNDS = 3
REPS = int(os.environ.get("AB_REPS", "30"))


def parse(variant):
    if variant == "-":
        return {}
    return dict(item.split("=", 1) for item in variant.split(","))


def apply(env, names):
    for name in names:
        os.environ.pop(name, None)
    os.environ.update(env)


def main():
    if "--" not in sys.argv[1:] or sys.argv.index("--") == 1:
        sys.exit(__doc__)
    split = sys.argv.index("--")
    variants = sys.argv[1:split]
    shapes = [tuple(int(v) for v in a.split("x")) for a in sys.argv[split + 1:]]
    envs = [parse(v) for v in variants]
    names = {name for env in envs for name in env}
    ext = extension.load("cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    bw = copy_bandwidth(flush, reps=20)
    print(f"{torch.cuda.get_device_name()}: copy {bw / 1e9:.0f} GB/s; variants: {' | '.join(variants)}", flush=True)
    for dt in (torch.float32, torch.bfloat16):
        for shape in shapes:
            x = torch.randn(shape, device="cuda", dtype=dt) + 3
            n = shape[1] if len(shape) == 4 else shape[-1]
            dims = (1, 2) if len(shape) == 4 else (len(shape) - 1, len(shape))
            w, b = affine_params(n, dt)
            for rms in (False, True):
                def call():
                    return ext.norm_forward(x, w, None if rms else b, *dims, 1e-5, rms, 0, 0)
                part = x[:4].double()
                along = [1] if len(shape) == 4 else [-1]
                view = (1, n, 1, 1) if len(shape) == 4 else (n,)
                mean = 0 if rms else part.mean(dim=along, keepdim=True)
                var = ((part - mean) ** 2).mean(dim=along, keepdim=True)
                ref = (part - mean) / torch.sqrt(var + 1e-5) * w.double().view(view)
                if not rms:
                    ref = ref + b.double().view(view)
                errs = []
                for env in envs:
                    apply(env, names)
                    errs.append(((call()[:4].double() - ref).abs() / ref.abs().clamp(min=1)).max().item())
                del part, ref
                moved = x.numel() * x.element_size() * 2 + n * w.element_size() * (1 if rms else 2)
                pct = [[] for _ in envs]
                for _ in range(ROUNDS):
                    for i, env in enumerate(envs):
                        apply(env, names)
                        pct[i].append(moved / bench(call, flush, reps=REPS) / bw * 100)
                cells = [f"{' '.join(f'{p:.1f}' for p in pct[i])} (err {errs[i]:.0e})" for i in range(len(envs))]
                name = "x".join(map(str, shape)) + (" dim1" if len(shape) == 4 else "")
                print(f"{'RMS' if rms else 'LN':<4}{name} {str(dt)[6:]:<9}" + " | ".join(cells), flush=True)
            del x, w, b
            torch.cuda.empty_cache()
    apply({}, names)


if __name__ == "__main__":
    main()
