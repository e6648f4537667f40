"""The worker process's entry: `python .../fastnorm/harness/worker_entry.py CONFIG.json` (isolation.run_worker).

A script rather than `python -m fastnorm.harness.worker`: importing anything under `fastnorm` imports torch
(the package's public API), 4 s on the H100 machine. For a judge, the candidate's process starts first
(candidate_start.py, loaded by path: torch-free), so that its torch import and CUDA start overlap the judge's.
"""
import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    sys.path.pop(0)  # the script's folder: the harness's modules are not top-level modules


def main(argv: list) -> None:
    with open(argv[0]) as f:
        mode = json.load(f)["mode"]
    started = None
    if mode == "candidate":
        spec = importlib.util.spec_from_file_location("fastnorm_candidate_start", HERE / "candidate_start.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # (its dataclass looks itself up there)
        spec.loader.exec_module(module)
        with open(argv[0]) as f:
            cfg = json.load(f)
        started = module.start_candidate_process(cfg, cfg["device"])
    from fastnorm.harness.worker import main as worker_main
    worker_main(argv, started)


if __name__ == "__main__":
    main(sys.argv[1:])
