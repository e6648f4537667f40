"""`fastnorm bench`: fastnorm against PyTorch eager, torch.compile and Liger (where installed) on the device present.

Normalization is memory-bound, so every row is also scored against the floor: the bytes it must move
(forward: x read once, y written once, parameters read once; backward: x and dy read, dx written,
weight read, its gradients written) over the device's measured copy bandwidth. `--mode` times the
forward (default), the backward alone or both (a training step's norm).
Prints progress and a table (the sweep's rows also worst first), writes a JSON document and, with
matplotlib (`pip install "fastnorm[plot]"`), PNG charts of % of copy per row and against row length.
`--chart-from` draws them again from a JSON. `--baseline` compares fastnorm's times with a committed JSON
(exit 1 where a row got slower), `--compare` does so for two JSONs without running anything.
"""
import argparse
import functools
import json
import math
import sys
import time
from pathlib import Path

import torch

from fastnorm.bench import baseline, chart, family_suite, model_suite, modes, ranking, report, suites
from fastnorm.bench.cases import OPS
from fastnorm.bench.runner import Runner, TimingPlan
from fastnorm.bench.table import fmt_bytes, format_table
from fastnorm.harness.timing import TIMING_MODES

OP_ALIASES = {"ln": "layer_norm", "layernorm": "layer_norm", "rms": "rms_norm", "rmsnorm": "rms_norm",
              **{op: op for op in OPS}}

# Trial plans: (max trials, min trials, time budget per implementation in ms, warm-up calls).
PLANS = {("cuda", False): TimingPlan(100, 10, 300.0, 3), ("cuda", True): TimingPlan(30, 5, 100.0, 2),
         ("cpu", False): TimingPlan(30, 3, 200.0, 2), ("cpu", True): TimingPlan(5, 2, 30.0, 1)}
COPY_BYTES = {"cuda": 1 << 30, "cpu": 1 << 26}


def _choices(allowed, aliases=None):
    """argparse type for a comma-separated list of names."""
    aliases = aliases or {name: name for name in allowed}

    def parse(text):
        names = [n.strip().lower() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in aliases]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)} (choose from {', '.join(allowed)})")
        return [aliases[n] for n in names]
    return parse


