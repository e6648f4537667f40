"""Same-process A/B of environment switches that the kernels read at each call, on sweep-style rows:
device time (L2 flushed) of each variant in interleaved rounds, torch.compile beside, float64 error.

    python3 benchmarks/env_ab.py VARIANT [VARIANT ...] -- ROW [ROW ...]

VARIANT: NAME=VALUE[,NAME=VALUE...], or - for none (the defaults). ROW: a sweep label such as
"LN fp32 36x3378 off3" or "RMS bf16 1000000x1" (last-dim rows; offN / padN as in `fastnorm bench`).
AB_ROUNDS (3) and AB_TRIALS (30) set the rounds and the timed calls a round. On a CUDA machine, fastnorm
importable.
"""
import os
import statistics
import sys

import torch

from fastnorm.bench.cases import DTYPES, OP_SHORT, BenchCase, eager_fn, fastnorm_fn, make_inputs
from fastnorm.harness.timing import time_callable

OPS = {short: op for op, short in OP_SHORT.items()}


def parse_row(label: str) -> BenchCase:
    words = label.split()
    op, dtype, shape = OPS[words[0]], words[1], tuple(int(s) for s in words[2].split("x"))
    layout = {w[:3]: int(w[3:]) for w in words[3:]}
    if dtype not in DTYPES or set(layout) - {"off", "pad"}:
        raise SystemExit(f"env_ab.py: cannot read the row {label!r}")
    return BenchCase("ab", op, dtype, shape, (len(shape) - 1,), True, offset=layout.get("off", 0),
                     pad=layout.get("pad", 0))


def parse_variant(text: str) -> dict:
    return {} if text == "-" else dict(item.split("=", 1) for item in text.split(","))


def apply(env: dict, names: set) -> None:
    for name in names:
        os.environ.pop(name, None)
    os.environ.update(env)


def main(argv) -> int:
    if "--" not in argv:
        raise SystemExit(__doc__)
    split = argv.index("--")
    variants, rows = [parse_variant(v) for v in argv[:split]], [parse_row(r) for r in argv[split + 1:]]
    names = {name for env in variants for name in env}
    rounds, trials = int(os.environ.get("AB_ROUNDS", "3")), int(os.environ.get("AB_TRIALS", "30"))
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: us, median of {rounds} rounds of {trials} "
          f"calls; variants: {' | '.join(argv[:split])} | compile", flush=True)
    for case in rows:
        x, w, b = make_inputs(case, dev)
        ours, ref = fastnorm_fn(case), eager_fn(case)
        exact = ref(x.double(), None if w is None else w.double(), None if b is None else b.double())
        scale = exact.abs().max().item()
        torch._dynamo.reset()  # each row its own compiled function: no recompile limit
        compiled = torch.compile(ref, dynamic=False)
        compiled(x, w, b)
        errs = []
        for env in variants:
            apply(env, names)
            errs.append((ours(x, w, b).double() - exact).abs().max().item() / scale)
        times = [[] for _ in range(len(variants) + 1)]
        for _ in range(rounds):
            for i, env in enumerate(variants):
                apply(env, names)
                times[i].append(time_callable(lambda: ours(x, w, b), device=dev, trials=trials,
                                              include_host=False).median_ms * 1000)
            times[-1].append(time_callable(lambda: compiled(x, w, b), device=dev, trials=trials,
                                           include_host=False).median_ms * 1000)
        med = [statistics.median(t) for t in times]
        cells = "  ".join(f"{m:7.2f}" for m in med)
        ratios = "  ".join(f"{med[-1] / m:.2f}x" for m in med[:-1])
        print(f"{case.label:34} {cells}   vs compile {ratios}   err {max(errs):.1e}", flush=True)
        del x, w, b, exact
    apply({}, names)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
