"""The child process of `fastnorm eval`: the reference's baseline, a candidate's pre-build, or the judge.

Run by isolation.run_worker as `python .../worker_entry.py CONFIG.json`, which starts a judge's candidate
process before anything imports torch, or as `python -m fastnorm.harness.worker CONFIG.json`. Modes (CONFIG["mode"]):
  import     import the candidate only (parallel pre-build of load_inline extensions)
  baseline   validate and time the reference (+ torch.compile), measure copy bandwidth and the minimal bytes
  candidate  the judge (judge.py): the reference's outputs here, the candidate in a process of its own
             (candidate_process.py), correctness trials, timing watched from outside, a check after timing
Writes its result (JSON) to the pipe CONFIG["result_fd"] and announces each stage in CONFIG["progress_path"],
so that when the process dies (segfault, timeout) the parent still knows where. The modes live in
baseline.py and judge.py.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

from fastnorm.harness.baseline import run_baseline, run_import
from fastnorm.harness.judge import run_judge
from fastnorm.harness.loading import Progress
from fastnorm.harness.messages import Verdict, clip, describe_exception


def main(argv: list[str], started=None) -> int:
    """started: a judge's candidate process, already started (worker_entry.py)."""
    with open(argv[0]) as f:
        cfg = json.load(f)
    if cfg.get("torch_extensions_dir"):  # a spare started before its job had a folder (isolation.py)
        os.environ["TORCH_EXTENSIONS_DIR"] = cfg["torch_extensions_dir"]
    modes = {"import": run_import, "baseline": run_baseline,
             "candidate": lambda cfg, progress: run_judge(cfg, progress, started)}
    progress = Progress(cfg["progress_path"])
    try:
        result = modes[cfg["mode"]](cfg, progress)
    except Verdict as v:
        result = {"verdict": v.verdict, "message": v.message, "max_abs_err": getattr(v, "max_abs_err", None),
                  "max_rel_err": getattr(v, "max_rel_err", None)}
    except BaseException as exc:  # a fault of the harness, or the reference failing in this process
        traceback.print_exc()
        result = {"verdict": "runtime_error",
                  "message": clip(f"evaluator error during {progress.stage}: {describe_exception(exc)}")}
    result["stage"] = progress.stage
    data = memoryview(json.dumps(result).encode())
    while data:
        data = data[os.write(cfg["result_fd"], data):]
    os.close(cfg["result_fd"])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter/CUDA teardown: a poisoned context can crash or hang there


if __name__ == "__main__":
    main(sys.argv[1:])
