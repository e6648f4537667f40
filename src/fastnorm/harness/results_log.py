"""`--jsonl PATH`: one JSON object per candidate, appended as each finishes; `--resume` reads them back.

Each line is a CandidateResult's to_dict() (the report's fields, the GPU and worker it ran on) plus
"reference", the problem it was judged against. A line is written by one write() from the evaluating
process's main thread, so Ctrl-C never leaves half a line; a line cut short anyway (the process was killed
with SIGKILL, the disk filled up) is dropped when resuming, and that candidate runs again.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from fastnorm.harness.report import CandidateResult, finite_numbers


def result_key(reference, candidate) -> tuple[str, str]:
    return str(Path(reference).resolve()), str(Path(candidate).resolve())


class ResultsLog:
    """The JSON Lines file of a batch. resume=False starts it afresh; resume=True keeps its complete lines."""

    def __init__(self, path: str | os.PathLike, resume: bool = False):
        self.path = Path(path)
        self.done: dict[tuple[str, str], CandidateResult] = {}
        if resume and self.path.exists():
            self.done = self._read_complete_lines()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (0 if resume else os.O_TRUNC)
        self.fd = os.open(self.path, flags, 0o644)

    def _read_complete_lines(self) -> dict:
        data = self.path.read_bytes()
        complete = data[:data.rfind(b"\n") + 1]
        if len(complete) != len(data):  # a cut-off last line: drop it, so that appends start on a fresh line
            os.truncate(self.path, len(complete))
        done = {}
        for line in complete.decode(errors="replace").splitlines():
            try:
                item = json.loads(line)
                done[result_key(item["reference"], item["candidate"])] = CandidateResult.from_dict(item)
            except (ValueError, KeyError, TypeError):
                continue  # not one of ours: ignored, that candidate runs again
        return done

    def write(self, reference, result: CandidateResult) -> None:
        record = {**result.to_dict(), "reference": str(Path(reference).resolve())}
        data = memoryview((json.dumps(finite_numbers(record)) + "\n").encode())
        while data:
            data = data[os.write(self.fd, data):]

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
