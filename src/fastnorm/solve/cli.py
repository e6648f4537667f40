"""`fastnorm solve REFERENCE.py -o SOLUTION.py`: a verified single-file ModelNew for a reference problem.

Exit status: 0 written and verified; 1 written and verified but slower than --target-speedup, or no
correct solution found (nothing written); 2 the reference is not supported or bad arguments (nothing
written).
"""
import argparse
import sys

from fastnorm.harness.timing import DEFAULT_TIMING, TIMING_MODES
from fastnorm.solve.problem import UnsupportedProblem
from fastnorm.solve.solver import SUPPORTED, SolveFailed, solve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastnorm solve",
        description="Turn a KernelBench reference problem (Model, get_inputs, get_init_inputs) into a single "
                    "self-contained ModelNew file whose normalizations run on fastnorm's kernels, "
                    "compiled inline. The file is written only after `fastnorm eval` has verified it.",
        epilog=f"Recognized: {SUPPORTED}.")
    parser.add_argument("reference", help="reference problem file (KernelBench format)")
    parser.add_argument("-o", "--output", required=True, help="where to write the solution file")
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None,
                        help="device to tune and verify on, and whose kernels to embed (default: cuda if available)")
    parser.add_argument("--target-speedup", type=float, default=None, metavar="X",
                        help="stop trying launch configurations once one is X times faster than the reference "
                             "(default: try them all and keep the fastest)")
    parser.add_argument("--tune-trials", type=int, default=20, help="timed runs per launch configuration")
    parser.add_argument("--trials", type=int, default=5, help="correctness trials of the final check")
    parser.add_argument("--perf-trials", type=int, default=None,
                        help="timed runs of the final check (default: 100 on CUDA; on the CPU as many as fit "
                             "about 3 s of the slower model, 20 to 100)")
    parser.add_argument("--timing", choices=TIMING_MODES, default=DEFAULT_TIMING,
                        help="how the tuning runs and the final check time a call, as `fastnorm eval --timing`: "
                             "device (default; host work overlapped) or host (host time counted)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.target_speedup is not None and args.target_speedup <= 0:
        print("fastnorm solve: --target-speedup must be positive", file=sys.stderr)
        return 2
    try:
        result = solve(args.reference, args.output, device=args.device, target_speedup=args.target_speedup,
                       tune_trials=args.tune_trials, eval_trials=args.trials, perf_trials=args.perf_trials,
                       log=lambda line: print(line, flush=True), timing=args.timing)
    except UnsupportedProblem as err:
        print(f"fastnorm solve: cannot solve {args.reference}: {err}", file=sys.stderr)
        print("nothing written", file=sys.stderr)
        return 2
    except SolveFailed as err:
        print(f"fastnorm solve: {err}", file=sys.stderr)
        print("nothing written", file=sys.stderr)
        return 1
    if not result.target_met:
        speedup = result.verification.speedup
        print(f"fastnorm solve: target speedup {args.target_speedup:g}x not reached "
              f"(verified {speedup:.2f}x" if speedup else "(verified, speedup unknown"
              f"); wrote the fastest verified solution anyway", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
