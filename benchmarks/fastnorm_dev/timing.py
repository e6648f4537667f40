"""Timings of fixed shapes: fastnorm against PyTorch eager / torch.compile (time), device and host time of
each call (breakdown), host time per call (host), latency-bound rows (latency), multi-MB rows (resident).

`latency` and `resident` print one line per run, for A/B runs of two builds on the GPU machine: run
each once per build (different PYTHONPATH / TORCH_EXTENSIONS_DIR) and alternate the builds a few times.
"""
import torch
import torch.nn.functional as F

from fastnorm_dev import Command
from fastnorm_dev.measure import (affine_params, channel_rms_ref, copy_bandwidth, device_line, device_time,
                                  dtype_label, flush_buffer, float64_norm, host_us_per_call, norm_bytes,
                                  parse_shape, relative_error, torch_norm)

SUITE_SHAPES = ((16384, 4096), (4096, 16384), (65536, 1024), (1024, 65536), (256, 262144), (16, 4194304),
                (1, 4096), (32, 4096))  # the last-dim and latency rows of `fastnorm bench`
LATENCY_SHAPES = ((1, 4096), (32, 4096), (64, 1024), (100, 2048))


def run_time(args):
    import fastnorm

    flush = flush_buffer()
    bw = copy_bandwidth(flush)
    print(device_line(bw), flush=True)

    cases = []
    for dt in (torch.float32, torch.bfloat16):
        cases.append(("LN seed", (16, 64, 256, 256), dt, "ln3"))
        cases.append(("RMS seed", (112, 64, 512, 512), dt, "rmsc"))
        for m, n in SUITE_SHAPES:
            cases.append((f"LN {m}x{n}", (m, n), dt, "ln1"))
            cases.append((f"RMS {m}x{n}", (m, n), dt, "rms1"))
    print(f"{'case':<22}{'dtype':<10}{'fastnorm us':>12}{'%copy':>7}{'eager us':>10}{'compile us':>11}{'err':>10}",
          flush=True)
    for name, shape, dt, kind in cases:
        torch.cuda.empty_cache()
        x = torch.randn(shape, device="cuda", dtype=dt)
        if kind == "ln3":
            w, b = affine_params(shape[1:], dt)
            ours = lambda: fastnorm.layer_norm(x, shape[1:], w, b, 1e-5)
            eager = lambda: F.layer_norm(x, shape[1:], w, b, 1e-5)
            nbytes = norm_bytes(x, w, b)
        elif kind == "rmsc":
            ours = lambda: fastnorm.rms_norm(x, None, None, 1e-5, dim=1)
            eager = lambda: channel_rms_ref(x)
            nbytes = norm_bytes(x)
        elif kind == "ln1":
            w, b = affine_params(shape[-1], dt)
            ours = lambda: fastnorm.layer_norm(x, shape[-1:], w, b, 1e-5)
            eager = lambda: F.layer_norm(x, shape[-1:], w, b, 1e-5)
            nbytes = norm_bytes(x, w, b)
        else:
            w = torch.rand(shape[-1], device="cuda", dtype=dt) + 0.5
            ours = lambda: fastnorm.rms_norm(x, shape[-1:], w, 1e-5)
            eager = lambda: F.rms_norm(x, shape[-1:], w, 1e-5)
            nbytes = norm_bytes(x, w)
        try:
            ref = eager()
            err = (ours().float() - ref.float()).abs().max().item()
            del ref
            t_ours = device_time(ours, flush)
            t_eager = device_time(eager, flush, reps=10)
            t_comp = float("nan")
            if not args.no_compile:
                torch._dynamo.reset()
                t_comp = device_time(torch.compile(eager), flush, reps=10)
            print(f"{name:<22}{dtype_label(dt):<10}{t_ours * 1e6:>12.1f}{100 * nbytes / t_ours / bw:>7.1f}"
                  f"{t_eager * 1e6:>10.1f}{t_comp * 1e6:>11.1f}{err:>10.2e}", flush=True)
        except torch.OutOfMemoryError:
            print(f"{name:<22}{dtype_label(dt):<10} skipped: out of memory", flush=True)
        del x
        torch.cuda.empty_cache()


