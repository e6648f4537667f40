"""fastnorm.cross_entropy against the loss a Hugging Face causal LM computes (the logits upcast to float32,
then F.cross_entropy), eagerly and under torch.compile: forward + backward and forward alone, device
timing with L2 flushed, as % of a device-to-device copy measured in the same run.

    python3 benchmarks/cross_entropy.py [--json FILE]

Minimal bytes: the forward reads the logits; the backward reads them again and writes their gradient.
"""
import argparse
import json

import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.harness.timing import copy_bandwidth, time_callable

# (rows, classes, dtype): Llama 2 / Mistral (32000), GPT-2 (50257, odd), Llama 3 (128256) vocabularies at
# 8-16K tokens, float32 logits, and a 1000-class head (short rows, several a block).
CASES = [(8192, 32000, torch.bfloat16), (16384, 50257, torch.bfloat16), (8192, 128256, torch.bfloat16),
         (4096, 32000, torch.float32), (65536, 1000, torch.bfloat16), (256, 1000, torch.float32)]


def upcast_loss(logits, target):
    """What transformers' ForCausalLMLoss computes after its shift: float32 logits, then the mean."""
    return F.cross_entropy(logits.float(), target)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--json")
    args = parser.parse_args()
    device = torch.device("cuda")
    bandwidth = copy_bandwidth(device, include_host=False)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; copy {bandwidth / 1e9:.0f} GB/s")
    compiled = torch.compile(upcast_loss)
    impls = {"fastnorm": fastnorm.cross_entropy, "eager": upcast_loss, "compile": compiled}
    rows_out = []
    print(f"{'case':<26} {'impl':<9} {'fwd+bwd us':>10} {'%copy':>6} {'fwd us':>8} {'%copy':>6}")
    for rows, classes, dtype in CASES:
        x = torch.randn(rows, classes, device=device, dtype=dtype, requires_grad=True)
        target = torch.randint(0, classes, (rows,), device=device)
        size = x.numel() * x.element_size()
        case = f"{rows}x{classes} {str(dtype).replace('torch.', '')}"
        times = {}
        for name, fn in impls.items():
            def step(fn=fn):
                x.grad = None
                fn(x, target).backward()

            def forward(fn=fn):
                with torch.no_grad():
                    fn(x, target)

            train = time_callable(step, device=device, trials=args.trials, include_host=False).median_ms
            fwd = time_callable(forward, device=device, trials=args.trials, include_host=False).median_ms
            times[name] = train
            rows_out.append(dict(case=case, impl=name, train_us=train * 1e3, forward_us=fwd * 1e3,
                                 train_copy_pct=300 * size / (train * 1e-3) / bandwidth,
                                 forward_copy_pct=100 * size / (fwd * 1e-3) / bandwidth))
            r = rows_out[-1]
            print(f"{case:<26} {name:<9} {r['train_us']:10.1f} {r['train_copy_pct']:6.1f} {r['forward_us']:8.1f} "
                  f"{r['forward_copy_pct']:6.1f}")
        print(f"{'':<26} fastnorm fwd+bwd vs eager {times['eager'] / times['fastnorm']:.2f}x, "
              f"vs compile {times['compile'] / times['fastnorm']:.2f}x")
        del x
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           copy_gbps=bandwidth / 1e9, rows=rows_out), f, indent=1)


if __name__ == "__main__":
    main()
