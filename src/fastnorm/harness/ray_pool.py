"""`fastnorm eval --ray [ADDRESS]`: the batch on a Ray cluster, one Ray task per candidate.

Ray places the tasks (num_gpus=1 each on CUDA, so Ray never gives two of them one GPU; num_cpus=1 on CPU).
A task runs the same worker processes as a local slot (isolation.run_worker: the judge, which runs the
candidate in a process of its own), pinned to its GPU by the CUDA_VISIBLE_DEVICES Ray sets, and returns what
they left behind; verdicts and speedups are computed here, as locally. The reference is measured by the first
task that lands on a GPU (node, GPU id) and reused by every later one there: the parent passes the GPUs it
has baselines for with each task, and keeps at most one task in flight per GPU (or --jobs), so that later
tasks carry the baselines earlier ones measured. Problem and candidate files travel with the task, so the
nodes need no shared filesystem, only fastnorm (shipped to a remote cluster as a py_module) and torch.

Builds run inside the GPU task (the judge imports the candidate); a separate CPU build stage is not done here.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
from collections import deque
from dataclasses import asdict
from pathlib import Path

from fastnorm.harness.batch import Finished, Handler, Job, Measured, ReferenceFailed
from fastnorm.harness.isolation import ChildOutcome, make_share_folder, run_worker
from fastnorm.harness.outcomes import EvaluationError, baseline_from, result_from
from fastnorm.harness.report import CandidateResult

_WAIT_S = 0.5
_CANCEL_WAIT_S = 20.0
_PACKAGE_DIR = Path(__file__).resolve().parents[1]   # src/fastnorm: shipped to remote clusters


def import_ray():
    try:
        import ray
    except ImportError:
        raise EvaluationError("--ray needs Ray, an optional extra: pip install 'fastnorm[ray]'") from None
    return ray


class RayPool:
    def __init__(self, address: str, device: str | None, jobs: int | None, *, timeout: float, floor_check: bool,
                 compile_baseline: bool = False):
        if jobs is not None and jobs < 1:
            raise ValueError("--jobs must be at least 1")
        if device not in (None, "auto", "cuda", "cpu"):
            raise ValueError(f"with --ray, --device is cuda or cpu, not {device!r}: Ray picks each task's GPU")
        self.ray = ray = import_ray()
        self.address, self.timeout, self.floor_check = address, timeout, floor_check
        self.baseline_timeout = timeout * (2 if compile_baseline else 1)
        self.started = not ray.is_initialized()  # an API caller's own Ray session is used and left running
        if self.started:
            options = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
            if address != "local":  # the nodes run this very fastnorm, whatever they have installed
                options["runtime_env"] = {"py_modules": [str(_PACKAGE_DIR)]}
            try:
                ray.init(address=address, **options)
            except Exception as exc:
                raise EvaluationError(f"cannot start or reach Ray at {address}: {exc}") from None
        try:
            resources = ray.cluster_resources()
            self.gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 1))
            self.use_gpu = self.gpus > 0 if device in (None, "auto") else device == "cuda"
            if self.use_gpu and not self.gpus:
                raise EvaluationError("--device cuda, but the Ray cluster has no GPUs")
        except BaseException:
            self.close()
            raise
        self.in_flight = jobs or max(1, self.gpus if self.use_gpu else cpus)
        self.remote = ray.remote(run_task).options(num_gpus=1 if self.use_gpu else 0, num_cpus=1, max_retries=0)
        self.baselines = {}       # (problem index, gpu key) -> Baseline
        self.copy_bw_large = {}   # gpu key -> bytes/s
        self.failed = set()       # problem indices whose reference could not be measured

    def describe(self) -> str:
        kind = f"{self.gpus} GPUs" if self.use_gpu else "CPU"
        return f"{self.address}, {kind}, {self.in_flight} tasks at a time"

    def close(self) -> None:
        if self.started and self.ray.is_initialized():
            self.ray.shutdown()

    def run(self, jobs: list[Job], handle: Handler) -> None:
        waiting, running = deque(jobs), {}
        try:
            while waiting or running:
                while waiting and len(running) < self.in_flight:
                    job = waiting.popleft()
                    if job.problem.index in self.failed:
                        handle(Finished(job, None))
                    else:
                        running[self._submit(job)] = job
                if not running:
                    continue
                done, _ = self.ray.wait(list(running), num_returns=1, timeout=_WAIT_S)
                for ref in done:
                    self._collect(running.pop(ref), ref, handle)
        except BaseException:
            self._cancel(list(running))
            raise
        finally:
            self.close()

    def _submit(self, job: Job):
        problem = job.problem
        measured = {key: b.device for (index, key), b in self.baselines.items() if index == problem.index}
        payload = {"config": {k: v for k, v in problem.config.items() if k not in ("reference", "share_dir")},
                   "reference": _shipped(problem.reference),
                   "candidate": _shipped(job.candidate) if job.candidate is not None else None,
                   "device": "cuda" if self.use_gpu else "cpu", "measured": measured,
                   "copy_bw_large": dict(self.copy_bw_large), "timeout": self.timeout,
                   "baseline_timeout": self.baseline_timeout}
        return self.remote.remote(payload)

    def _collect(self, job: Job, ref, handle: Handler) -> None:
        try:
            reply = self.ray.get(ref)
        except Exception as exc:  # the task itself died (its Ray worker was killed): a verdict, the batch goes on
            text = str(exc).strip().splitlines()
            result = None if job.candidate is None else CandidateResult(
                str(job.candidate), "runtime_error", f"the Ray task running it failed: {text[-1] if text else exc}",
                worker="ray")
            handle(Finished(job, result))
            return
        problem, key = job.problem, reply["key"]
        baseline = self.baselines.get((problem.index, key))
        if "baseline_outcome" in reply:  # measured by this task (tasks of the first wave may each measure one)
            try:
                baseline = baseline_from(ChildOutcome(**reply["baseline_outcome"]), self.baseline_timeout,
                                         str(problem.reference))
            except EvaluationError as exc:
                self.failed.add(problem.index)
                handle(ReferenceFailed(problem, str(exc)))
                handle(Finished(job, None))
                return
            if (problem.index, key) not in self.baselines:
                self.baselines[(problem.index, key)] = baseline
                handle(Measured(problem, reply["where"], baseline))
            if baseline.copy_bw_large:
                self.copy_bw_large.setdefault(key, baseline.copy_bw_large)
        if "outcome" not in reply or problem.index in self.failed:
            handle(Finished(job, None))
            return
        result = result_from(str(job.candidate), ChildOutcome(**reply["outcome"]), self.timeout, baseline,
                             self.floor_check)
        for copy, original in reply["copies"].items():  # messages name the files the user gave
            result.message = result.message.replace(copy, original)
        result.gpu, result.worker = reply["gpu"], reply["worker"]
        handle(Finished(job, result))

    def _cancel(self, refs: list) -> None:
        """Ctrl-C: each running task gets KeyboardInterrupt, on which run_worker kills its worker's process
        group; wait for that before Ray's own processes go."""
        for ref in refs:
            try:
                self.ray.cancel(ref)
            except Exception:
                pass
        if refs:
            try:
                self.ray.wait(refs, num_returns=len(refs), timeout=_CANCEL_WAIT_S)
            except Exception:
                pass


