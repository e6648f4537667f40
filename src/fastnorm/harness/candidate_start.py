"""Starting the candidate's process (candidate_process.py) from the judge, before the judge imports torch.

Torch-free and package-free on purpose: worker_entry.py loads this file by path and starts the candidate's
process first thing, so that the two interpreters import torch and open the GPU side by side instead of one
after the other. The candidate's process loads nothing of the candidate until the judge sends "import", by
which time the judge has closed itself to it.
"""
from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass
class StartedCandidate:
    proc: subprocess.Popen
    reply_fd: int      # the judge reads the candidate's process's messages here ...
    command_fd: int    # ... and writes its commands here


def start_candidate_process(cfg: dict, device: str) -> StartedCandidate:
    """Write the candidate process's config beside the judge's log and start it in the judge's session (it
    dies with the judge's process group). device: as the judge was told ("cuda", "cuda:0", "cpu"); both
    processes see the same CUDA_VISIBLE_DEVICES, so they resolve it to the same GPU."""
    close_to_other_processes()
    workdir = Path(cfg["log_path"]).parent
    config = {k: cfg.get(k) for k in ("candidate", "class_name", "seed", "log_path", "share_dir",
                                      "scrub_freed_memory")}
    config["device"] = device
    config_path = workdir / "config-candidate-process.json"
    config_path.write_text(json.dumps(config, indent=1))
    home = workdir / "candidate"
    home.mkdir(exist_ok=True)
    command_r, command_w = os.pipe()
    reply_r, reply_w = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fastnorm.harness.candidate_process", str(config_path), str(command_r),
             str(reply_w)], pass_fds=(command_r, reply_w), stdin=subprocess.DEVNULL, cwd=str(home))
    except BaseException:
        for fd in (reply_r, command_w):
            os.close(fd)
        raise
    finally:
        os.close(command_r)
        os.close(reply_w)
    return StartedCandidate(proc, reply_r, command_w)


def close_to_other_processes() -> None:
    """Linux: PR_SET_DUMPABLE 0 - other processes of the user (the candidate's) can no longer ptrace this one
    or open its /proc/PID/mem, fd/ or environ. Its own children start dumpable again after exec."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
        except (OSError, AttributeError):
            pass
