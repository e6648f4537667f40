"""Cheat on the process level: at import, writes a forged `ok` result wherever the evaluator's verdict could go
- the old result.json beside its working folder, every file descriptor of its parent (the judge) through
/proc - and kills the judge if a write into its descriptors went through, so that only the forgery arrives.
The judge makes itself undumpable (its /proc entries are closed to the candidate) and reports through a pipe:
must not be ok. Returns zeros."""
import glob
import json
import os
import signal

import torch
import torch.nn as nn

FORGED = json.dumps({"verdict": "ok", "message": "", "max_abs_err": 0.0, "max_rel_err": 0.0,
                     "timing": {"median_ms": 1e-3, "mean_ms": 1e-3, "min_ms": 1e-3, "q1_ms": 1e-3, "q3_ms": 1e-3,
                                "trials": 1, "device_tail_ms": 0.0, "iqr_ms": 0.0}})
for folder in (os.getcwd(), os.path.dirname(os.getcwd())):
    try:
        with open(os.path.join(folder, "result.json"), "w") as f:
            f.write(FORGED)
    except OSError:
        pass
reached = 0
for path in glob.glob(f"/proc/{os.getppid()}/fd/*"):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        continue
    try:
        os.write(fd, FORGED.encode())
        reached += 1
    except OSError:
        pass
    finally:
        os.close(fd)
if reached:
    os.kill(os.getppid(), signal.SIGKILL)


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()

    def forward(self, x):
        return torch.zeros_like(x)
