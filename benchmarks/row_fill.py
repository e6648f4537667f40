"""The row kernel's fill rule (kernels/planner.cuh kRowFillBlocks) on small calls: FASTNORM_ROW_FILL=1 (the
default: fewer vectors a thread until the SMs get two blocks each) against 0 (4 vectors a thread, as before),
torch.compile beside, in interleaved rounds, device timing (L2 flushed), microseconds.

    python3 benchmarks/row_fill.py        # on a CUDA machine, fastnorm importable
"""
import os, statistics, torch, torch.nn.functional as F
import fastnorm
from fastnorm.harness.timing import time_callable
dev = torch.device("cuda")
SHAPES = [((246, 1024), torch.float32), ((1000, 1000), torch.float32), ((300, 2048), torch.float32), ((500, 512), torch.float32),
          ((1071, 768), torch.bfloat16), ((300, 2048), torch.bfloat16), ((1000, 1000), torch.bfloat16), ((200, 4096), torch.bfloat16),
          ((16384, 4096), torch.bfloat16), ((8192, 1024), torch.float32)]
print(torch.cuda.get_device_name(), "us, medians of 30 a round, 3 rounds: fill | nofill | compile", flush=True)
for shape, dt in SHAPES:
    x = torch.randn(shape, device=dev, dtype=dt) + 3
    n = shape[-1]
    w = torch.rand(n, device=dev, dtype=dt) + 0.5
    b = torch.randn(n, device=dev, dtype=dt)
    for rms in (False, True):
        ours = (lambda: fastnorm.rms_norm(x, (n,), w, 1e-5)) if rms else (lambda: fastnorm.layer_norm(x, (n,), w, b, 1e-5))
        ref = (lambda: F.rms_norm(x, (n,), w, 1e-5)) if rms else (lambda: F.layer_norm(x, (n,), w, b, 1e-5))
        comp = torch.compile(ref, dynamic=False)
        torch._dynamo.reset()  # each shape its own compiled function: no recompile limit
        comp()
        errs = []
        for v in ("1", "0"):
            os.environ["FASTNORM_ROW_FILL"] = v
            errs.append(((ours().double() - ref().double()).abs().max()).item())
        res = {"fill": [], "nofill": [], "compile": []}
        for _ in range(3):
            for k, v in (("fill", "1"), ("nofill", "0")):
                os.environ["FASTNORM_ROW_FILL"] = v
                res[k].append(time_callable(ours, device=dev, trials=30, include_host=False).median_ms * 1000)
            res["compile"].append(time_callable(comp, device=dev, trials=30, include_host=False).median_ms * 1000)
        med = {k: statistics.median(t) for k, t in res.items()}
        print(f"{'RMS' if rms else 'LN':3} {'x'.join(map(str, shape)):10} {str(dt)[6:]:9} fill {med['fill']:6.2f}  nofill {med['nofill']:6.2f}  "
              f"compile {med['compile']:6.2f}  fill/nofill {med['nofill']/med['fill']:.3f}x  vs compile {med['compile']/med['fill']:.3f}x  "
              f"err {max(errs):.1e}  rounds " + "; ".join(",".join(f"{t:.2f}" for t in ts) for ts in res.values()), flush=True)
os.environ["FASTNORM_ROW_FILL"] = "1"
