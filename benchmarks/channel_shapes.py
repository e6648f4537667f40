"""Channel-axis shapes (dim 1 of NCHW) of issue 27: the sweep's slowest channel rows and ConvNeXt's
channels-first LayerNorm, fastnorm against PyTorch eager and torch.compile; device time with the L2 flushed,
% of a device copy. Run on the GPU machine:
    python benchmarks/channel_shapes.py [--alt VAR=VALUE] [--no-compile]
The "alt" column times fastnorm again with VAR=VALUE set (default FASTNORM_CHANNEL_COLUMN_MAX=0: the
channel tiles, as before the column kernel, for the calls of 16 channels or fewer). Run it under two
builds (PYTHONPATH) to compare them: the labels match line for line.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fastnorm_dev.measure import AltRun, device_time  # noqa: E402

# (op, dtype, shape, offset, pad): the normalized dim is 1.
CASES = [
    # the sweep's channel rows below 0.97x of the best (h100-sweep-*.txt)
    ("rms_norm", "bf16", (8, 113, 31, 33), 0, 0), ("rms_norm", "bf16", (36, 72, 31, 33), 0, 0),
    ("layer_norm", "bf16", (256, 616, 7, 7), 2, 0), ("layer_norm", "bf16", (25, 692, 56, 56), 3, 0),
    ("layer_norm", "bf16", (27, 577, 13, 17), 2, 0), ("layer_norm", "bf16", (256, 10, 28, 28), 0, 0),
    ("rms_norm", "bf16", (256, 76, 32, 32), 0, 0), ("layer_norm", "bf16", (2, 216, 64, 64), 0, 1),
    ("layer_norm", "fp32", (256, 3, 56, 56), 0, 0), ("rms_norm", "fp32", (256, 3, 14, 14), 0, 0),
    ("rms_norm", "fp32", (34, 256, 128, 128), 0, 0),
    ("layer_norm", "fp16", (2, 701, 14, 14), 0, 0), ("layer_norm", "fp16", (48, 76, 13, 17), 0, 0),
    ("layer_norm", "fp16", (14, 8, 512, 512), 0, 0), ("rms_norm", "fp16", (25, 1024, 13, 17), 0, 0),
    ("rms_norm", "fp16", (256, 88, 56, 56), 0, 0), ("rms_norm", "fp16", (149, 96, 56, 56), 0, 0),
    ("layer_norm", "fp16", (5, 16, 32, 32), 0, 0), ("layer_norm", "fp16", (256, 4, 7, 7), 0, 5),
    # ConvNeXt-T's channels-first LayerNorm (downsampling layers), batch 64, and the seeds' layout
    ("layer_norm", "bf16", (64, 96, 56, 56), 0, 0), ("layer_norm", "bf16", (64, 192, 28, 28), 0, 0),
    ("layer_norm", "bf16", (64, 384, 14, 14), 0, 0), ("layer_norm", "bf16", (64, 768, 7, 7), 0, 0),
    ("layer_norm", "fp32", (64, 384, 14, 14), 0, 0), ("rms_norm", "fp32", (16, 64, 256, 256), 0, 0),
]


def main():
    run = AltRun(__doc__, "FASTNORM_CHANNEL_COLUMN_MAX=0")
    from fastnorm.bench.cases import BenchCase, eager_fn, fastnorm_fn, make_inputs
    flush, bw = run.flush, run.bandwidth
    print(f"{'case':<34}{'fastnorm us':>12}{'%copy':>7}{'alt':>9}{'eager us':>10}{'compile us':>11}{'vs compile':>11}")
    for op, dtype, shape, offset, pad in CASES:
        case = BenchCase("channel", op, dtype, shape, (1,), True, offset=offset, pad=pad)
        x, w, b = make_inputs(case, "cuda", seed=1)
        fast, eager = fastnorm_fn(case), eager_fn(case)
        ours, ref = (lambda: fast(x, w, b)), (lambda: eager(x, w, b))
        err = (ours().float() - ref().float()).abs().max().item()
        t, t_alt = run.times(ours)
        te = device_time(ref, flush)
        tc = float("nan")
        if run.compile:
            torch._dynamo.reset()
            compiled = torch.compile(eager, dynamic=False)
            tc = device_time(lambda: compiled(x, w, b), flush)
        nbytes = case.minimal_bytes("fwd")
        print(f"{case.label:<34}{t * 1e6:>12.1f}{100 * nbytes / t / bw:>7.1f}{t_alt * 1e6:>9.1f}{te * 1e6:>10.1f}"
              f"{tc * 1e6:>11.1f}{tc / t:>10.2f}x  err {err:.1e}", flush=True)


if __name__ == "__main__":
    main()