def run_breakdown(args):
    import fastnorm

    flush = flush_buffer()
    bw = copy_bandwidth(flush, reps=40)
    print(device_line(bw), flush=True)
    x = torch.randn(4, 64, device="cuda")
    w, b = torch.rand(64, device="cuda"), torch.randn(64, device="cuda")
    host = {name: host_us_per_call(fn, 3000) for name, fn in (
        ("F.layer_norm", lambda: F.layer_norm(x, (64,), w, b)),
        ("fastnorm.layer_norm", lambda: fastnorm.layer_norm(x, (64,), w, b)),
        ("F.rms_norm", lambda: F.rms_norm(x, (64,), w, 1e-5)),
        ("fastnorm.rms_norm", lambda: fastnorm.rms_norm(x, (64,), w, 1e-5)))}
    print("host us/call (4x64 fp32, no sync): " + "  ".join(f"{k} {v:.1f}" for k, v in host.items()), flush=True)
    print(f"{'op':<4}{'dtype':<6}{'shape':<12}{'ours sync':>10}{'nosync':>8}{'%copy':>7}{'%copy ns':>9}"
          f"{'eager sync':>11}{'nosync':>8}{'copy ns':>8}")

    def us(fn, sync):
        return device_time(fn, flush, reps=40, sync_after_flush=sync) * 1e6
    for dname in args.dtype.split(","):
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dname]
        for shape in args.shapes.split(","):
            m, n = parse_shape(shape)
            torch.cuda.empty_cache()
            x = torch.randn(m, n, device="cuda", dtype=dt)
            w = (torch.rand(n, device="cuda") + 0.5).to(dt)
            b = torch.randn(n, device="cuda").to(dt)
            xs, ys = x.view(-1).clone(), torch.empty_like(x).view(-1)
            cp = us(lambda: ys.copy_(xs), False)
            del xs, ys
            for op in ("LN", "RMS"):
                if op == "LN":
                    ours = lambda: fastnorm.layer_norm(x, (n,), w, b, 1e-5)
                    eager = lambda: F.layer_norm(x, (n,), w, b, 1e-5)
                    nbytes = norm_bytes(x, w, b)
                else:
                    ours = lambda: fastnorm.rms_norm(x, (n,), w, 1e-5)
                    eager = lambda: F.rms_norm(x, (n,), w, 1e-5)
                    nbytes = norm_bytes(x, w)
                err = (ours().float() - eager().float()).abs().max().item()
                o_s, o_n = us(ours, True), us(ours, False)
                e_s, e_n = us(eager, True), us(eager, False)
                pc = lambda t: 100 * nbytes / (t * 1e-6) / bw
                print(f"{op:<4}{dname:<6}{shape:<12}{o_s:10.1f}{o_n:8.1f}{pc(o_s):7.1f}{pc(o_n):9.1f}"
                      f"{e_s:11.1f}{e_n:8.1f}{cp:8.1f}  err {err:.1e}", flush=True)
            del x, w, b


def run_host(args):
    import fastnorm
    from fastnorm.ops import extension

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(4, 64, device=dev)
    w = torch.rand(64, device=dev)
    b = torch.randn(64, device=dev)
    ext = extension.load(dev)
    calls = {
        "F.layer_norm": lambda: F.layer_norm(x, (64,), w, b),
        "fastnorm.layer_norm": lambda: fastnorm.layer_norm(x, (64,), w, b),
        "torch.ops.fastnorm.layer_norm": lambda: torch.ops.fastnorm.layer_norm(x, 1, 2, w, b, 1e-5),
        "ext.norm_forward": lambda: ext.norm_forward(x, w, b, 1, 2, 1e-5, False, 0, 0),
    }
    for name, fn in calls.items():
        print(f"{name:<32}{host_us_per_call(fn, 2000, dev, wait_for_device=True):8.1f} us/call", flush=True)


