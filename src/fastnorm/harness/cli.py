"""`fastnorm eval REFERENCE.py CANDIDATE.py [CANDIDATE2.py ...]` or `fastnorm eval --manifest FILE` - see
README ("fastnorm eval", "Batch evaluation")."""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from fastnorm.harness.evaluate import DEFAULT_TIMING, TIMING_MODES, EvaluationError, evaluate, evaluate_batch
from fastnorm.harness.manifest import read_manifest
from fastnorm.harness.pool import default_build_jobs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fastnorm eval",
        description="Build, verify and time KernelBench-style ModelNew candidates against a reference problem, "
                    "each candidate in its own process, spread over the GPUs of this host (or a Ray cluster). "
                    "Exit code 0 when every candidate is ok.")
    p.add_argument("paths", nargs="*", metavar="REFERENCE [CANDIDATE ...]",
                   help="the problem file (Model, get_inputs(), get_init_inputs()), then candidates defining "
                        "ModelNew: files, directories (their *.py) or quoted globs ('attempts/*.py')")
    p.add_argument("--manifest", default=None, metavar="FILE",
                   help="many problems at once: lines 'REFERENCE CANDIDATE' or JSON objects "
                        "{\"reference\": ..., \"candidates\": [...]} (README: Batch evaluation)")
    p.add_argument("--class", dest="class_name", default="ModelNew", help="candidate class name (default ModelNew)")
    p.add_argument("--device", default=None,
                   help="cuda (every visible GPU), cuda:N or cpu (default: cuda when a GPU is visible)")
    p.add_argument("--trials", type=int, default=5, help="correctness trials, distinct input seeds (default 5)")
    p.add_argument("--perf-trials", type=int, default=100, help="timed runs per model (default 100; a candidate gets at least 5: the judge's clock check takes their median)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs before timing (default 3)")
    p.add_argument("--atol", type=float, default=None, help="absolute tolerance (default 1e-4 fp32, 1e-2 fp16/bf16)")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance (default 1e-4 fp32, 1e-2 fp16/bf16)")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per candidate process, build included (default 600)")
    p.add_argument("--compile-baseline", action="store_true", help="also time torch.compile(Model)")
    p.add_argument("--timing", choices=TIMING_MODES, default=DEFAULT_TIMING,
                   help="device (default): each call is issued while the L2 flush and a ~1 ms spin on every SM "
                        "still run, so its Python and launch time overlap as in a GPU-bound program (like "
                        "triton's do_bench) and medians repeat within about 0.5%%; the spin fills every SM, so "
                        "work a candidate starts on a stream that does not wait for the caller's cannot run "
                        "before the start event. host: the GPU is idle when each call starts, so its host time "
                        "counts too (KernelBench's convention). Reference and candidates alike")
    p.add_argument("--json", dest="json_path", default=None, help="write the full report as JSON to this path")
    p.add_argument("--seed", type=int, default=42, help="base seed for weights and inputs (default 42)")
    p.add_argument("--jobs", type=int, default=None,
                   help="candidates judged at once: default one per visible GPU (never two on one GPU), 1 on CPU")
    p.add_argument("--build-jobs", type=int, default=None,
                   help=f"candidate builds run ahead of the judges, overlapping timing (default 0: each judge "
                        f"builds; {default_build_jobs()} suits several candidates on CUDA here)")
    p.add_argument("--jsonl", default=None, metavar="PATH",
                   help="append one JSON object per candidate to PATH as each finishes")
    p.add_argument("--resume", action="store_true",
                   help="keep the results already in --jsonl PATH and run only the candidates it lacks")
    p.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                   help="run on a Ray cluster (ADDRESS, e.g. auto or ray://head:10001), a new local instance "
                        "without one; needs pip install 'fastnorm[ray]'")
    p.add_argument("--no-floor-check", dest="floor_check", action="store_false",
                   help="do not flag times below the bytes / copy-bandwidth floor (models that skip inputs)")
    p.add_argument("--keep-temp", action="store_true", help="keep each worker's directory (logs, builds)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(_bare_ray_flag(list(sys.argv[1:] if argv is None else argv)))
    if args.manifest and args.paths:
        parser.error("give either --manifest FILE or REFERENCE CANDIDATE..., not both")
    if not args.manifest and len(args.paths) < 2:
        parser.error("expected a REFERENCE file and at least one CANDIDATE (or --manifest FILE)")
    progress = None if args.quiet else (lambda msg: print(f"fastnorm eval: {msg}", file=sys.stderr, flush=True))
    options = dict(device=args.device, trials=args.trials, perf_trials=args.perf_trials, warmup=args.warmup,
                   atol=args.atol, rtol=args.rtol, timeout=args.timeout, compile_baseline=args.compile_baseline,
                   class_name=args.class_name, seed=args.seed, jobs=args.jobs, build_jobs=args.build_jobs,
                   jsonl=args.jsonl, resume=args.resume, ray=args.ray, floor_check=args.floor_check,
                   keep_temp=args.keep_temp, timing=args.timing, progress=progress)
    previous = _terminate_as_interrupt()
    try:
        if args.manifest:
            report = evaluate_batch(read_manifest(args.manifest), **options)
        else:
            report = evaluate(args.paths[0], args.paths[1:], **options)
    except (EvaluationError, ValueError) as exc:
        print(f"fastnorm eval: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        kept = f"; finished candidates are in {args.jsonl} (--resume goes on)" if args.jsonl else ""
        print(f"fastnorm eval: interrupted, every worker stopped{kept}", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(report.format_table())
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(report.to_json(), f, indent=2)
            f.write("\n")
    return 0 if report.all_ok else 1


def _bare_ray_flag(argv: list) -> list:
    """`--ray` followed by a file or another option has no address: `--ray ref.py cand.py` must not read
    ref.py as one."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--ray":
            nxt = out[i + 1] if i + 1 < len(out) else None
            if nxt is None or nxt.startswith("-") or nxt.endswith(".py") or os.path.exists(nxt):
                out[i] = "--ray=local"
    return out


def _terminate_as_interrupt():
    """SIGTERM stops a batch like Ctrl-C: every worker's process group killed, the JSON Lines file complete."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread
        return None


if __name__ == "__main__":
    sys.exit(main())
