"""How steady `fastnorm eval`'s timing is (issue 29): evaluate one candidate several times in a row, then time
the same ModelNew in this process with CUDA events, and compare the medians.

    python benchmarks/eval_steadiness.py problems/layer_norm_16x64x256x256.py solutions/layer_norm_16x64x256x256.py \\
        --runs 5 --json benchmarks/results/h100-eval-steadiness-ln.json

The evaluations share one extensions folder (the candidate builds once; `fastnorm solve`'s files name their
extension by a hash of its sources, so they cannot clash). `--timing` is passed to `fastnorm eval` (default
device here; eval's own default is host). In-process figures: the evaluator's own timing loop (time_callable, L2 flushed, each output
kept to its trial's end as in eval) in both modes - device (the call issued while the flush and a ~1 ms spin
run: its host side overlapped) and host (the device synchronized before each call, so host time counts); the
eval medians are compared with the one of the same mode. Targets (issue 29): eval medians within 2% of each
other and within 3% of the in-process median, IQR at most 5% of the median.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from fastnorm.harness import evaluate
from fastnorm.harness.loading import build_model, load_module, make_inputs, to_device
from fastnorm.harness.timing import TrialHooks, effective_timing, time_callable

MODES = {"device": "device_only", "host": "host_included"}  # --timing -> the in-process figure of that mode


def in_process(reference: Path, candidate: Path, trials: int, seed: int) -> dict:
    """ModelNew timed in this process by the evaluator's timing loop, built and fed as the evaluator does."""
    device = torch.device("cuda")
    ref = load_module(str(reference), "steadiness_reference")
    cand = load_module(str(candidate), "steadiness_candidate")
    model = build_model(cand.ModelNew, to_device(list(ref.get_init_inputs()), device), seed, device)
    inputs = make_inputs(ref, seed + 1, device)

    def call():
        with torch.no_grad():
            return model(*inputs)

    out = {}
    for name, include_host in (("device_only", False), ("host_included", True)):
        stats = time_callable(call, device=device, trials=trials, warmup=3, include_host=include_host,
                              hooks=TrialHooks())
        out[name] = {"median_ms": stats.median_ms, "iqr_ms": stats.iqr_ms, "min_ms": stats.min_ms,
                     "mode": effective_timing(device, include_host)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference", type=Path)
    p.add_argument("candidate", type=Path)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--perf-trials", type=int, default=100)
    p.add_argument("--trials", type=int, default=2, help="correctness trials per evaluation")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timing", choices=list(MODES), default="device",
                   help="fastnorm eval's --timing (default device here; eval's own default is host)")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("eval_steadiness: needs a CUDA GPU", file=sys.stderr)
        return 2
    ext_dir = tempfile.mkdtemp(prefix="fastnorm_steadiness_ext_")
    runs = []
    for i in range(args.runs):
        t0 = time.perf_counter()
        report = evaluate(str(args.reference), [str(args.candidate)], trials=args.trials, perf_trials=args.perf_trials,
                          seed=args.seed, jobs=1, extensions_dir=ext_dir, timing=args.timing)
        r = report.results[0]
        timing = r.cand_timing or {}
        runs.append({"verdict": r.verdict, "cand_ms": r.cand_ms, "iqr_ms": timing.get("iqr_ms"),
                     "timing_mode": timing.get("mode"),
                     "ref_ms": r.ref_ms, "external_median_ms": timing.get("external_median_ms"),
                     "loop_overhead_ms": timing.get("loop_overhead_ms"), "wall_s": time.perf_counter() - t0})
        print(f"eval run {i + 1}: {r.verdict} cand {r.cand_ms or float('nan'):.4f} ms "
              f"(IQR {timing.get('iqr_ms') or float('nan'):.4f}, timing {timing.get('mode')}), "
              f"ref {r.ref_ms or float('nan'):.4f} ms, {runs[-1]['wall_s']:.1f} s", flush=True)
    local = in_process(args.reference, args.candidate, args.perf_trials, args.seed)
    medians = [r["cand_ms"] for r in runs if r["cand_ms"]]
    same_mode = local[MODES[args.timing]]["median_ms"]
    summary = {
        "timing": args.timing,
        "eval_median_spread_pct": 100 * (max(medians) / min(medians) - 1) if medians else None,
        "eval_vs_in_process_pct": 100 * (statistics.median(medians) / same_mode - 1) if medians else None,
        "worst_iqr_pct": max(100 * r["iqr_ms"] / r["cand_ms"] for r in runs if r["cand_ms"]) if medians else None,
    }
    for name, v in local.items():
        print(f"in process, {name} ({v['mode']}): median {v['median_ms']:.4f} ms, IQR {v['iqr_ms']:.4f}, "
              f"min {v['min_ms']:.4f}")
    if medians:
        print("spread of eval medians {eval_median_spread_pct:.2f}% (target <= 2), eval vs in-process ({timing} "
              "timing) {eval_vs_in_process_pct:+.2f}% (|x| <= 3), worst IQR {worst_iqr_pct:.2f}% of the median "
              "(<= 5)".format(**summary))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device_name": torch.cuda.get_device_name(), "torch": torch.__version__,
                                         "reference": str(args.reference), "candidate": str(args.candidate),
                                         "runs": runs, "in_process": local, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
