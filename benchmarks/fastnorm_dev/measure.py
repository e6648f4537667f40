"""Set-up and timing shared by the developer tools: the L2 flush buffer, CUDA-event timing, copy bandwidth,
host time per call, inputs and parameters, PyTorch and float64 references, bytes moved, shape arguments.

Timing here is the tools' own (a fixed number of repetitions, median), not `fastnorm bench`'s adaptive
plan: the tools compare builds and overrides in one process, where a fixed count keeps rounds alike.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F

FLUSH_BYTES = 256 << 20  # written before each timed call: larger than the H100's 50 MB L2


def flush_buffer() -> torch.Tensor:
    return torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")


def device_time(fn, flush, reps=30, sync_after_flush=False) -> float:
    """Median seconds of `fn` between CUDA events, after 3 warm-up calls, the L2 flushed before each call.
    sync_after_flush: the GPU is idle when the call starts, so its host work counts (as `fastnorm bench
    --timing host`); otherwise the call is issued while the flush runs and host work is hidden."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        if sync_after_flush:
            torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2] * 1e-3


def events_ms(fn, reps) -> float:
    """Milliseconds a call of `fn` over `reps` back-to-back calls between two CUDA events (no flush: for
    calls of many MB, which L2 cannot keep between them)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def group_norm_call(shape, groups, dtype, backward=False, activation=None, device="cuda"):
    """(call, x): fastnorm's GroupNorm forward kernel on random x, weight and bias, or (backward) the backward
    alone, autograd.grad of x, weight and bias through fastnorm.group_norm, as a call with no arguments."""
    import fastnorm
    from fastnorm.ops import extension

    x = torch.randn(shape, device=device, dtype=dtype)
    w = torch.randn(shape[1], device=device, dtype=dtype)
    b = torch.randn_like(w)
    if backward:
        leaves = [t.clone().requires_grad_() for t in (x, w, b)]
        y = fastnorm.group_norm(leaves[0], groups, leaves[1], leaves[2], activation=activation)
        dy = torch.randn_like(y)
        return (lambda: torch.autograd.grad(y, leaves, dy, retain_graph=True)), x
    ext = extension.load(torch.device(device).type)
    act = 1 if activation == "silu" else 0
    return (lambda: ext.group_norm_forward(x, w, b, groups, 1e-5, act)), x


def profiled_call(call, warmups: int) -> None:
    """`warmups` calls (torch.compile's first compiles and may tune), then one between cudaProfilerStart/Stop, for
    `ncu --profile-from-start off`."""
    for _ in range(warmups):
        call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    call()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def copy_bandwidth(flush, reps=30) -> float:
    """Bytes read + written per second by a 1 GiB device-to-device copy (random bytes)."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    return 2 * src.numel() / device_time(lambda: dst.copy_(src), flush, reps)


def device_line(bandwidth: float) -> str:
    """The first line most tools print: which GPU, and the copy bandwidth % of copy is taken against."""
    return f"{torch.cuda.get_device_name()}: copy {bandwidth / 1e9:.0f} GB/s"


class AltRun:
    """The set-up the A/B scripts share (odd_rows.py, channel_shapes.py): `--alt VAR=VALUE` (fastnorm timed
    again with that variable set, a tuning switch read at each call) and `--no-compile`; the flush buffer,
    the copy bandwidth and the first line printed."""

    def __init__(self, doc: str, default_alt: str, groups: tuple = ()):
        p = argparse.ArgumentParser(description=doc.split("\n")[0])
        p.add_argument("--alt", default=default_alt, help="VAR=VALUE for the alt column")
        p.add_argument("--no-compile", action="store_true", help="leave out torch.compile (its column shows nan)")
        if groups:
            p.add_argument("--group", choices=groups, action="append", help="only these groups of cases")
        args = p.parse_args()
        self.groups = set(getattr(args, "group", None) or groups)
        self.var, self.value = args.alt.split("=", 1)
        self.compile = not args.no_compile
        self.flush = flush_buffer()
        self.bandwidth = copy_bandwidth(self.flush)
        print(device_line(self.bandwidth), f"(alt: {self.var}={self.value})", flush=True)

    def times(self, fn) -> tuple:
        """Seconds of fn as it is, then with the alt variable set."""
        t = device_time(fn, self.flush)
        os.environ[self.var] = self.value
        try:
            return t, device_time(fn, self.flush)
        finally:
            os.environ.pop(self.var)


def host_us_per_call(fn, calls, device="cuda", wait_for_device=False) -> float:
    """Host microseconds per call over `calls` calls after 200 warm-up calls. wait_for_device: the
    clock stops after the device has finished them too (on a GPU slower than the host, device time
    shows); otherwise only the host's issue time counts."""
    cuda = torch.device(device).type == "cuda"
    for _ in range(200):
        fn()
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if cuda and wait_for_device:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if cuda:
        torch.cuda.synchronize()
    return seconds / calls * 1e6


def affine_params(shape, dtype):
    """Weight in [0.5, 1.5) and a standard-normal bias of `shape` on the GPU (the tools' parameters)."""
    return (torch.rand(shape, device="cuda", dtype=dtype) + 0.5, torch.randn(shape, device="cuda", dtype=dtype))


def torch_norm(x, w, b, rms, compiled=False, eps=1e-5):
    """PyTorch's norm over the last dim of x (F.rms_norm, or F.layer_norm with bias b) as a call with no
    arguments; compiled: torch.compile of it, from a fresh dynamo cache."""
    fn = F.rms_norm if rms else F.layer_norm
    if compiled:
        torch._dynamo.reset()
        fn = torch.compile(fn)
    args = (x, (x.shape[-1],), w, eps) if rms else (x, (x.shape[-1],), w, b, eps)
    return lambda: fn(*args)


def channel_rms_ref(x, eps=1e-5):
    """The channel RMSNorm seed in PyTorch ops: over dim 1, float32 accumulation, no weight."""
    xf = x.float()
    return (xf / torch.sqrt(torch.mean(xf ** 2, dim=1, keepdim=True) + eps)).to(x.dtype)


def float64_norm(x, w, b, begin, end, rms, eps=1e-5):
    """The exact reference: LayerNorm (with bias b) or RMSNorm of x over dims begin..end-1 in float64,
    weight and bias of shape x.shape[begin:end] (None: left out)."""
    xd = x.double()
    dims = tuple(range(begin, end))
    if rms:
        y = xd * torch.rsqrt(xd.pow(2).mean(dims, keepdim=True) + eps)
    else:
        centered = xd - xd.mean(dims, keepdim=True)
        y = centered * torch.rsqrt(centered.pow(2).mean(dims, keepdim=True) + eps)
    view = tuple(x.shape[begin:end]) + (1,) * (x.dim() - end)
    if w is not None:
        y = y * w.double().reshape(view)
    if b is not None and not rms:
        y = y + b.double().reshape(view)
    return y


def relative_error(out, ref) -> float:
    """Largest |out - ref| / max(|ref|, 1): relative where the reference is large, absolute near zero."""
    return ((out.double() - ref).abs() / ref.abs().clamp(min=1)).max().item()


def norm_bytes(x, *params) -> int:
    """Bytes a norm must move: x read once, y written once, each parameter given (not None) read once."""
    return 2 * x.numel() * x.element_size() + sum(p.numel() * p.element_size() for p in params if p is not None)


def dtype_label(dtype: torch.dtype) -> str:
    return str(dtype)[6:]  # torch.bfloat16 -> bfloat16


def parse_shape(text: str) -> tuple:
    """argparse type for a shape written AxB[xC...] ("16384x4096")."""
    try:
        shape = tuple(int(v) for v in text.lower().split("x"))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise argparse.ArgumentTypeError(f"not a shape: {text!r} (expected e.g. 16384x4096)")
    return shape