def run_latency(args):
    from fastnorm.ops import extension

    ext = extension.load("cuda")
    flush = flush_buffer()
    cells = []
    for dt in (torch.bfloat16, torch.float32):
        for m, n in LATENCY_SHAPES:
            x = torch.randn(m, n, device="cuda", dtype=dt)
            w, b = affine_params(n, dt)
            for rms in (False, True):
                def call():
                    return ext.norm_forward(x, w, None if rms else b, 1, 2, 1e-5, rms, 0, 0)
                ref = torch_norm(x, w, b, rms)()
                wrong = (call().float() - ref.float()).abs().max().item() > 5e-2
                us = device_time(call, flush, reps=200) * 1e6
                cell = f"{'RMS' if rms else 'LN'} {m}x{n} {dtype_label(dt)}: {us:.2f}"
                cell += " WRONG" if wrong else ""
                if args.compile:
                    compiled = torch_norm(x, w, b, rms, compiled=True)
                    cell += f" compile {device_time(compiled, flush, reps=200) * 1e6:.2f}"
                cells.append(cell)
    print(args.label + " | " + " | ".join(cells), flush=True)


def run_resident(args):
    from fastnorm.ops import extension

    ext = extension.load("cuda")
    m, n = args.shape
    flush = flush_buffer()
    bw = copy_bandwidth(flush, reps=20)
    cells = []
    for dt in (torch.float32, torch.bfloat16):
        x = torch.randn(m, n, device="cuda", dtype=dt) + 3
        w, b = affine_params(n, dt)
        for rms in (False, True):
            def call():
                return ext.norm_forward(x, w, None if rms else b, 1, 2, 1e-5, rms, 0, 0)
            ref = float64_norm(x, w, b, 1, 2, rms)
            err = relative_error(call(), ref)
            del ref
            t = device_time(call, flush, reps=50)
            moved = norm_bytes(x, w) if rms else norm_bytes(x, w, b)
            cells.append(f"{'RMS' if rms else 'LN'} {dtype_label(dt)}: {t * 1e6:.1f} us {moved / t / bw * 100:.1f}% "
                         f"err {err:.1e}")
    print(f"{args.label} {m}x{n} (copy {bw / 1e9:.0f} GB/s) | " + " | ".join(cells), flush=True)


def _time_args(p):
    p.add_argument("--no-compile", action="store_true", help="leave torch.compile out")


def _breakdown_args(p):
    p.add_argument("--dtype", default="fp32,bf16", help="comma-separated: fp32, bf16 (default both)")
    p.add_argument("--shapes", default=",".join(f"{m}x{n}" for m, n in SUITE_SHAPES),
                   help="comma-separated MxN (default: the bench suite's last-dim and latency rows)")


def _latency_args(p):
    p.add_argument("label", help="names the build in the output line")
    p.add_argument("--compile", action="store_true", help="time torch.compile of each row too")


def _resident_args(p):
    p.add_argument("label", help="names the build in the output line")
    p.add_argument("shape", nargs="?", type=parse_shape, default=(16, 4194304),
                   help="ROWSxN (default 16x4194304)")


COMMANDS = (
    Command("time", "fastnorm vs PyTorch eager and torch.compile on the seed and last-dim shapes: us, % of copy, "
            "max error", "devtool.py time --no-compile", run_time, _time_args),
    Command("breakdown", "where a call's time goes: CUDA-event time with the host path counted (sync after the "
            "L2 flush) and hidden (no sync), fastnorm, eager and a copy, per last-dim shape; host us per call",
            "devtool.py breakdown --dtype bf16 --shapes 16384x4096", run_breakdown, _breakdown_args),
    Command("host", "host time per call (us) of fastnorm's entry points vs F.layer_norm on a tiny tensor "
            "(GPU, or CPU without one)", "devtool.py host", run_host),
    Command("latency", "device time of latency-bound rows (fewer rows than SMs, short rows), optionally against "
            "torch.compile: one line per run", "devtool.py latency new --compile", run_latency, _latency_args),
    Command("resident", "device time, % of copy and float64 error of multi-MB rows (the resident kernel), LN and "
            "RMS in fp32 and bf16: one line per run", "devtool.py resident new 16x4194304", run_resident,
            _resident_args),
)
