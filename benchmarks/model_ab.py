"""The model suite's Llama under several `fastnorm.patch` options in one process, and where a training
step's GPU time goes (torch.profiler, kernels grouped by kind).

    python3 benchmarks/model_ab.py                         # unpatched, old patches, the default x 2 compile modes
    python3 benchmarks/model_ab.py --profile --no-compile  # plus the kernel breakdown of each eager step

Options per variant: `fuse_residual`, `fuse_loss` and `under_compile` of fastnorm.patch. Same model config, inputs
and timing (median of synchronized wall-clock calls) as `fastnorm bench --suite model`.
"""
import argparse
import collections
import json

import torch

import fastnorm
from fastnorm.bench import model_suite

VARIANTS = {
    "pytorch": None,
    "norms only": dict(fuse_residual=False, fuse_loss=False, under_compile="kernels"),  # patch before residual fusion
    "fused, kernels": dict(fuse_residual=True, fuse_loss=False, under_compile="kernels"),
    "fused, inductor": dict(fuse_residual=True, fuse_loss=False, under_compile="inductor"),  # the patch before the loss
    "loss, kernels": dict(under_compile="kernels"),  # the loss too, fastnorm's ops under compile
    "loss, inductor": dict(under_compile="inductor"),  # the default
}
KINDS = [  # (kind, substrings of kernel names), first match wins
    ("fastnorm loss", ("fastnorm::loss::",)),
    ("fastnorm norms", ("fastnorm::",)),  # every kernel of ours lives in namespace fastnorm
    ("matmul", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "splitK")),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("triton (inductor)", ("triton",)),
    ("softmax / loss", ("softmax", "nll", "cross_entropy", "log_softmax")),
    ("reduce", ("reduce_kernel",)),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "CatArray", "copy")),
]


def kernel_kind(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k.lower() in low for k in keys):
            return kind
    return "other"


def breakdown(train, steps: int = 3):
    """Microseconds of GPU kernel time per step, by kind, and the 8 longest kernels."""
    from torch.profiler import ProfilerActivity, profile

    train()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            train()
        torch.cuda.synchronize()
    kinds, names = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            us = event.device_time / steps
            kinds[kernel_kind(event.name)] += us
            names[event.name[:90]] += us
    return dict(kinds.most_common()), names.most_common(8)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--profile", action="store_true", help="kernel time by kind of each eager training step")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    device = "cuda"
    cfg = model_suite.CONFIGS[device]
    tokens = cfg["batch"] * cfg["seq"]
    ids = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq"]), device=device)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, transformers "
          f"{__import__('transformers').__version__}, config {cfg}")
    rows = []
    for variant in args.variants:
        model = model_suite._llama(device, cfg)
        if VARIANTS[variant] is not None:
            report = fastnorm.patch(model, **VARIANTS[variant])
            print(f"{variant}: {len(report.replaced)} replaced, {len(report.skipped)} left "
                  f"{[s.reason for s in report.skipped][:2]}")
        modes = [("eager", model)] + ([] if args.no_compile else [("compile", torch.compile(model))])
        for mode, m in modes:
            def forward():
                with torch.no_grad():
                    m(input_ids=ids)

            def train():
                m(input_ids=ids, labels=ids).loss.backward()

            for step, fn in (("forward", forward), ("train", train)):
                ms = model_suite._time_interleaved({step: fn}, device, args.reps)[step]
                rows.append(dict(variant=variant, mode=mode, step=step, ms=ms, tokens_per_s=tokens / ms * 1e3))
                print(f"  {variant:<16} {mode:<8} {step:<8} {ms:8.2f} ms")
            if args.profile and mode == "eager":
                kinds, top = breakdown(train)
                total = sum(kinds.values())
                print(f"  {variant}: GPU kernel time a training step {total / 1e3:.2f} ms: " +
                      ", ".join(f"{k} {v / 1e3:.2f}" for k, v in kinds.items()))
                for name, us in top:
                    print(f"      {us / 1e3:7.3f} ms  {name}")
                rows.append(dict(variant=variant, mode="eager", step="profile", kinds_us=kinds))
            m.zero_grad(set_to_none=True)
        del model, modes
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    base = {(r["mode"], r["step"]): r["ms"] for r in rows if r["variant"] == "pytorch" and "ms" in r}
    print("\nvariant           mode     step         ms   vs pytorch (same mode)")
    for r in rows:
        if "ms" in r:
            ref = base.get((r["mode"], r["step"]))
            print(f"{r['variant']:<17} {r['mode']:<8} {r['step']:<8} {r['ms']:8.2f}   "
                  + (f"{ref / r['ms']:.3f}x" if ref else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__, config=cfg, rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
