"""A/B runs of the planner's choices: threads-per-row overrides (sweep), (threads, blocks_per_row) of the
split-row kernel (split), every override checked for correctness (configs), and same-process A/B of
switches read from environment variables at each call (ab: % of copy on plain shapes; abrows: us against
torch.compile on the sweep's rows, misaligned and padded ones included; abfamily: ms of the family problems'
ModelNew against torch.compile of their Model, with every kernel of a call from torch.profiler).

The overrides go through the extension's own entry, `norm_forward(x, weight, bias, begin, end, eps, rms,
threads, blocks_per_row)` (0: the planner's choice).
"""
import argparse
import math
import os
from pathlib import Path

import torch

from fastnorm_dev import Command
from fastnorm_dev.measure import (affine_params, copy_bandwidth, device_line, device_time, dtype_label,
                                  flush_buffer, float64_norm, norm_bytes, parse_shape, relative_error,
                                  torch_norm)

SWEEP_SHAPES = ((16384, 4096), (4096, 16384), (65536, 1024))  # the bf16 rows where Triton leads
AB_ROUNDS = 3


def run_sweep(args):
    from fastnorm.ops import extension

    ext = extension.load("cuda")
    shapes = args.shapes or SWEEP_SHAPES
    flush = flush_buffer()
    bw = copy_bandwidth(flush, reps=40)
    print(device_line(bw), flush=True)
    for dt in (torch.bfloat16, torch.float32):
        for m, n in shapes:
            x = torch.randn(m, n, device="cuda", dtype=dt)
            w, b = affine_params(n, dt)
            for rms in (False, True):
                nbytes = norm_bytes(x, w) if rms else norm_bytes(x, w, b)
                ref = torch_norm(x, w, b, rms)()
                cells = []
                if not args.quick:
                    comp = torch_norm(x, w, b, rms, compiled=True)
                    cells.append(f"compile {100 * nbytes / device_time(comp, flush, reps=40) / bw:5.1f}")
                for t in (0,) if args.quick else (0, 32, 64, 128, 256, 512):
                    call = lambda: ext.norm_forward(x, w, None if rms else b, 1, 2, 1e-5, rms, t, 0)
                    err = (call().float() - ref.float()).abs().max().item()
                    tol = 5e-2 if dt == torch.bfloat16 else 1e-3
                    mark = "" if err < tol else "!"
                    cells.append(f"t{t} {100 * nbytes / device_time(call, flush, reps=40) / bw:5.1f}{mark}")
                print(f"{'RMS' if rms else 'LN':<4}{m}x{n} {dtype_label(dt):<9}" + "  ".join(cells), flush=True)
            del x, w, b, ref
            torch.cuda.empty_cache()


def run_split(args):
    from fastnorm.ops import extension

    ext = extension.load("cuda")
    flush = flush_buffer()
    for dt in (torch.float32, torch.bfloat16):
        for m, n in [(1024, 65536), (256, 262144), (16, 4194304)]:
            x = torch.randn(m, n, device="cuda", dtype=dt)
            w, b = affine_params(n, dt)
            g = math.ceil(n * x.element_size() / (64 << 10))  # blocks a row needs at 64 KB a block
            row = []
            for t, blocks in [(0, 0), (256, 2 * g), (512, 2 * g), (256, g), (128, 4 * g), (1024, 0)]:
                us = device_time(lambda: ext.norm_forward(x, w, b, 1, 2, 1e-5, False, t, blocks), flush) * 1e6
                row.append(f"t{t}/g{blocks}:{us:7.1f}")
            print(f"{m}x{n} {dtype_label(dt):<9}", "  ".join(row), flush=True)
            del x, w, b


def run_configs(args):
    from fastnorm.ops import extension

    ext = extension.load("cuda")
    threads = (0, 32, 64, 128, 256, 512, 1024, 100)
    blocks = (0, 1, 2, 4, 16, 300)
    shapes = [((16, 64, 256, 256), 1, 4), ((8, 64, 64, 64), 1, 2), ((6, 50000), 1, 2), ((300, 1024), 1, 2)]
    for shape, b0, b1 in shapes:
        x = torch.randn(shape, device="cuda") + 3
        w, b = affine_params(shape[b0:b1], torch.float32)
        for t in threads:
            for g in blocks:
                for rms in (False, True):
                    y = ext.norm_forward(x, w, None if rms else b, b0, b1, 1e-5, rms, t, g)
                    err = (y.double() - float64_norm(x, w, b, b0, b1, rms)).abs().max().item()
                    assert err < 1e-4, (shape, t, g, rms, err)
        print("ok", shape, flush=True)
    print("config sweep: all configurations correct")


