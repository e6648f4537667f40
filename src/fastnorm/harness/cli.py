"""`fastnorm eval REFERENCE.py CANDIDATE.py [CANDIDATE2.py ...]` - see README ("fastnorm eval")."""
from __future__ import annotations

import argparse
import json
import sys

from fastnorm.harness.evaluate import EvaluationError, default_jobs, evaluate


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastnorm eval",
        description="Build, verify and time KernelBench-style ModelNew candidates against a reference problem, "
                    "each candidate in its own process. Exit code 0 when every candidate is ok.")
    p.add_argument("reference", help="problem file defining Model, get_inputs(), get_init_inputs()")
    p.add_argument("candidates", nargs="+", help="candidate files defining ModelNew (or --class)")
    p.add_argument("--class", dest="class_name", default="ModelNew", help="candidate class name (default ModelNew)")
    p.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--trials", type=int, default=5, help="correctness trials, distinct input seeds (default 5)")
    p.add_argument("--perf-trials", type=int, default=100, help="timed runs per model (default 100)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before timing (default 3)")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance (default 1e-4 fp32, 1e-2 fp16/bf16)")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (default 1e-4 fp32, 1e-2 fp16/bf16)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per candidate process, build included (default 600)")
    p.add_argument("--compile-baseline", action="store_true", help="also time torch.compile(Model)")
    p.add_argument("--json", dest="json_path", default=None, help="write the full report as JSON to this path")
    p.add_argument("--seed", type=int, default=42, help="base seed for weights and inputs (default 42)")
    p.add_argument("--jobs", type=int, default=None,
                   help=f"parallel candidate builds before the sequential runs (default {default_jobs()} here)")
    p.add_argument("--no-floor-check", dest="floor_check", action="store_false",
                   help="do not flag times below the bytes / copy-bandwidth floor (models that skip inputs)")
    p.add_argument("--keep-temp", action="store_true", help="keep each worker's directory (logs, builds)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    progress = None if args.quiet else (lambda msg: print(f"fastnorm eval: {msg}", file=sys.stderr, flush=True))
    try:
        report = evaluate(args.reference, args.candidates, device=args.device, trials=args.trials,
                          perf_trials=args.perf_trials, warmup=args.warmup, atol=args.atol, rtol=args.rtol,
                          timeout=args.timeout, compile_baseline=args.compile_baseline, class_name=args.class_name,
                          seed=args.seed, jobs=args.jobs, floor_check=args.floor_check, keep_temp=args.keep_temp,
                          progress=progress)
    except (EvaluationError, ValueError) as exc:
        print(f"fastnorm eval: error: {exc}", file=sys.stderr)
        return 2
    print(report.format_table())
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report.to_json(), f, indent=2)
            f.write("\n")
    return 0 if report.all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