def _tolerance(text: str) -> float:
    """argparse type for --baseline-tolerance: a fraction (0.05) or a percentage (5%)."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction >= 0 (e.g. 0.05 or 5%)")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastnorm bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="cuda, cpu or auto (default: cuda when available)")
    p.add_argument("--suite", type=_choices(list(suites.SUITES) + list(OWN_TABLE_SUITES)), action="extend",
                   help=f"only these suites, comma-separated: {', '.join(suites.SUITES)}, model (a small "
                        "transformers Llama, PyTorch's norms against fastnorm.patch, tokens/s; needs transformers), "
                        "family (the problems/ files against their solutions/ ModelNew, eager and torch.compile; "
                        "CUDA; with --mode train the problems whose norm has a fused backward)")
    p.add_argument("--dtype", type=_choices(suites.SUITE_DTYPES), action="extend",
                   help=f"only these dtypes: {', '.join(suites.SUITE_DTYPES)} (--suite family: run its "
                        "problems in these dtypes, models and inputs cast)")
    p.add_argument("--op", type=_choices(OPS, OP_ALIASES), action="extend",
                   help="only these ops: layer_norm (ln), rms_norm (rms)")
    p.add_argument("--mode", choices=modes.MODES, default="fwd",
                   help="what is timed: fwd (default) the forward; bwd the backward alone (the forward runs "
                        "once, untimed; autograd.grad with retain_graph); train forward + backward")
    p.add_argument("--quick", action="store_true", help="a small subset with fewer trials (~1 min on a GPU)")
    p.add_argument("--compile", dest="use_compile", action=argparse.BooleanOptionalAction, default=None,
                   help="time torch.compile too (default: on for cuda, off for cpu)")
    p.add_argument("--trials", type=int, help="most trials per implementation")
    p.add_argument("--min-trials", type=int, help="fewest trials per implementation")
    p.add_argument("--budget-ms", type=float, help="time per implementation that sets the trial count")
    p.add_argument("--no-flush-l2", dest="flush_l2", action="store_false",
                   help="do not flush the L2 cache before each trial")
    p.add_argument("--timing", choices=TIMING_MODES, default="device",
                   help="device (default): events bracket the call while the GPU is still busy with the L2 "
                        "flush, so host-side time overlaps as in a GPU-bound program (like triton's do_bench); "
                        "host: the GPU is idle when the call starts, so its Python and launch time count too")
    p.add_argument("--json", type=Path,
                   help="JSON output (default benchmarks/results/bench-<device>.json, bench-<device>-<mode>.json "
                        "for bwd and train)")
    p.add_argument("--chart", type=Path,
                   help="PNG chart output (default: the JSON path with .png); the %% of copy against row "
                        "length goes beside it as <name>-rows.png")
    p.add_argument("--chart-from", type=Path, metavar="JSON",
                   help="run nothing: draw the charts of this bench JSON (to --chart, default beside it)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    p.add_argument("--baseline", type=Path, metavar="JSON",
                   help="compare fastnorm's median in each row with the same row of this bench JSON (same "
                        "--mode; e.g. benchmarks/results/h100-train.json): rows more than --baseline-tolerance "
                        "slower are listed worst first and the exit status is 1; --suite family alone takes a "
                        "family JSON, e.g. benchmarks/results/h100-family.json)")
    p.add_argument("--baseline-tolerance", type=_tolerance, default=baseline.DEFAULT_TOLERANCE,
                   metavar="FRACTION", help=f"how much slower than the baseline a row may be (default "
                                            f"{baseline.DEFAULT_TOLERANCE:g}; 5%% also works)")
    p.add_argument("--compare", type=Path, metavar="JSON",
                   help="run nothing: compare this bench JSON (the new one) with --baseline JSON")
    return p


def resolve_device(text: str) -> torch.device:
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(text)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("fastnorm bench: --device cuda but torch sees no CUDA device")
    if device.type not in ("cuda", "cpu"):
        raise SystemExit(f"fastnorm bench: no suite for device type {device.type!r}")
    return device


def log(text: str) -> None:
    print(text, flush=True)


def write_charts(doc: dict, chart_path: Path) -> list:
    """The run's charts (paths written), or none and one line saying how to get them without matplotlib."""
    if not chart.available():
        log(chart.MISSING)
        return []
    by_length = [name for name, suite in suites.SUITES.items() if suite.by_row_length]
    return chart.write_charts(doc, chart_path, by_length)


def chart_from(json_path: Path, chart_path) -> int:
    """--chart-from: the charts of a JSON written earlier (e.g. the committed results), nothing run."""
    try:
        doc = json.loads(json_path.read_text())
        if not isinstance(doc.get("rows"), list) or not doc["rows"]:
            raise ValueError("no rows")
    except (OSError, ValueError, AttributeError) as exc:
        log(f"fastnorm bench: --chart-from {json_path}: not a bench JSON ({exc})")
        return 2
    written = write_charts(doc, chart_path or json_path.with_suffix(".png"))
    if written:
        log(f"wrote {' and '.join(str(p) for p in written)}")
    return 0 if written else 1


def compare_files(new_path: Path, old_path: Path, tolerance: float, markdown: bool) -> int:
    """--compare: two JSONs written earlier (other versions, other GPUs), nothing run. A new JSON with
    FAILED rows exits 1 as its run did, regressions or not."""
    try:
        old, new = baseline.load(old_path), baseline.load(new_path)
        comparison = baseline.compare(new, old, tolerance, path=old_path)
    except baseline.BaselineError as exc:
        log(f"fastnorm bench --compare: {exc}")
        return 2
    log(f"new: {new_path} (fastnorm {new.get('fastnorm_commit') or '?'}, {new.get('device') or '?'}, "
        f"torch {new.get('torch') or '?'})")
    log(comparison.format(markdown))
    failed = [baseline.row_label(r) for r in new["rows"]
              if (not r.get("ok") if baseline.is_family_row(r) else r.get("status") == "failed")]
    if failed:
        log(f"FAILED checks in {new_path}: {', '.join(failed)}")
    return 1 if failed else comparison.status