def _parse_variant(variant):
    if variant == "-":
        return {}
    if any("=" not in item for item in variant.split(",")):
        raise SystemExit(f"devtool.py ab: variant {variant!r} is not NAME=VALUE[,NAME=VALUE...] or -")
    return dict(item.split("=", 1) for item in variant.split(","))


def _apply(env, names):
    for name in names:
        os.environ.pop(name, None)
    os.environ.update(env)


def run_ab(args):
    from fastnorm.ops import extension

    if not args.rest:
        raise SystemExit("devtool.py ab: give the shapes after --: ab VARIANT [VARIANT ...] -- SHAPE [SHAPE ...]")
    try:
        shapes = [parse_shape(text) for text in args.rest]
    except argparse.ArgumentTypeError as exc:
        raise SystemExit(f"devtool.py ab: {exc}")
    envs = [_parse_variant(v) for v in args.variants]
    names = {name for env in envs for name in env}
    reps = int(os.environ.get("AB_REPS", "30"))
    ext = extension.load("cuda")
    flush = flush_buffer()
    bw = copy_bandwidth(flush, reps=20)
    print(f"{device_line(bw)}; variants: {' | '.join(args.variants)}", flush=True)
    for dt in (torch.float32, torch.bfloat16):
        for shape in shapes:
            x = torch.randn(shape, device="cuda", dtype=dt) + 3
            channels = len(shape) == 4  # AxCxHxW: over dim 1; otherwise over the last dim
            n = shape[1] if channels else shape[-1]
            dims = (1, 2) if channels else (len(shape) - 1, len(shape))
            w, b = affine_params(n, dt)
            for rms in (False, True):
                def call():
                    return ext.norm_forward(x, w, None if rms else b, *dims, 1e-5, rms, 0, 0)
                ref = float64_norm(x[:4], w, b, *dims, rms)  # the first 4 rows (or images) suffice
                errs = []
                for env in envs:
                    _apply(env, names)
                    errs.append(relative_error(call()[:4], ref))
                del ref
                moved = norm_bytes(x, w) if rms else norm_bytes(x, w, b)
                pct = [[] for _ in envs]
                for _ in range(AB_ROUNDS):
                    for i, env in enumerate(envs):
                        _apply(env, names)
                        pct[i].append(moved / device_time(call, flush, reps=reps) / bw * 100)
                cells = [f"{' '.join(f'{p:.1f}' for p in pct[i])} (err {errs[i]:.0e})" for i in range(len(envs))]
                name = "x".join(map(str, shape)) + (" dim1" if channels else "")
                print(f"{'RMS' if rms else 'LN':<4}{name} {dtype_label(dt):<9}" + " | ".join(cells), flush=True)
            del x, w, b
            torch.cuda.empty_cache()
    _apply({}, names)


def _sweep_row(label):
    """A BenchCase from a sweep label: "LN fp32 36x3378 off3", "RMS bf16 1000000x1" (over the last dim),
    "RMS bf16 36x72x31x33 dim1" (over dim 1)."""
    from fastnorm.bench.cases import DTYPES, OP_SHORT, BenchCase

    ops = {short: op for op, short in OP_SHORT.items()}
    words = [w for w in label.split() if w not in ("last", "dim1")]
    try:
        shape = tuple(int(s) for s in words[2].split("x"))
        layout = {w[:3]: int(w[3:]) for w in words[3:]}
        if words[0] not in ops or words[1] not in DTYPES or set(layout) - {"off", "pad"}:
            raise ValueError
    except (IndexError, ValueError):
        raise SystemExit(f"devtool.py abrows: cannot read the row {label!r} (e.g. \"LN fp32 36x3378 off3\")")
    dims = (1,) if "dim1" in label.split() else (len(shape) - 1,)
    return BenchCase("ab", ops[words[0]], words[1], shape, dims, True, offset=layout.get("off", 0),
                     pad=layout.get("pad", 0))


