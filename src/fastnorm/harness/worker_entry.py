"""The worker process's entry (isolation.py): `python .../fastnorm/harness/worker_entry.py CONFIG.json`, or
`... --spare GO_FD` for a judge started ahead of its job, which reads its config's path from GO_FD.

A script rather than `python -m fastnorm.harness.worker`: importing anything under `fastnorm` imports torch
(the package's public API), 4 s on the H100 machine. For a judge, the candidate's process starts first
(candidate_start.py, loaded by path: torch-free), so that its torch import overlaps the judge's; a spare
does both while an earlier candidate is judged, and touches no GPU until its job arrives.
"""
import importlib.util
import json
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    sys.path.pop(0)  # the script's folder: the harness's modules are not top-level modules


def _start_candidate_process():
    spec = importlib.util.spec_from_file_location("fastnorm_candidate_start", HERE / "candidate_start.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclass looks itself up there)
    spec.loader.exec_module(module)
    return module.start_candidate_process()


def _read_go(fd: int) -> str:
    """The config path the pool sends a spare (one line), "" when it closes the pipe unused."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 4096)
        if not chunk:
            return ""
        data += chunk
    os.close(fd)
    return data.decode().strip()


def _adopt(cfg: dict) -> None:
    """A spare's job: its folder, its log (stdout and stderr) and its candidate's load_inline folder."""
    os.chdir(Path(cfg["log_path"]).parent)
    log = os.open(cfg["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)


def main(argv: list) -> None:
    if argv[0] == "--spare":
        started = _start_candidate_process()
        from fastnorm.harness.worker import main as worker_main  # torch, while the pool has no job for us
        config_path = _read_go(int(argv[1]))
        if not config_path:
            os._exit(0)  # (the candidate's process sees its pipe close and exits too)
        with open(config_path) as f:
            _adopt(json.load(f))
        worker_main([config_path], started)
        return
    with open(argv[0]) as f:
        mode = json.load(f)["mode"]
    started = _start_candidate_process() if mode == "candidate" else None
    from fastnorm.harness.worker import main as worker_main
    worker_main(argv, started)


if __name__ == "__main__":
    main(sys.argv[1:])