def load_baseline(args, device: torch.device):
    """--baseline, read and checked against this run's settings before anything runs: (document,
    None), or (None, exit status) after saying why it cannot be compared."""
    own = [s for s in args.suite or [] if s in OWN_TABLE_SUITES]
    if own and (own != ["family"] or args.suite != ["family"]):
        log(f"fastnorm bench: --baseline compares norm rows, or --suite family alone with a family JSON; "
            f"--suite {', '.join(args.suite)} does not")
        return None, 2
    try:
        doc = baseline.load(args.baseline)
        planned = {"mode": args.mode, "device": report.device_name(device),
                   "settings": {"timing": args.timing, "flush_l2": args.flush_l2}}
        if own:
            planned["suite"] = "family"
        warnings = baseline.check_compatible(planned, doc)
    except baseline.BaselineError as exc:
        log(f"fastnorm bench --baseline: {exc}")
        return None, 2
    for warning in warnings:  # now, not only after a long run
        log(f"warning: {warning}")
    return doc, None


def run_model_suite(device: torch.device, args, use_compile: bool, base_doc=None) -> int:
    """--suite model: its own rows (a whole model, not a norm call), table and JSON."""
    log(f"fastnorm bench --suite model on {report.device_name(device)} (torch {torch.__version__})")
    rows = model_suite.run(device.type, reps=3 if args.quick else 20, use_compile=use_compile, log=log)
    if rows is None:
        return 2
    log("")
    log(model_suite.format_rows(rows))
    json_path = (args.json if args.json and args.suite == ["model"] else
                 Path("benchmarks/results") / f"bench-{report.slug(report.device_name(device))}-model.json")
    report.write_json(model_suite.to_json(device.type, rows), json_path)
    log(f"wrote {json_path}")
    return 1 if any(r.ms is None for r in rows) else 0


def run_family_suite(device: torch.device, args, use_compile: bool, base_doc=None) -> int:
    """--suite family: each problems/ file with a solutions/ ModelNew, eager / torch.compile / ModelNew."""
    log(f"fastnorm bench --suite family on {report.device_name(device)} (torch {torch.__version__})")
    if device.type != "cuda":
        log("the family suite runs the problems at their real sizes (4 to 8.6 GB inputs): it needs a CUDA device")
        return 2
    from fastnorm.harness.timing import copy_bandwidth, time_callable

    include_host = args.timing == "host"  # like the other suites: device time unless --timing host
    copy_bw = copy_bandwidth(device, COPY_BYTES[device.type], include_host=include_host)
    log(f"copy bandwidth: {copy_bw / 1e9:.0f} GB/s (device-to-device, read + write); {args.timing} timing")
    reps = args.trials or (10 if args.quick else 30)
    if args.mode not in ("fwd", "train"):
        log("the family suite times --mode fwd or train")
        return 2
    dtypes = [family_suite.DTYPES[d] for d in args.dtype] if args.dtype else None
    rows = family_suite.run(device, Path("problems"), Path("solutions"), reps=reps, use_compile=use_compile,
                            copy_bw=copy_bw, log=log, mode=args.mode, dtypes=dtypes,
                            timer=functools.partial(time_callable, include_host=include_host))
    if rows is None:
        return 2
    log("")
    log(family_suite.format_rows(rows, markdown=args.markdown))
    suffix = "-train" if args.mode == "train" else ""
    json_path = (args.json if args.json and args.suite == ["family"] else
                 Path("benchmarks/results") / f"bench-{report.slug(report.device_name(device))}-family{suffix}.json")
    doc = family_suite.to_json(device, rows, copy_bw, args.timing, args.mode)
    status = 1 if any(not r.ok for r in rows) else 0
    if base_doc is not None:  # as the norm rows' runs do: the report after the table, the JSON gets it too
        comparison = baseline.compare(doc, base_doc, args.baseline_tolerance, path=args.baseline)
        doc["baseline"] = comparison.to_json()
        log("\n" + comparison.format(args.markdown))
        status = max(status, comparison.status)
    report.write_json(doc, json_path)
    log(f"wrote {json_path}")
    return status