def run_ab_rows(args):
    import statistics

    from fastnorm.bench.cases import eager_fn, fastnorm_fn, make_grad_output, make_inputs
    from fastnorm.bench.modes import needs_grad, timed_call
    from fastnorm.bench.runner import _compile_settings
    from fastnorm.harness.timing import time_callable

    if not args.rest:
        raise SystemExit("devtool.py abrows: give the rows after --: abrows VARIANT [VARIANT ...] -- ROW [ROW ...]")
    rows = [_sweep_row(label) for label in args.rest]
    envs = [_parse_variant(v) for v in args.variants]
    names = {name for env in envs for name in env}
    reps = int(os.environ.get("AB_REPS", "30"))
    dev = torch.device("cuda")
    grad = needs_grad(args.mode)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: {args.mode}, us, median of {AB_ROUNDS} rounds "
          f"of {reps} calls; variants: {' | '.join(args.variants)} | compile", flush=True)
    with _compile_settings(args.mode):  # bwd: compile's backward must allow retain_graph
        for case in rows:
            x, w, b = make_inputs(case, dev, requires_grad=grad)
            dy = make_grad_output(case, dev) if grad else None
            ours, ref = fastnorm_fn(case), eager_fn(case)
            wide = [None if t is None else t.detach().double().requires_grad_(grad) for t in (x, w, b)]
            # The error of the output (fwd) or of dx (bwd, train) against float64, relative to its largest value.
            exact = ref(*wide) if not grad else timed_call("train", ref, *wide, dy.double())()[0]
            scale = exact.abs().max().item()
            torch._dynamo.reset()  # each row its own compiled function: no recompile limit
            compiled = torch.compile(ref, dynamic=False)
            compiled_call = timed_call(args.mode, compiled, x, w, b, dy)
            compiled_call()
            errs, calls = [], []
            for env in envs:
                _apply(env, names)
                calls.append(timed_call(args.mode, ours, x, w, b, dy))  # bwd: the forward runs under this variant
                out = calls[-1]()
                errs.append((out if not grad else out[0]).double().sub(exact).abs().max().item() / scale)
            times = [[] for _ in range(len(envs) + 1)]
            for _ in range(AB_ROUNDS):
                for i, env in enumerate(envs):
                    _apply(env, names)
                    times[i].append(time_callable(calls[i], device=dev, trials=reps,
                                                  include_host=False).median_ms * 1000)
                times[-1].append(time_callable(compiled_call, device=dev, trials=reps,
                                               include_host=False).median_ms * 1000)
            med = [statistics.median(t) for t in times]
            ratios = "  ".join(f"{med[-1] / m:.2f}x" for m in med[:-1])
            print(f"{case.label:34} {'  '.join(f'{m:7.2f}' for m in med)}   vs compile {ratios}   err {max(errs):.1e}",
                  flush=True)
            del x, w, b, dy, exact, calls, compiled_call
    _apply({}, names)


REPO = Path(__file__).resolve().parents[2]


def _family_pair(name):
    """problems/NAME.py and solutions/NAME.py (the family suite's pairs), or a usage error."""
    problem, solution = REPO / "problems" / f"{name}.py", REPO / "solutions" / f"{name}.py"
    if not (problem.is_file() and solution.is_file()):
        raise SystemExit(f"devtool.py abfamily: no problems/{name}.py with a solutions/{name}.py")
    return problem, solution


def _kernel_list(fn, calls=3):
    """'kinds, launches, sum' and the kernels of one call of fn, longest first (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels = sorted(((e.key, e.device_time_total / calls, e.count // calls) for e in prof.key_averages()
                      if e.device_time_total > 0), key=lambda k: -k[1])
    return (f"{len(kernels)} kinds, {sum(n for _, _, n in kernels)} launches, "
            f"{sum(t for _, t, _ in kernels) / 1000:.4f} ms: " +
            "; ".join(f"{name[:40]} x{n} {t:.1f}us" for name, t, n in kernels[:12]))


def run_ab_family(args):
    import statistics

    from fastnorm.bench.family_suite import _import, _train_call
    from fastnorm.harness.timing import time_callable
    from fastnorm.solve.problem import load_problem

    if not args.rest:
        raise SystemExit("devtool.py abfamily: give the problems after --: abfamily VARIANT [VARIANT ...] -- "
                         "PROBLEM ...")
    pairs = [_family_pair(name) for name in args.rest]
    envs = [_parse_variant(v) for v in args.variants]
    names = {name for env in envs for name in env}
    reps = int(os.environ.get("AB_REPS", "10"))
    dev = torch.device("cuda")
    what = "forward + backward" if args.train else "forward"
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}: ms ({what}), median of {AB_ROUNDS} rounds of "
          f"{reps} calls; variants: {' | '.join(args.variants)} | compile", flush=True)
    for problem, solution in pairs:
        reference = load_problem(problem)
        torch.manual_seed(0)
        inputs = reference.inputs(dev)
        model = reference.build_model(dev)
        model_new = _import(solution, "ab").ModelNew(*reference.init_inputs()).to(dev)
        model_new.load_state_dict(model.state_dict())
        compiled = torch.compile(model)
        if args.train:
            for t in inputs:
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    t.requires_grad_(True)
            dy = torch.randn_like(model(*inputs))
            ours, theirs = _train_call(model_new, inputs, dy), _train_call(compiled, inputs, dy)
        else:
            ours, theirs = (lambda: model_new(*inputs)), (lambda: compiled(*inputs))
        with torch.enable_grad() if args.train else torch.no_grad():
            theirs()
            times = [[] for _ in range(len(envs) + 1)]
            for _ in range(AB_ROUNDS):
                for i, env in enumerate(envs):
                    _apply(env, names)
                    times[i].append(time_callable(ours, device=dev, trials=reps, include_host=False).median_ms)
                times[-1].append(time_callable(theirs, device=dev, trials=reps, include_host=False).median_ms)
            med = [statistics.median(t) for t in times]
            print(f"{problem.stem}: " + "  ".join(f"{m:.4f}" for m in med) + "   vs compile " +
                  "  ".join(f"{med[-1] / m:.4f}x" for m in med[:-1]), flush=True)
            _apply(envs[0], names)
            print(f"   kernels ({args.variants[0]}): {_kernel_list(ours)}", flush=True)
            print(f"   kernels (compile): {_kernel_list(theirs)}", flush=True)
        _apply({}, names)
        inputs = model = model_new = compiled = ours = theirs = dy = None  # noqa: F841 (the next problem is huge)
        torch.cuda.empty_cache()


def _sweep_args(p):
    p.add_argument("shapes", nargs="*", type=parse_shape, metavar="MxN",
                   help="rows to sweep (default: 16384x4096 4096x16384 65536x1024, where Triton leads in bf16)")
    p.add_argument("--quick", action="store_true", help="the planner's choice (threads=0) only, no torch.compile")


def _variants_then(p, command, rest, rest_help, flags=""):
    """The A/B commands' arguments: VARIANT ... (environment settings), then --, then what they run on (args.rest)."""
    p.usage = f"devtool.py {command} [-h] {flags}VARIANT [VARIANT ...] -- {rest} [{rest} ...]"
    p.set_defaults(takes_rest=True)
    p.add_argument("variants", nargs="+", metavar="VARIANT",
                   help="NAME=VALUE[,NAME=VALUE...] set for that variant, or - for none (the defaults); then --, "
                        "then " + rest_help)


