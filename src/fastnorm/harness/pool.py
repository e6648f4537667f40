"""`fastnorm eval --jobs N` on this host: a timing slot per GPU and a build pool, both feeding on one queue.

Each slot owns one GPU (its workers see only that one, through CUDA_VISIBLE_DEVICES) and runs one judge at a
time, so two timed candidates never share a GPU; it measures each reference on its GPU once (the reference's
timing, the copy bandwidth) and judges every candidate it takes against that. The build pool (threads, each
waiting on a worker process that only imports the candidate, so that load_inline compiles into the
candidate's own extension folder) runs ahead of the slots, overlapping nvcc with timing; the judge then loads
the cached build. Without a build pool (CPU by default) a slot's judge builds as it imports. On GPU slots
each slot keeps a spare judge (isolation.SpareJudge) started ahead for its next candidate: the two
interpreters a candidate needs (judge and candidate process, torch imported in each: about 4 s on the H100
machine) start while the previous candidate is judged, and touch the GPU only once handed their job.

Threads only wait on processes (isolation.run_worker); every build, forward and timing runs in a worker
process, as with one candidate. Events go to the main thread through a queue; Ctrl-C there sets `stop`,
which kills every worker's process group within about 0.05 s.
"""
from __future__ import annotations

import os
import queue
import shutil
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fastnorm.harness.batch import Finished, Handler, Job, Measured, Problem, ReferenceFailed
from fastnorm.harness.gpus import visible_gpus
from fastnorm.harness.isolation import SpareJudge, run_worker
from fastnorm.harness.outcomes import EvaluationError, baseline_from, import_succeeded, result_from
from fastnorm.harness.report import Baseline

_EVENT_POLL_S = 0.5


@dataclass
class Slot:
    index: int
    gpu: str | None     # the CUDA_VISIBLE_DEVICES id its workers are pinned to (None: CPU, or not pinned)
    device: str         # the device its workers are told: "cuda" (the one GPU they see), "cuda:N", "cpu"
    env: dict = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"gpu {self.gpu}" if self.gpu is not None else self.device

    @property
    def label(self) -> str:
        return f"slot {self.index}"


