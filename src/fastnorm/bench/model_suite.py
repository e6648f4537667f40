"""`fastnorm bench --suite model`: a small Hugging Face Llama, as built by transformers from a config
(no download), with its own RMSNorm and patched by `fastnorm.patch`, in tokens per second: the
forward (inference, no grad) and a training step (forward + backward, no optimizer), each as is and,
on CUDA, under torch.compile.

Needs `transformers` (`pip install transformers`): without it the suite prints how to get it and
writes nothing.
"""
import time
from dataclasses import asdict, dataclass
from typing import List, Optional

import torch

# Llama-shaped models: hidden size, layers, heads, KV heads, MLP width, vocabulary, batch, sequence.
CONFIGS = {
    "cuda": dict(hidden_size=2048, num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=8,
                 intermediate_size=5632, vocab_size=32000, batch=8, seq=1024, dtype="bf16"),
    "cpu": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=512, vocab_size=1024, batch=2, seq=128, dtype="fp32"),
}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass
class ModelRow:
    mode: str        # "forward" or "train"
    variant: str     # "pytorch" or "fastnorm", with " + compile" where compiled
    ms: Optional[float]
    tokens_per_s: Optional[float]
    note: str = ""


def _llama(device: str, cfg: dict):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=cfg["hidden_size"], num_hidden_layers=cfg["num_hidden_layers"],
                         num_attention_heads=cfg["num_attention_heads"],
                         num_key_value_heads=cfg["num_key_value_heads"],
                         intermediate_size=cfg["intermediate_size"], vocab_size=cfg["vocab_size"],
                         max_position_embeddings=cfg["seq"], attn_implementation="sdpa")
    torch.manual_seed(0)
    return LlamaForCausalLM(config).to(device=device, dtype=DTYPES[cfg["dtype"]])


def _time_interleaved(fns: dict, device: str, reps: int) -> dict:
    """{name: median milliseconds} of each of `fns` after 3 warm-up calls each (CUDA: synchronized wall
    clock around each call), timed in rounds, each function once a round: a drift of the GPU's clocks
    over the run (it warms up) weighs on every variant alike instead of on the last measured. A function
    that raises gets its exception in place of a time; the others go on."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    results, live = {}, dict(fns)
    for name, fn in fns.items():
        try:
            for _ in range(3):
                fn()
        except Exception as exc:  # a failing variant is reported, the others still run
            results[name] = exc
            del live[name]
    times = {name: [] for name in live}
    for _ in range(reps):
        for name, fn in live.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            times[name].append((time.perf_counter() - start) * 1e3)
    for name, values in times.items():
        values.sort()
        results[name] = values[len(values) // 2]
    return results


def run(device: str, reps: int = 10, use_compile: Optional[bool] = None, log=print) -> Optional[List[ModelRow]]:
    """The suite's rows, or None when transformers is missing (after saying so). Both models live side by
    side; the eager variants are timed in the same rounds (_time_interleaved), and the compiled ones in
    rounds of their own, so that each ratio compares steps timed beside the same neighbours. (The two
    compiled models run the same graph since session 29; three compiled copies timed alone, two of them
    unpatched, read 0.996-1.002x of each other on an H100: the resolution of a compiled ratio here.)"""
    try:
        import transformers  # noqa: F401
    except ImportError:
        log('the model suite needs transformers: pip install transformers (or "fastnorm[test]")')
        return None
    import fastnorm

    cfg = CONFIGS[device]
    use_compile = device == "cuda" if use_compile is None else use_compile
    tokens = cfg["batch"] * cfg["seq"]
    ids = torch.randint(0, cfg["vocab_size"], (cfg["batch"], cfg["seq"]), device=device)
    targets = {}  # variant name -> (model, module to call)
    for variant in ("pytorch", "fastnorm"):
        model = _llama(device, cfg)
        if variant == "fastnorm":
            report = fastnorm.patch(model)
            fused, losses = len(report.fused), len(report.losses)
            log(f"model suite: fastnorm.patch replaced {len(report.replaced) - fused - losses} norms, "
                f"fused the residual add of {fused} layers" + (", computes the loss" if losses else ""))
        targets[variant] = (model, model)
        if use_compile:
            targets[f"{variant} + compile"] = (model, torch.compile(model))

    def forward(m):
        def call():
            with torch.no_grad():
                m(input_ids=ids)
        return call

    def train(m):
        def call():
            m(input_ids=ids, labels=ids).loss.backward()
        return call

    measured = {}
    for mode, make in (("forward", forward), ("train", train)):
        measured[mode] = {}
        for compiled in (False, True):
            group = {name: make(m) for name, (_, m) in targets.items() if name.endswith(" + compile") == compiled}
            if group:
                measured[mode].update(_time_interleaved(group, device, reps))
        for model, _ in targets.values():
            model.zero_grad(set_to_none=True)
    rows = []
    for name in targets:
        for mode in ("forward", "train"):
            result = measured[mode][name]
            if isinstance(result, Exception):
                rows.append(ModelRow(mode, name, None, None, f"{type(result).__name__}: {result}"[:200]))
            else:
                rows.append(ModelRow(mode, name, result, tokens / result * 1e3))
            log(f"  {mode:<8} {name:<22} " + (f"{rows[-1].ms:9.2f} ms  {rows[-1].tokens_per_s:12.0f} tok/s"
                                              if rows[-1].ms else f"FAILED {rows[-1].note}"))
    del targets
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def to_json(device: str, rows: List[ModelRow]) -> dict:
    cfg = CONFIGS[device]
    return {"suite": "model", "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "torch": torch.__version__, "config": cfg, "rows": [asdict(r) for r in rows]}


def format_rows(rows: List[ModelRow]) -> str:
    """A table: each variant's time and tokens/s, and fastnorm's speedup over PyTorch in the same mode."""
    base = {(r.mode, r.variant): r for r in rows if r.variant.startswith("pytorch")}
    lines = [f"{'mode':<8} {'variant':<22} {'ms':>9} {'tokens/s':>12} {'vs pytorch':>10}"]
    for r in rows:
        ref = base.get((r.mode, r.variant.replace("fastnorm", "pytorch")))
        speedup = f"{ref.ms / r.ms:9.2f}x" if r.ms and ref and ref.ms and r.variant.startswith("fastnorm") else ""
        timing = f"{r.ms:9.2f} {r.tokens_per_s:12.0f}" if r.ms else f"{'FAILED':>9} {'':>12}"
        lines.append(f"{r.mode:<8} {r.variant:<22} {timing} {speedup:>10}")
    return "\n".join(lines)