def _ab_args(p):
    _variants_then(p, "ab", "SHAPE", "the shapes: MxN (over the last dim) or AxCxHxW (over dim 1, the channels). "
                   "AB_REPS (default 30) sets the timed calls a round; 3 rounds alternate the variants")


def _ab_rows_args(p):
    p.add_argument("--mode", choices=("fwd", "bwd", "train"), default="fwd",
                   help="what is timed, as fastnorm bench --mode: forward, backward alone, or both (default fwd)")
    _variants_then(p, "abrows", "ROW", "the rows as the sweep labels them: \"LN fp32 36x3378 off3\", \"RMS bf16 "
                   "1000000x1\" (last dim; offN / padN), \"RMS bf16 36x72x31x33 dim1\" (channels). AB_REPS (default "
                   "30) sets the timed calls a round; 3 rounds alternate the variants, torch.compile beside",
                   flags="[--mode M] ")


def _ab_family_args(p):
    p.add_argument("--train", action="store_true", help="forward + backward (gradients of x and the parameters)")
    _variants_then(p, "abfamily", "PROBLEM", "problem names with a solutions/ file (batch_norm_64x64x512x512). "
                   "AB_REPS (default 10) sets the timed calls a round; 3 rounds alternate the variants, "
                   "torch.compile beside; then the first variant's kernels and compile's", flags="[--train] ")


COMMANDS = (
    Command("sweep", "device time (% of copy) of the last-dim kernels under each threads-per-row override "
            "(0 = the planner's choice), against torch.compile", "devtool.py sweep 16384x4096 --quick", run_sweep,
            _sweep_args),
    Command("split", "device time of the split-row kernel under several (threads, blocks_per_row) overrides "
            "on long rows", "devtool.py split", run_split),
    Command("configs", "every threads x blocks_per_row override the solver may try, on several layouts, "
            "checked against float64 (run with CUDA_LAUNCH_BLOCKING=1 to name a failing one at once)",
            "CUDA_LAUNCH_BLOCKING=1 devtool.py configs", run_configs),
    Command("ab", "same-process A/B of switches read from environment variables at each call: float64 error "
            "and % of copy of each variant over alternating rounds",
            "devtool.py ab FASTNORM_X=0 FASTNORM_X=1 -- 1024x65536 256x262144", run_ab, _ab_args),
    Command("abfamily", "same-process A/B of environment switches on the family problems (problems/ with a "
            "solutions/ ModelNew): ms against torch.compile of the reference, and every kernel of a call",
            "devtool.py abfamily - FASTNORM_FAMILY_SET_KB=0 -- l2_norm_32768x65535", run_ab_family, _ab_family_args),
    Command("abrows", "same-process A/B of environment switches on the sweep's rows (misaligned and padded ones "
            "too): us of each variant against torch.compile, float64 error",
            "devtool.py abrows - FASTNORM_OFFSET_ROW_FILL=0 -- \"RMS bf16 436x792 off1\"", run_ab_rows, _ab_rows_args),
)
