"""Issue 23's measurement: wall time of `fastnorm eval` over N candidates that each need a build, run
(a) one at a time with each judge building its own (as before issue 23), (b) on one GPU with the build pool
overlapping timing, (c) over every visible GPU; verdicts must match and per-candidate times agree within noise.

    fastnorm solve problems/layer_norm_16x64x256x256.py -o /tmp/ln_solved.py     # a load_inline candidate
    python benchmarks/eval_scale.py problems/layer_norm_16x64x256x256.py /tmp/ln_solved.py --copies 16 \\
        --out benchmarks/results/eval-scale-h200x2.json

Each copy is a distinct file, judged in its own folder, so every one compiles (nothing is shared between
candidates' extension caches). --configs picks which runs (default: all that the GPUs allow).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fastnorm.harness import evaluate
from fastnorm.harness.gpus import visible_gpus
from fastnorm.harness.pool import default_build_jobs

# name -> evaluate() keywords. The build pool is named explicitly: evaluate's build_jobs=None leaves it off
# on a GPU (opt-in until it has run there), so session 14's "builds ahead" run, which passed None, was the
# sequential run again (its pace matched: 4 of 8 judged in ~135 s against 232.7 s for 8).
CONFIGS = {
    "sequential": {"jobs": 1, "build_jobs": 0},
    "one_gpu_builds_ahead": {"jobs": 1, "build_jobs": default_build_jobs()},
    "all_gpus": {"jobs": None, "build_jobs": default_build_jobs()},
}


def median_stages(stage_s: list) -> dict:
    """Median seconds of each stage over the candidates' judges (CandidateResult.stage_s): where a
    candidate's time goes (the 16 copies on the H100 took ~28 s each, builds ahead or not)."""
    names = [name for stages in stage_s if stages for name in stages]
    order = list(dict.fromkeys(names))
    return {name: round(statistics.median(s[name] for s in stage_s if s and name in s), 3) for name in order}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reference")
    p.add_argument("candidate", help="a candidate that builds (load_inline), copied --copies times")
    p.add_argument("--copies", type=int, default=16)
    p.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=None)
    p.add_argument("--trials", type=int, default=2)
    p.add_argument("--perf-trials", type=int, default=100)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--device", default="cuda", help="cuda (default); cpu only to try this script")
    p.add_argument("--build-jobs", type=int, default=None,
                   help=f"builds at a time in the runs with builds ahead (default {default_build_jobs()})")
    p.add_argument("--out", default=None, help="JSON results file")
    args = p.parse_args(argv)
    gpus = visible_gpus()
    configs = args.configs or [c for c in CONFIGS if c != "all_gpus" or len(gpus) > 1]
    folder = Path(tempfile.mkdtemp(prefix="fastnorm-eval-scale-"))
    source = Path(args.candidate).read_text()
    copies = []
    for i in range(args.copies):
        path = folder / f"candidate_{i:02d}.py"
        path.write_text(source + f"\n# copy {i}\n")
        copies.append(path)
    runs = {}
    for name in configs:
        settings = dict(CONFIGS[name])
        if args.build_jobs and settings["build_jobs"]:
            settings["build_jobs"] = args.build_jobs
        start = time.monotonic()
        report = evaluate(args.reference, copies, device=args.device, trials=args.trials, perf_trials=args.perf_trials,
                          timeout=args.timeout, progress=lambda line: print(f"  {line}", file=sys.stderr, flush=True),
                          **settings)
        wall = time.monotonic() - start
        runs[name] = {"wall_s": wall, "settings": report.settings,
                      "verdicts": [r.verdict for r in report.results],
                      "cand_ms": [r.cand_ms for r in report.results], "gpus": [r.gpu for r in report.results],
                      "ref_ms": {where: b.ref_timing["median_ms"] for where, b in report.baselines.items()},
                      "device_name": report.baseline.device_name,
                      "stage_s_median": median_stages([r.stage_s for r in report.results]),
                      # the judge's clock check of each candidate (timing_verdict.clock_disagrees)
                      "clock": [{k: (r.cand_timing or {}).get(k) for k in ("external_excess_ms", "loop_overhead_ms",
                                                                            "loop_overhead_spread_ms")}
                                for r in report.results]}
        print(f"{name}: {wall:.1f} s, verdicts {sorted(set(runs[name]['verdicts']))}", flush=True)
        print(f"  a candidate's judge, median seconds by stage: {runs[name]['stage_s_median']}", flush=True)
    first = runs[configs[0]]
    summary = {}
    for name, run in runs.items():
        times = [(a, b) for a, b in zip(run["cand_ms"], first["cand_ms"]) if a and b]
        summary[name] = {"wall_s": round(run["wall_s"], 1), "vs_" + configs[0]: round(run["wall_s"] / first["wall_s"], 3),
                         "same_verdicts": run["verdicts"] == first["verdicts"],
                         "median_time_ratio": statistics.median(a / b for a, b in times) if times else None}
        print(f"{name:>22}: {summary[name]}")
    if args.out:
        Path(args.out).write_text(json.dumps({"reference": args.reference, "candidate": args.candidate,
                                              "copies": args.copies, "visible_gpus": gpus, "summary": summary,
                                              "runs": runs}, indent=1) + "\n")
    return 0 if all(s["same_verdicts"] for s in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
