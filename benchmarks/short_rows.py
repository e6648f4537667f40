"""Short aligned rows (qk-norm sized, 64-128 elements), issue 27: the row kernel at each threads-a-row override
(ext.norm_forward's `threads`: 1-32) against the default plan and torch.compile; device time, L2 flushed, % of
copy. `--ncu`: one default call and one compiled call of RMS bf16 1000000x64 between cudaProfilerStart/Stop.
Run on the GPU machine: python benchmarks/short_rows.py [--ncu]"""
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import fastnorm
from fastnorm.ops import extension

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fastnorm_dev.measure import copy_bandwidth, device_time, flush_buffer  # noqa: E402

ext = extension.load("cuda")
if "--ncu" in sys.argv:
    x = torch.randn(1000000, 64, device="cuda", dtype=torch.bfloat16); w = torch.rand(64, device="cuda", dtype=torch.bfloat16)
    comp = torch.compile(F.rms_norm)
    for f in (lambda: fastnorm.rms_norm(x, (64,), w, 1e-5), lambda: comp(x, (64,), w, 1e-5)):
        f(); f(); torch.cuda.synchronize(); torch.cuda.cudart().cudaProfilerStart(); f(); torch.cuda.synchronize(); torch.cuda.cudart().cudaProfilerStop()
    sys.exit()
flush = flush_buffer(); bw = copy_bandwidth(flush)
print(f"copy {bw/1e9:.0f} GB/s")
for (m, n), dt in [((1000000, 64), torch.bfloat16), ((179484, 64), torch.float16), ((105063, 128), torch.float16),
                   ((262144, 128), torch.bfloat16), ((95581, 128), torch.float32), ((1000000, 64), torch.float32)]:
    x = torch.randn(m, n, device="cuda", dtype=dt); w = torch.rand(n, device="cuda", dtype=dt) + 0.5; b = torch.randn(n, device="cuda", dtype=dt)
    nbytes = 2 * x.numel() * x.element_size()
    for rms in (False, True):
        cols = []
        f = (lambda: fastnorm.rms_norm(x, (n,), w, 1e-5)) if rms else (lambda: fastnorm.layer_norm(x, (n,), w, b, 1e-5))
        cols.append(("def", device_time(f, flush)))
        for t in (1, 2, 4, 8, 16, 32):
            g = lambda t=t: ext.norm_forward(x, w, None if rms else b, 1, 2, 1e-5, rms, t, 0)
            cols.append((f"t{t}", device_time(g, flush)))
        torch._dynamo.reset()
        c = torch.compile(F.rms_norm if rms else F.layer_norm)
        h = (lambda: c(x, (n,), w, 1e-5)) if rms else (lambda: c(x, (n,), w, b, 1e-5))
        cols.append(("compile", device_time(h, flush)))
        print(f"{'RMS' if rms else 'LN'} {str(dt)[6:]} {m}x{n}: " + "  ".join(f"{k} {v*1e6:.1f} ({100*nbytes/v/bw:.0f}%)" for k, v in cols), flush=True)