# Suites with rows of their own (not BenchCase rows): name -> runner(device, args, use_compile, base_doc) -> exit
# status (base_doc: the --baseline document, which only the family suite takes).
OWN_TABLE_SUITES = {"model": run_model_suite, "family": run_family_suite}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.compare is not None and args.baseline is None:
        parser.error("--compare NEW.json needs --baseline OLD.json")
    if args.chart_from is not None and args.baseline is not None:
        parser.error("--chart-from draws charts only; it takes no --baseline or --compare")
    if args.chart_from is not None:
        return chart_from(args.chart_from, args.chart)
    if args.compare is not None:
        return compare_files(args.compare, args.baseline, args.baseline_tolerance, args.markdown)
    device = resolve_device(args.device)
    if device.type == "cuda" and device.index is not None:
        torch.cuda.set_device(device)
    base_doc = None
    if args.baseline is not None:
        base_doc, status = load_baseline(args, device)
        if base_doc is None:
            return status
    use_compile = device.type == "cuda" if args.use_compile is None else args.use_compile
    base = PLANS[(device.type, args.quick)]
    max_trials = args.trials or base.max_trials
    min_trials = args.min_trials or min(base.min_trials, max_trials)
    own = [s for s in OWN_TABLE_SUITES if args.suite and s in args.suite]
    if own:
        status = max(OWN_TABLE_SUITES[name](device, args, use_compile, base_doc) for name in own)
        args.suite = [s for s in args.suite if s not in OWN_TABLE_SUITES]
        if not args.suite:
            return status
    include_host = args.timing == "host"
    plan = TimingPlan(max_trials, min_trials, args.budget_ms or base.budget_ms, base.warmup, args.flush_l2,
                      include_host)
    cases = suites.select(device.type, quick=args.quick, suites=args.suite, dtypes=args.dtype, ops=args.op)
    if not cases:
        log("fastnorm bench: no rows match the filters")
        return 2

    started = time.perf_counter()
    name = report.device_name(device)
    log(f"fastnorm bench on {name} (torch {torch.__version__}): {len(cases)} rows, {modes.TITLES[args.mode]}, "
        f"compile {'on' if use_compile else 'off'}, up to {plan.max_trials} trials, {args.timing} timing")
    from fastnorm.harness.timing import copy_bandwidth

    copy_bw = copy_bandwidth(device, COPY_BYTES[device.type], include_host=include_host)
    log(f"copy bandwidth: {copy_bw / 1e9:.0f} GB/s (device-to-device, read + write)")

    runner = Runner(device, plan, copy_bw, use_compile=use_compile, log=log, mode=args.mode)
    rows = []
    for i, case in enumerate(cases, 1):
        log(f"[{i}/{len(cases)}] {case.suite}: {case.label} (moves {fmt_bytes(case.minimal_bytes(args.mode))})")
        rows.append(runner.run(case))

    log("")
    log(format_table(rows, markdown=args.markdown))
    ranked = [r for r in rows if getattr(suites.SUITES.get(r.case.suite), "rank_worst", False)]
    if ranked:
        log(f"\nworst first ({', '.join(sorted({r.case.suite for r in ranked}))}): fastnorm against the fastest "
            f"baseline of each row")
        log(ranking.format_ranking(ranked, markdown=args.markdown))
    settings = {"quick": args.quick, "compile": use_compile, "max_trials": plan.max_trials,
                "min_trials": plan.min_trials, "budget_ms": plan.budget_ms, "warmup": plan.warmup,
                "flush_l2": plan.flush_l2, "timing": args.timing, "copy_bytes": COPY_BYTES[device.type]}
    doc = report.document(rows, device=device, copy_bw=copy_bw, command=["fastnorm", "bench", *argv],
                          settings=settings, mode=args.mode)
    doc["elapsed_s"] = round(time.perf_counter() - started, 1)
    comparison = None
    if base_doc is not None:
        comparison = baseline.compare(doc, base_doc, args.baseline_tolerance, path=args.baseline)
        doc["baseline"] = comparison.to_json()
        log("\n" + comparison.format(args.markdown))
    stem = f"bench-{report.slug(name)}" + ("" if args.mode == "fwd" else f"-{args.mode}")
    json_path = args.json or Path("benchmarks/results") / f"{stem}.json"
    chart_path = args.chart or json_path.with_suffix(".png")
    report.write_json(doc, json_path)
    written = [json_path] + write_charts(doc, chart_path)
    failed = [r.case.label for r in rows if r.status == "failed"]
    skipped = [f"{r.case.label} ({r.note})" for r in rows if r.status == "skipped"]
    log(f"\nwrote {', '.join(str(p) for p in written)} in {time.perf_counter() - started:.0f} s")
    if skipped:
        log(f"skipped: {'; '.join(skipped)}")
    if failed:
        log(f"FAILED checks: {', '.join(failed)}")
    # A failed check is the worse news: it keeps exit 1 whatever the comparison says.
    return 1 if failed else (comparison.status if comparison else 0)


if __name__ == "__main__":
    sys.exit(main())
