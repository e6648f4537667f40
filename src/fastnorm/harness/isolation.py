"""Run one worker in its own process group with a wall-clock limit, and collect what it left behind.

Torch-free: the parent process never imports torch through this module, so it can never hold a CUDA context
that a candidate's crash could poison. A fresh `python .../worker_entry.py` (not a fork) per job.
The worker's result comes back through a pipe only it holds (not a file a candidate could write).
Thread-safe: a pool runs several at once, each stoppable through its `stop` event (Ctrl-C), and any exception
while it waits (KeyboardInterrupt, Ray cancelling the task) kills the worker's group before it propagates.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fastnorm.build_env import BUILDS_ENV, env_build_root

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory that holds the `fastnorm` package
_WORKER_ENTRY = Path(__file__).resolve().with_name("worker_entry.py")
_POLL_S = 0.05
SHM_MIN_FREE_BYTES = 4 << 30


@dataclass
class ChildOutcome:
    result: dict | None      # the worker's result JSON, None when it died before writing it
    returncode: int | None   # negative: killed by that signal; None: we killed it on timeout
    timed_out: bool
    stage: str               # the last stage the worker announced
    log_tail: str            # the end of its stdout + stderr
    wall_s: float
    cancelled: bool = False  # stopped from outside (Ctrl-C): no verdict
    stage_s: dict | None = None  # seconds from each announced stage to the next ("spawn": until the first)


def fastnorm_builds_dir(env: dict) -> Path:
    """Where a judge's processes keep fastnorm's own build (a package-backed candidate's kernels): one folder
    for every judge, not the candidate's, so that only the first judge compiles them (25 s a candidate on
    the H100). This process's FASTNORM_EXTENSIONS_DIR or TORCH_EXTENSIONS_DIR, else a fastnorm cache folder.
    Safe to share: a build's name hashes its sources, flags and torch version."""
    root = env_build_root(env)
    if root is not None:
        return root
    cache = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "fastnorm" / "extensions"


def _worker_env(env: dict | None) -> dict:
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join([str(_PACKAGE_ROOT)] + [p for p in [env.get("PYTHONPATH")] if p])
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"  # a segfault leaves a Python traceback in the log
    env[BUILDS_ENV] = str(fastnorm_builds_dir(env))
    return env