def _shipped(path: Path) -> dict:
    return {"path": str(path), "data": path.read_bytes()}


def _placed(item: dict, folder: Path, copies: dict) -> str:
    """The shipped file on this node: the same path when it is there with the same bytes (a local
    instance, a shared filesystem), else a copy in `folder` under the same name."""
    path = Path(item["path"])
    try:
        if path.is_file() and path.read_bytes() == item["data"]:
            return str(path)
    except OSError:
        pass
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / path.name
    copy.write_bytes(item["data"])
    copies[str(copy)] = str(path)
    return str(copy)


def run_task(payload: dict) -> dict:
    """The Ray task (runs on a node): measure the reference on this GPU unless the parent already has it,
    then judge the candidate; returns the workers' outcomes for the parent to turn into verdicts."""
    import ray

    gpu_ids = ray.get_gpu_ids()
    gpu = str(gpu_ids[0]) if gpu_ids else None
    host = ray.util.get_node_ip_address()
    key = f"{ray.get_runtime_context().get_node_id()}/{gpu}"
    reply = {"key": key, "where": f"{host} gpu {gpu}" if gpu is not None else f"{host} cpu", "gpu": gpu,
             "worker": f"ray {host}", "copies": {}}
    root = Path(tempfile.mkdtemp(prefix="fastnorm-ray-"))
    share = make_share_folder(root)
    try:
        config = {**payload["config"], "share_dir": str(share),
                  "reference": _placed(payload["reference"], root / "problem", reply["copies"])}
        device = payload["measured"].get(key)
        if device is None:
            outcome = run_worker({**config, "mode": "baseline", "device": payload["device"],
                                  "copy_bw_large": payload["copy_bw_large"].get(key)},
                                 root / "reference", payload["baseline_timeout"])
            reply["baseline_outcome"] = asdict(outcome)
            if not (outcome.result and outcome.result.get("ok")):
                return reply
            device = outcome.result["device"]
        if payload["candidate"] is not None:
            candidate = _placed(payload["candidate"], root / "candidate", reply["copies"])
            outcome = run_worker({**config, "mode": "candidate", "candidate": candidate, "device": device},
                                 root / "judge", payload["timeout"])
            reply["outcome"] = asdict(outcome)
        return reply
    finally:
        shutil.rmtree(share, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
