"""Long rows and few rows (split-slice, cluster and cached row kernels), LayerNorm and RMSNorm with weight
(and bias), device time with L2 flushed (fastnorm_dev.measure.device_time), microseconds.

    python3 benchmarks/long_rows.py                               # this tree
    PYTHONPATH=base/src TORCH_EXTENSIONS_DIR=/tmp/ext_base python3 benchmarks/long_rows.py   # another tree

Run both trees in turn in one device call, twice (results/h100-one-row-prefetch.txt).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fastnorm_dev.measure import device_time, flush_buffer  # noqa: E402

import fastnorm  # noqa: E402

CASES = [((1, 366452), torch.bfloat16), ((11, 22150), torch.float16), ((1, 163037), torch.float32),
         ((1, 238830), torch.float32), ((512, 100001), torch.bfloat16), ((300, 40001), torch.bfloat16),
         ((64, 300001), torch.float32), ((1024, 65536), torch.bfloat16), ((1024, 65536), torch.float32),
         ((8, 262144), torch.bfloat16), ((4, 1048576), torch.float32), ((128, 524288), torch.float32),
         ((2, 131072), torch.bfloat16), ((1, 1048576), torch.bfloat16), ((1, 262144), torch.float32),
         ((3, 200003), torch.float16)]


def main():
    flush = flush_buffer()
    for (m, n), dt in CASES:
        x = torch.randn(m, n, device="cuda", dtype=dt)
        w = torch.rand(n, device="cuda", dtype=dt) + 0.5
        b = torch.randn(n, device="cuda", dtype=dt)
        ln = device_time(lambda: fastnorm.layer_norm(x, (n,), w, b, 1e-5), flush)
        rms = device_time(lambda: fastnorm.rms_norm(x, (n,), w, 1e-5), flush)
        print(f"{str(dt)[6:]:>9} {m}x{n:<8} LN {ln * 1e6:8.1f}  RMS {rms * 1e6:8.1f}", flush=True)


if __name__ == "__main__":
    main()
