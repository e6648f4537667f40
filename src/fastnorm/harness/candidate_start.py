"""Starting the candidate's process (candidate_process.py) from the judge, before the judge imports torch.

Torch-free and package-free on purpose: worker_entry.py loads this file by path and starts the candidate's
process first thing, so that the two interpreters import torch side by side instead of one after the other.
The process starts bare (it imports torch and waits) and gets its configuration over its command pipe once
the judge has its job (configure_candidate_process): a judge started ahead of its job (a spare, pool.py) has
its candidate process started ahead too. Nothing of the candidate loads until the judge sends "import", by
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


def start_candidate_process() -> StartedCandidate:
    """Start the candidate's process in the judge's session (it dies with the judge's process group); it
    waits for configure_candidate_process."""
    close_to_other_processes()
    command_r, command_w = os.pipe()
    reply_r, reply_w = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "fastnorm.harness.candidate_process", str(command_r),
                                 str(reply_w)], pass_fds=(command_r, reply_w), stdin=subprocess.DEVNULL)
    except BaseException:
        for fd in (reply_r, command_w):
            os.close(fd)
        raise
    finally:
        os.close(command_r)
        os.close(reply_w)
    return StartedCandidate(proc, reply_r, command_w)


def configure_candidate_process(started: StartedCandidate, cfg: dict, device: str) -> None:
    """Write the candidate process's config beside the judge's log and send it its path (the first message
    on its command pipe: one JSON line, as channel.py writes them). device: as the judge was told ("cuda",
    "cuda:0", "cpu"); both processes see the same CUDA_VISIBLE_DEVICES, so they resolve it to the same GPU.
    A process that already died is reported by the judge when its first reply does not come."""
    workdir = Path(cfg["log_path"]).parent
    config = {k: cfg.get(k) for k in ("candidate", "class_name", "seed", "log_path", "share_dir",
                                      "scrub_freed_memory", "torch_extensions_dir")}
    config["device"] = device
    config["home"] = str(workdir / "candidate")
    Path(config["home"]).mkdir(exist_ok=True)
    config_path = workdir / "config-candidate-process.json"
    config_path.write_text(json.dumps(config, indent=1))
    line = json.dumps({"kind": "config", "path": str(config_path)}).encode() + b"\n"
    try:
        os.write(started.command_fd, line)  # well under the pipe's buffer: never blocks
    except OSError:
        pass


def close_to_other_processes() -> None:
    """Linux: PR_SET_DUMPABLE 0 - other processes of the user (the candidate's) can no longer ptrace this one
    or open its /proc/PID/mem, fd/ or environ. Its own children start dumpable again after exec."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
        except (OSError, AttributeError):
            pass
