"""Rows of 1-31 elements (issue 27): the thread-row kernel against the row kernel it replaced
(FASTNORM_OFFSET_ROWS=0), device time with the L2 flushed, 1000000 rows each, then torch.profiler's kernel time
of one case. Run on the GPU machine: python benchmarks/tiny_rows.py
"""
import os, sys, torch, fastnorm
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fastnorm_dev.measure import device_time, flush_buffer
from torch.profiler import profile, ProfilerActivity
flush = flush_buffer()
for dt in (torch.float16, torch.bfloat16, torch.float32):
    for n in (1, 2, 3, 4, 5, 7, 8, 17, 31):
        x = torch.randn(1000000, n, device="cuda", dtype=dt); w = torch.rand(n, device="cuda", dtype=dt) + 0.5
        b = torch.randn(n, device="cuda", dtype=dt)
        res = []
        for rms in (False, True):
            f = (lambda: fastnorm.rms_norm(x, (n,), w, 1e-5)) if rms else (lambda: fastnorm.layer_norm(x, (n,), w, b, 1e-5))
            res.append(device_time(f, flush) * 1e6)
            os.environ["FASTNORM_OFFSET_ROWS"] = "0"; res.append(device_time(f, flush) * 1e6); os.environ.pop("FASTNORM_OFFSET_ROWS")
        print(f"{str(dt)[6:]:9s} 1000000x{n:<3d} LN {res[0]:7.1f} (row {res[1]:7.1f})  RMS {res[2]:7.1f} (row {res[3]:7.1f})", flush=True)
x = torch.randn(1000000, 3, device="cuda", dtype=torch.float16); w = torch.rand(3, device="cuda", dtype=torch.float16) + 0.5
for _ in range(3): fastnorm.rms_norm(x, (3,), w, 1e-5)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(10): fastnorm.rms_norm(x, (3,), w, 1e-5)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=5))