class SpareJudge:
    """A judge started ahead of its job (pool.py): its interpreter and its candidate's process import torch
    while an earlier candidate is judged (worker_entry.py --spare), and touch no GPU until run_worker hands
    it a config. Its log until then: `log_path`. close() discards it unused."""

    def __init__(self, folder: Path, env: dict | None = None):
        folder.mkdir(parents=True, exist_ok=True)
        self.log_path = folder / "spare.log"
        go_r, self.go_w = os.pipe()
        self.result_r, self.result_w = os.pipe()
        env = _worker_env(env)
        env["TORCH_EXTENSIONS_DIR"] = str(folder / "torch_extensions")  # its job's, once it has one
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen([sys.executable, str(_WORKER_ENTRY), "--spare", str(go_r)],
                                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                             env=env, cwd=str(folder), start_new_session=True,
                                             pass_fds=(go_r, self.result_w))
            except BaseException:
                for fd in (self.go_w, self.result_r, self.result_w):
                    os.close(fd)
                raise
            finally:
                os.close(go_r)

    def go(self, config_path: Path) -> bool:
        """Hand it its job; False when it is gone (then it is cleaned up, and the caller starts a fresh worker)."""
        try:
            os.write(self.go_w, str(config_path).encode() + b"\n")
            os.close(self.go_w)
            self.go_w = -1
            return True
        except OSError:
            self.close()
            return False

    def close(self) -> None:
        _kill_group(self.proc.pid)
        self.proc.wait()
        for fd in (self.go_w, self.result_r, self.result_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.go_w = self.result_r = self.result_w = -1


def run_worker(config: dict, workdir: Path, timeout_s: float, env: dict | None = None,
               stop: threading.Event | None = None, extensions_dir: str | None = None,
               spare: SpareJudge | None = None) -> ChildOutcome:
    """Write `config` to workdir, run the worker on it, kill its whole process group after timeout_s or as
    soon as `stop` is set. env: variables to set for it (CUDA_VISIBLE_DEVICES pins it to one GPU).
    extensions_dir: the TORCH_EXTENSIONS_DIR to build in instead of one of the worker's own. spare: a judge
    started ahead with the same env (a job of mode "candidate"); it is used up, or closed and replaced by a
    fresh worker if it died."""
    workdir.mkdir(parents=True, exist_ok=True)
    paths = {"progress_path": workdir / "progress.txt", "log_path": workdir / "worker.log"}
    for path in paths.values():
        path.unlink(missing_ok=True)
    # Per candidate: clashing load_inline names must not share builds. A caller that vouches for its
    # candidates' names (fastnorm solve: a hash of the sources) may name a shared one, whose builds it made.
    ext_dir = Path(extensions_dir) if extensions_dir else workdir / "torch_extensions"
    ext_dir.mkdir(parents=True, exist_ok=True)
    config = {**config, **{k: str(v) for k, v in paths.items()}, "torch_extensions_dir": str(ext_dir)}
    config_path = workdir / f"config-{config.get('mode', 'job')}.json"

    def write_config(result_fd: int) -> None:
        config["result_fd"] = result_fd
        config_path.write_text(json.dumps(config, indent=1))

    t0 = time.monotonic()
    with open(paths["log_path"], "ab") as log:
        proc = None
        if spare is not None:
            write_config(spare.result_w)
            if spare.go(config_path):  # (a spare that died is closed, its result pipe with it)
                proc, result_r, result_w = spare.proc, spare.result_r, spare.result_w
                spare.result_r = spare.result_w = -1  # ours from here
                os.close(result_w)
        if proc is None:
            result_r, result_w = os.pipe()
            write_config(result_w)
            worker_env = _worker_env(env)
            worker_env["TORCH_EXTENSIONS_DIR"] = str(ext_dir)
            try:
                proc = subprocess.Popen([sys.executable, str(_WORKER_ENTRY), str(config_path)],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                        env=worker_env, cwd=str(workdir), start_new_session=True,
                                        pass_fds=(result_w,))
            except BaseException:
                os.close(result_r)
                raise
            finally:
                os.close(result_w)
        chunks = []
        reader = threading.Thread(target=_read_all, args=(result_r, chunks), daemon=True)
        reader.start()
        try:
            ended = _wait(proc, timeout_s, stop)
        finally:  # also on KeyboardInterrupt: the group must not outlive the evaluator
            _kill_group(proc.pid)  # also kills stragglers (a hung nvcc, a candidate's own children)
            returncode = proc.wait()
        cancelled = stop is not None and stop.is_set() and not ended
        timed_out = not ended and not cancelled
    wall = time.monotonic() - t0
    reader.join(5.0)  # the group is dead: every write end is closed
    result = None
    if returncode == 0 and ended:  # a worker killed after something else wrote into its pipe: no result
        try:
            result = json.loads(b"".join(chunks))
        except ValueError:
            pass
    return ChildOutcome(result=result if isinstance(result, dict) else None,
                        returncode=None if timed_out else returncode, timed_out=timed_out,
                        stage=last_stage(paths["progress_path"]), log_tail=file_tail(paths["log_path"]), wall_s=wall,
                        cancelled=cancelled, stage_s=stage_seconds(paths["progress_path"], t0, t0 + wall))


def _wait(proc: subprocess.Popen, timeout_s: float, stop: threading.Event | None) -> bool:
    """True when the worker exited by itself; False on timeout or stop."""
    if hasattr(os, "waitid"):
        return _wait_unreaped(proc.pid, timeout_s, stop)
    deadline = time.monotonic() + timeout_s  # macOS before Python 3.13: reaps first, a tiny window for pid reuse
    while not (stop is not None and stop.is_set()):
        try:
            proc.wait(min(_POLL_S * 4, max(0.0, deadline - time.monotonic())))
            return True
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                return False
    return False


def _read_all(fd: int, chunks: list) -> None:
    try:
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return
            chunks.append(chunk)
    finally:
        os.close(fd)


def _wait_unreaped(pid: int, timeout_s: float, stop: threading.Event | None) -> bool:
    """Wait for the child to exit without reaping it, so its pid (= the group id) cannot be reused before
    we kill the rest of its group. Returns False on timeout or stop."""
    deadline = time.monotonic() + timeout_s
    while True:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None and info.si_pid == pid:
            return True
        if time.monotonic() >= deadline or (stop is not None and stop.is_set()):
            return False
        time.sleep(_POLL_S)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _stage_marks(path: Path) -> list:
    """(time, stage) of each line of a worker's progress file (loading.Progress); a line torn by the worker's
    death is skipped."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    marks = []
    for line in lines:
        stamp, _, stage = line.partition("\t")
        if not stage:
            continue  # torn
        try:
            marks.append((float(stamp), stage))
        except ValueError:
            continue
    return marks


def stage_seconds(path: Path, start: float, end: float) -> dict | None:
    """Seconds spent in each stage a worker announced in its progress file, in order: "spawn" from `start`
    to the first announcement (the process start and its imports), then each stage until the next one,
    the last until `end` (the worker's exit). A stage announced twice adds up. None when the file is
    missing or names no stage."""
    marks = _stage_marks(path)
    if not marks:
        return None
    seconds = {"spawn": round(max(0.0, marks[0][0] - start), 3)}
    for (t, stage), (t_next, _) in zip(marks, marks[1:] + [(end, "")]):
        seconds[stage] = round(seconds.get(stage, 0.0) + max(0.0, t_next - t), 3)
    return seconds


def last_stage(path: Path) -> str:
    """The stage a worker announced last in its progress file, "start" before any."""
    marks = _stage_marks(path)
    return marks[-1][1] if marks else "start"


def file_tail(path: Path, nbytes: int = 16384) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - nbytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def make_share_folder(root: Path) -> Path:
    """Where the candidate's process puts the buffers the judge maps on CPU: shared memory when there is room
    (a container's /dev/shm can be tiny), else beside the worker folders."""
    shm = Path("/dev/shm")
    try:
        if shm.is_dir() and os.access(shm, os.W_OK):
            stat = os.statvfs(shm)
            if stat.f_bavail * stat.f_frsize >= SHM_MIN_FREE_BYTES:
                return Path(tempfile.mkdtemp(prefix="fastnorm-eval-", dir=shm))
    except OSError:
        pass
    folder = root / "shared"
    folder.mkdir()
    return folder
