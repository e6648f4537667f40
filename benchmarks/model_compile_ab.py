"""The model suite's Llama under torch.compile, training step: unpatched, and patched with the loss under
compile as fastnorm's op, as the model's own (inductor), or not patched; all four compiled models timed in
the same rounds (model_suite._time_interleaved), then GPU kernel time by kind (benchmarks/model_ab.py).

    python3 benchmarks/model_compile_ab.py      # results/h100-model-compile-ab.txt
"""
import os
import sys

import torch

import fastnorm
from fastnorm.bench import model_suite

cfg = model_suite.CONFIGS["cuda"]
ids = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq"]), device="cuda")
variants = {}
for name in ("pytorch", "loss op", "loss inductor", "no loss patch"):
    m = model_suite._llama("cuda", cfg)
    if name != "pytorch":
        fastnorm.patch(m, fuse_loss=name != "no loss patch")
        if name != "no loss patch":  # the patch's default is the model's own loss under compile
            m.loss_function.inductor_under_compile = name == "loss inductor"
    variants[name] = torch.compile(m)


def train(m):
    return lambda: m(input_ids=ids, labels=ids).loss.backward()


for rnd in range(3):
    t = model_suite._time_interleaved({k: train(m) for k, m in variants.items()}, "cuda", 30)
    base = t["pytorch"]
    print(f"round {rnd}: " + ", ".join(f"{k} {v:.2f} ms ({base / v:.3f}x)" for k, v in t.items()), flush=True)
    for m in variants.values():
        m.zero_grad(set_to_none=True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_ab import breakdown  # noqa: E402

for k in ("pytorch", "loss op", "loss inductor"):
    kinds, top = breakdown(train(variants[k]))
    print(f"{k}: GPU kernel time {sum(kinds.values()) / 1e3:.2f} ms: " + ", ".join(f"{n} {v / 1e3:.2f}" for n, v in kinds.items()))
    for name, us in top:
        print(f"      {us / 1e3:7.3f} ms  {name}")
