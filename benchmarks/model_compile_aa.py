"""A/A check of the model suite's compiled training step (issue 26): two unpatched compiled copies of the suite's
Llama and one patched with fastnorm.patch, timed in interleaved rounds in three orders. The spread between the
two unpatched copies is the resolution of the suite's compiled ratio (benchmarks/results/h100-model-compile-aa.txt).

Usage: python benchmarks/model_compile_aa.py [--rounds N]   (needs CUDA and transformers)
"""
import argparse

import torch

import fastnorm
from fastnorm.bench.model_suite import CONFIGS, _llama, _time_interleaved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    cfg = CONFIGS["cuda"]
    ids = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq"]), device="cuda")
    models = {}
    for name in ("plain A", "patched", "plain B"):
        model = _llama("cuda", cfg)
        if name == "patched":
            fastnorm.patch(model)
        models[name] = torch.compile(model)

    def train(model):
        def call():
            model(input_ids=ids, labels=ids).loss.backward()
        return call

    for order in (["plain A", "patched", "plain B"], ["plain B", "patched", "plain A"], ["patched", "plain A", "plain B"]):
        ms = _time_interleaved({name: train(models[name]) for name in order}, "cuda", args.rounds)
        print("order", order, " ".join(f"{name}: {ms[name]:.2f}" for name in order),
              f" patched/plainA {ms['plain A'] / ms['patched']:.3f}x plainB/plainA {ms['plain A'] / ms['plain B']:.3f}x",
              flush=True)


if __name__ == "__main__":
    main()