def default_build_jobs() -> int:
    return max(1, min(8, (os.cpu_count() or 1) // 2))


def plan_slots(device: str | None, jobs: int | None) -> list[Slot]:
    """One slot per visible GPU (or the first `jobs`); `jobs` slots (default 1) on CPU; one for cuda:N."""
    if jobs is not None and jobs < 1:
        raise ValueError("--jobs must be at least 1")
    cpu = [Slot(i, None, "cpu") for i in range(jobs or 1)]
    if device == "cpu":
        return cpu
    if device not in (None, "auto", "cuda"):
        if not device.startswith("cuda:") or not device[5:].isdigit():
            raise ValueError(f"--device must be cuda, cuda:N or cpu, not {device!r}")
        if (jobs or 1) > 1:
            raise ValueError(f"--device {device} names one GPU, so --jobs must be 1 (timed candidates never share "
                             f"a GPU); --device cuda uses every visible GPU")
        gpus = visible_gpus()
        index = int(device[5:])
        return [Slot(0, gpus[index] if index < len(gpus) else None, device)]
    gpus = visible_gpus()
    if not gpus:
        return [Slot(0, None, "cuda")] if device == "cuda" else cpu  # cuda: the worker says why it is unusable
    n = jobs or len(gpus)
    if n > len(gpus):
        raise ValueError(f"--jobs {n}, but {len(gpus)} GPU(s) are visible ({', '.join(gpus)}): timed candidates "
                         f"never share a GPU (--build-jobs sets how many builds run at once)")
    return [Slot(i, gpu, "cuda", {"CUDA_VISIBLE_DEVICES": gpu}) for i, gpu in enumerate(gpus[:n])]


class LocalPool:
    def __init__(self, slots: list[Slot], *, build_jobs: int, timeout: float, floor_check: bool, root: Path,
                 keep_temp: bool = False, baseline_timeout: float | None = None, extensions_dir: str | None = None):
        self.slots, self.build_jobs, self.timeout, self.floor_check = slots, build_jobs, timeout, floor_check
        self.extensions_dir = extensions_dir  # candidates' TORCH_EXTENSIONS_DIR; None: one per candidate
        self.baseline_timeout = baseline_timeout or timeout
        self.root, self.keep_temp = root, keep_temp
        pinned = [s.gpu for s in slots if "CUDA_VISIBLE_DEVICES" in s.env]
        # Builds see every GPU the slots use: load_inline compiles for the architectures it sees.
        self.build_env = {"CUDA_VISIBLE_DEVICES": ",".join(pinned)} if pinned else {}
        self.stop = threading.Event()
        self.events: queue.Queue = queue.Queue()
        self.ready: queue.Queue = queue.Queue()
        # Jobs handed out but not yet taken by a slot: bounds how far builds run ahead (their disk space).
        self.ahead = threading.Semaphore(build_jobs + 2 * len(slots))
        self.lock = threading.Lock()
        self.baselines: dict[tuple[int, str], Baseline] = {}
        self.baseline_locks: dict[tuple[int, str], threading.Lock] = {}
        self.failed: dict[int, str] = {}           # problem index -> why its reference could not be measured
        self.copy_bw_large: dict[str, float] = {}  # slot.where -> the large copy's bandwidth, measured once
        # A judge started ahead for each slot's next candidate (isolation.SpareJudge): on GPU slots, where
        # starting two interpreters (torch imported in each) is most of a small candidate's time and the host
        # has cores to spare; FASTNORM_EVAL_SPARES=0 / =1 turns them off / on (CPU too).
        flag = os.environ.get("FASTNORM_EVAL_SPARES", "")
        self.use_spares = flag == "1" or (flag != "0" and all(s.gpu is not None for s in slots))
        self.spares: dict[int, SpareJudge] = {}
        self.spares_started = 0

    def run(self, jobs: list[Job], handle: Handler) -> None:
        """Run every job; `handle` gets each event on this (the main) thread. Returns when all jobs have
        finished; on any exception here (Ctrl-C, handle raising) every worker is killed before it propagates."""
        builds = ThreadPoolExecutor(self.build_jobs, thread_name_prefix="fastnorm-build") if self.build_jobs else None
        threads = [threading.Thread(target=self._slot_loop, args=(slot,), name=f"fastnorm-{slot.label}", daemon=True)
                   for slot in self.slots]
        threads.append(threading.Thread(target=self._feed, args=(jobs, builds), name="fastnorm-feed", daemon=True))
        for thread in threads:
            thread.start()
        remaining = len(jobs)
        try:
            while remaining:
                try:
                    event = self.events.get(timeout=_EVENT_POLL_S)
                except queue.Empty:
                    continue
                if isinstance(event, BaseException):  # a fault of the evaluator in a pool thread
                    raise event
                if isinstance(event, Finished):
                    remaining -= 1
                handle(event)
        finally:
            self.stop.set()
            for _ in self.slots:
                self.ready.put(None)
            if builds is not None:
                builds.shutdown(wait=True, cancel_futures=True)
            for thread in threads:
                thread.join()
            for spare in self.spares.values():
                spare.close()
            self.spares.clear()

    # -- threads ------------------------------------------------------------------------------------------

    def _feed(self, jobs: list[Job], builds: ThreadPoolExecutor | None) -> None:
        for job in jobs:
            while not self.ahead.acquire(timeout=_EVENT_POLL_S):
                if self.stop.is_set():
                    return
            if self.stop.is_set():
                return
            if builds is not None and job.candidate is not None:
                try:
                    builds.submit(self._guarded, self._build, job)
                except RuntimeError:  # shut down: the batch is stopping
                    return
            else:
                self.ready.put(job)

    def _slot_loop(self, slot: Slot) -> None:
        self._start_spare(slot)
        while True:
            job = self.ready.get()
            if job is None or self.stop.is_set():
                return
            self.ahead.release()
            self._guarded(self._judge, slot, job)

    def _guarded(self, step, *args) -> None:
        try:
            step(*args)
        except BaseException as exc:  # surfaces in the main thread instead of leaving it waiting
            self.events.put(exc)

    # -- steps --------------------------------------------------------------------------------------------

    def _build(self, job: Job) -> None:
        if self.stop.is_set():
            return
        if job.problem.index in self.failed:
            self.ready.put(job)  # a slot reports it as not run
            return
        config = {**job.problem.config, "mode": "import", "candidate": str(job.candidate),
                  "device": self.slots[0].device}
        outcome = run_worker(config, self._workdir(job), self.timeout, env=self.build_env, stop=self.stop,
                             extensions_dir=self.extensions_dir)
        if outcome.cancelled:
            return
        if import_succeeded(outcome):
            self.ready.put(job)
            return
        self.ahead.release()
        result = result_from(str(job.candidate), outcome, self.timeout, None, self.floor_check)
        result.worker = "build"
        self._forget(job)
        self.events.put(Finished(job, result))

    def _judge(self, slot: Slot, job: Job) -> None:
        baseline = self._baseline(slot, job.problem)
        if baseline is None or job.candidate is None:
            if not self.stop.is_set():
                self.events.put(Finished(job, None))
            return
        config = {**job.problem.config, "mode": "candidate", "candidate": str(job.candidate),
                  "device": baseline.device}
        with self.lock:
            spare = self.spares.pop(slot.index, None)
        self._start_spare(slot)  # for the next candidate, while this one is judged
        try:
            outcome = run_worker(config, self._workdir(job), self.timeout, env=slot.env, stop=self.stop,
                                 extensions_dir=self.extensions_dir, spare=spare)
        finally:
            if spare is not None and not self.keep_temp:
                shutil.rmtree(spare.log_path.parent, ignore_errors=True)
        if outcome.cancelled:
            return
        result = result_from(str(job.candidate), outcome, self.timeout, baseline, self.floor_check)
        result.gpu, result.worker = slot.gpu, slot.label
        self._forget(job)
        self.events.put(Finished(job, result))

    def _baseline(self, slot: Slot, problem: Problem) -> Baseline | None:
        """The reference measured on this slot's device: once per (reference, device), shared by the slots on
        one device (CPU). None when it cannot be measured (reported once) or the batch is stopping."""
        key = (problem.index, slot.where)
        with self.lock:
            key_lock = self.baseline_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self.lock:
                if problem.index in self.failed or key in self.baselines:
                    return self.baselines.get(key)
            config = {**problem.config, "mode": "baseline", "device": slot.device,
                      "copy_bw_large": self.copy_bw_large.get(slot.where)}
            workdir = self.root / f"reference-{problem.index:03d}-{slot.index}"
            outcome = run_worker(config, workdir, self.baseline_timeout, env=slot.env, stop=self.stop)
            if outcome.cancelled:
                return None
            try:
                baseline = baseline_from(outcome, self.baseline_timeout, str(problem.reference))
            except EvaluationError as exc:
                with self.lock:
                    self.failed[problem.index] = str(exc)
                self.events.put(ReferenceFailed(problem, str(exc)))
                return None
            with self.lock:
                self.baselines[key] = baseline
                if baseline.copy_bw_large:
                    self.copy_bw_large.setdefault(slot.where, baseline.copy_bw_large)
            self.events.put(Measured(problem, slot.where, baseline))
            return baseline

    def _start_spare(self, slot: Slot) -> None:
        if not self.use_spares or self.stop.is_set():
            return
        with self.lock:
            self.spares_started += 1
            folder = self.root / f"spare-{slot.index}-{self.spares_started:04d}"
        spare = SpareJudge(folder, slot.env)
        with self.lock:
            if self.stop.is_set():
                spare.close()
            else:
                self.spares[slot.index] = spare

    def _workdir(self, job: Job) -> Path:
        return self.root / f"{job.index:04d}-{job.candidate.stem}"

    def _forget(self, job: Job) -> None:
        """A judged candidate's folder (its build, logs) goes at once: thousands of builds would fill a disk."""
        if not self.keep_temp:
            shutil.rmtree(self._workdir(job), ignore_errors=True)
