"""Scalar-row shapes (odd n, misaligned row starts) of issue 27: fastnorm against PyTorch eager and
torch.compile, device time with the L2 flushed, % of a device copy. Run on the GPU machine:
    python benchmarks/odd_rows.py [--alt VAR=VALUE] [--no-compile] [--group GROUP ...]
The "alt" column times fastnorm again with VAR=VALUE set (default FASTNORM_OFFSET_ROWS=0: the row kernel's
scalar path, as before the scalar-row kernels; FASTNORM_OFFSET_ROWS=chunked or =warp picks one of the
two offset-row kernels where both can take a case). A case is (rows, n), dtype, the storage offset of x in elements and
the padding of its rows (row stride n + pad).
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fastnorm_dev.measure import AltRun, device_time, torch_norm  # noqa: E402

CASES = [("scalar", c) for c in [((100000, 257), torch.float32, 0, 0), ((100000, 257), torch.bfloat16, 0, 0),
         ((65536, 1000), torch.float32, 1, 0), ((200000, 129), torch.float16, 0, 0),
         ((32768, 1023), torch.bfloat16, 1, 0), ((100000, 256), torch.float32, 1, 0), ((4096, 771), torch.float32, 0, 0),
         ((1000000, 1), torch.bfloat16, 0, 0), ((500000, 7), torch.float32, 0, 0), ((122227, 17), torch.float32, 1, 0),
         ((1000000, 3), torch.float16, 0, 0), ((300000, 31), torch.bfloat16, 1, 0),
         # rows of the sweep (issue 27) past 1024 elements or a warp's width, which took the row kernel's scalar path
         ((834, 1429), torch.float32, 0, 0), ((36, 3378), torch.float32, 3, 0), ((18120, 5818), torch.float32, 0, 64),
         ((669317, 32), torch.float32, 2, 0), ((4713, 257), torch.float32, 0, 0), ((11231, 1997), torch.bfloat16, 0, 0),
         ((16384, 4097), torch.bfloat16, 0, 0), ((8192, 3000), torch.float16, 0, 0),
         # rows under 32 of the sweep (the thread-row kernel): unpadded, at an offset, padded
         ((1000000, 2), torch.float32, 0, 0), ((1000000, 2), torch.bfloat16, 0, 0), ((950, 26), torch.float32, 0, 0),
         ((86264, 11), torch.float32, 0, 0), ((726, 2), torch.float16, 0, 0), ((1000000, 4), torch.bfloat16, 1, 0),
         ((258797, 12), torch.bfloat16, 2, 0), ((15853, 16), torch.float32, 0, 17), ((585623, 8), torch.bfloat16, 0, 1),
         ((1000000, 19), torch.bfloat16, 0, 3)]] + [("shifted", c) for c in [
         # rows of the sweep whose x starts at other offsets than y (x a view, "off"): the chunked kernel
         # reads them realigned; before, those of 1025+ elements took the row kernel's scalar path
         ((1762, 4744), torch.bfloat16, 3, 0), ((1074, 8567), torch.bfloat16, 3, 0), ((2571, 8595), torch.bfloat16, 2, 0),
         ((436, 792), torch.bfloat16, 1, 0), ((197805, 256), torch.bfloat16, 1, 0), ((28532, 3938), torch.float32, 1, 0),
         ((331, 1536), torch.float32, 3, 0), ((9, 4973), torch.float32, 1, 0), ((3, 10768), torch.bfloat16, 0, 35),
         ((323, 1532), torch.bfloat16, 0, 8), ((32768, 1023), torch.float16, 1, 0),
         # rows past 512 threads of 4 chunks: 8 chunks a thread (not float16)
         ((162, 19257), torch.bfloat16, 0, 0), ((2000, 12001), torch.float32, 1, 0), ((400, 25000), torch.bfloat16, 1, 0),
         ((1024, 30001), torch.bfloat16, 0, 0)]] + [("long", c) for c in [
         # few or long scalar rows past the offset-row kernels: split, streamed, cluster and cached row
         # kernels at one element a vector (sweep rows and their neighbours)
         ((1, 366452), torch.bfloat16, 0, 0), ((1, 2784270), torch.bfloat16, 0, 0), ((11, 22150), torch.float16, 0, 0),
         ((1, 163037), torch.float32, 0, 0), ((1, 238830), torch.float32, 0, 0), ((1, 1414261), torch.float32, 0, 0),
         ((1, 30724), torch.float32, 1, 3), ((23, 126001), torch.float32, 0, 0), ((4, 9592278), torch.float16, 0, 0),
         ((2000, 20001), torch.float16, 0, 0), ((300, 40001), torch.bfloat16, 0, 0), ((512, 100001), torch.bfloat16, 0, 0),
         ((64, 300001), torch.float32, 0, 0)]]


def main():
    run = AltRun(__doc__, "FASTNORM_OFFSET_ROWS=0", groups=("scalar", "shifted", "long"))
    import fastnorm
    flush, bw = run.flush, run.bandwidth
    print(f"{'case':<34}{'fastnorm us':>12}{'%copy':>7}{'alt':>11}{'eager us':>10}{'compile us':>11}"
          f"{'vs compile':>11}")
    for (m, n), dt, off, pad in (case for group, case in CASES if group in run.groups):
        base = torch.randn(m * (n + pad) + off, device="cuda", dtype=dt)
        x = base[off:].view(m, n + pad)[:, :n]
        w, b = torch.rand(n, device="cuda", dtype=dt) + 0.5, torch.randn(n, device="cuda", dtype=dt)
        for rms in (False, True):
            ours = (lambda: fastnorm.rms_norm(x, (n,), w, 1e-5)) if rms else (lambda: fastnorm.layer_norm(x, (n,), w, b, 1e-5))
            ref = torch_norm(x, w, b, rms)
            err = (ours().float() - ref().float()).abs().max().item()
            t, t_row = run.times(ours)
            te = device_time(ref, flush)
            tc = device_time(torch_norm(x, w, b, rms, compiled=True), flush) if run.compile else float("nan")
            nbytes = 2 * x.numel() * x.element_size()
            label = f"{'RMS' if rms else 'LN'} {str(dt)[6:]} {m}x{n}{f' off{off}' if off else ''}{f' pad{pad}' if pad else ''}"
            print(f"{label:<34}{t * 1e6:>12.1f}{100 * nbytes / t / bw:>7.1f}{t_row * 1e6:>11.1f}{te * 1e6:>10.1f}"
                  f"{tc * 1e6:>11.1f}"
                  f"{tc / t:>10.2f}x  err {err:.1e}", flush=True)
        del base, x


if __name__ == "__main__":
    main()
