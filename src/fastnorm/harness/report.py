"""Results of `fastnorm eval`: per-candidate verdicts, the reference baseline, the summary, JSON and a table."""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field

VERDICTS = ("ok", "compile_error", "load_error", "runtime_error", "wrong_output", "wrong_shape", "timeout",
            "cheating")
FAST_P = (0.0, 1.0, 1.5, 2.0)


@dataclass
class Baseline:
    """The reference, measured once per evaluation in its own child process."""
    device: str
    device_name: str
    torch_version: str
    ref_timing: dict                 # TimingStats.to_dict()
    copy_bw: float                   # bytes/s, read + written: the fastest trial of the two copies below
    min_bytes: int                   # input + output footprint: what any implementation must move
    outputs: list = field(default_factory=list)
    copy_bw_large: float | None = None       # a large (1 GiB on CUDA) copy
    copy_bw_same_size: float | None = None   # a copy of min_bytes / 2, same cache flush as the timings
    compiled_timing: dict | None = None
    compile_error: str | None = None
    timing_mode: str | None = None   # timing.effective_timing: "device", "host", "device, sleep cover", ...

    @property
    def floor_ms(self) -> float:
        return self.min_bytes / self.copy_bw * 1e3 if self.copy_bw else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["copy_bw_gbps"] = self.copy_bw / 1e9
        d["floor_ms"] = self.floor_ms
        d["ref_ms"] = self.ref_timing["median_ms"]
        d["compiled_ms"] = self.compiled_timing["median_ms"] if self.compiled_timing else None
        return d


@dataclass
class CandidateResult:
    candidate: str
    verdict: str
    message: str = ""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    ref_ms: float | None = None
    cand_ms: float | None = None
    speedup: float | None = None                 # ref_ms / cand_ms (medians)
    compiled_ms: float | None = None
    speedup_vs_compiled: float | None = None
    cand_timing: dict | None = None              # TimingStats.to_dict(): median, mean, min, q1, q3, iqr, tail
    achieved_gbps: float | None = None           # min_bytes / cand_ms
    pct_of_copy_bw: float | None = None
    stage: str = ""                              # where the worker was when it finished (or died)
    wall_s: float = 0.0
    gpu: str | None = None                       # the GPU it ran on (its CUDA_VISIBLE_DEVICES id); None on CPU
    worker: str | None = None                    # which worker: "slot N" on this host, the node's address on Ray
    stage_s: dict | None = None                  # seconds in each stage of its worker (isolation.stage_seconds)

    @classmethod
    def from_dict(cls, d: dict) -> "CandidateResult":
        """Back from to_dict() (a --jsonl line); unknown keys are ignored."""
        known = {f: d[f] for f in cls.__dataclass_fields__ if f in d}
        return cls(**known)

    @property
    def name(self) -> str:
        return os.path.basename(self.candidate)

    @property
    def ok(self) -> bool:
        return self.verdict == "ok"

    def to_dict(self) -> dict:
        return {**asdict(self), "name": self.name}


def summarize(results: list[CandidateResult]) -> dict:
    """fast_p: fraction of all candidates that are correct and more than p times faster than the reference;
    geomean_speedup over the correct ones."""
    n = len(results)
    correct = [r for r in results if r.ok and r.speedup]
    summary = {"candidates": n, "ok": sum(r.ok for r in results),
               "verdicts": {v: sum(r.verdict == v for r in results) for v in VERDICTS if any(r.verdict == v for r in results)}}
    for p in FAST_P:
        summary[f"fast_{p:g}"] = (sum(r.speedup > p for r in correct) / n) if n else 0.0
    summary["geomean_speedup"] = (math.exp(sum(math.log(r.speedup) for r in correct) / len(correct))
                                  if correct else None)
    return summary


@dataclass
class EvalReport:
    reference: str
    baseline: Baseline               # the first worker's (the only one with one worker)
    results: list[CandidateResult]
    settings: dict
    baselines: dict = field(default_factory=dict)  # where each worker measured the reference -> its Baseline

    @property
    def device(self) -> str:
        return self.baseline.device

    @property
    def all_ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def summary(self) -> dict:
        return summarize(self.results)

    def to_json(self) -> dict:
        """The JSON document (strict JSON: non-finite numbers become null)."""
        return finite_numbers({"device": self.device, "device_name": self.baseline.device_name,
                               "reference": self.reference, "torch_version": self.baseline.torch_version,
                               "settings": self.settings, "baseline": self.baseline.to_dict(),
                               "baselines": {where: b.to_dict() for where, b in self.baselines.items()},
                               "results": [r.to_dict() for r in self.results], "summary": self.summary})

    def format_table(self) -> str:
        b = self.baseline
        ref = b.ref_timing
        lines = [f"device: {b.device_name} ({b.device}), torch {b.torch_version}",
                 f"reference: {self.reference}",
                 f"timing: {_timing_words(b.timing_mode)}",
                 f"  eager {ref['median_ms']:.4g} ms (min {ref['min_ms']:.4g}, IQR {ref['iqr_ms']:.3g})"
                 + (f" | torch.compile {b.compiled_timing['median_ms']:.4g} ms" if b.compiled_timing else "")
                 + (f" | torch.compile failed: {b.compile_error}" if b.compile_error else ""),
                 f"  moves >= {b.min_bytes / 1e6:.4g} MB; copy bandwidth {b.copy_bw / 1e9:.4g} GB/s -> floor "
                 f"{b.floor_ms:.4g} ms; eager reaches {_pct(b.min_bytes, ref['median_ms'], b.copy_bw)}", ""]
        header = ["candidate", "verdict", "median ms", "min ms", "IQR ms", "speedup", "GB/s", "%copy", "max abs err"]
        rows = []
        for r in self.results:
            t = r.cand_timing or {}
            rows.append([r.name, r.verdict, _num(t.get("median_ms")), _num(t.get("min_ms")), _num(t.get("iqr_ms")),
                         f"{r.speedup:.3g}x" if r.speedup else "-", _num(r.achieved_gbps),
                         f"{r.pct_of_copy_bw:.0f}%" if r.pct_of_copy_bw is not None else "-", _num(r.max_abs_err)])
        widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
        fmt = lambda row: "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip()
        lines += [fmt(header), fmt(["-" * w for w in widths])]
        for r, row in zip(self.results, rows):
            lines.append(fmt(row))
            if r.message:
                lines.append(f"    {r.message}")
        if len(self.results) > 1:
            lines += ["", f"summary: {_summary_text(self.summary)}"]
        return "\n".join(lines)


@dataclass
class BatchReport:
    """Several problems (`fastnorm eval --manifest`): a report per reference that could be measured, and why
    the others could not."""
    reports: list[EvalReport]
    errors: dict = field(default_factory=dict)   # reference path -> why it could not be evaluated

    @property
    def all_ok(self) -> bool:
        return not self.errors and all(r.all_ok for r in self.reports)

    @property
    def summary(self) -> dict:
        return summarize([c for r in self.reports for c in r.results])

    def to_json(self) -> dict:
        return finite_numbers({"problems": [r.to_json() for r in self.reports], "errors": self.errors,
                               "summary": self.summary})

    def format_table(self) -> str:
        parts = [r.format_table() for r in self.reports]
        parts += [f"reference: {ref}\n  not evaluated: {why}" for ref, why in self.errors.items()]
        parts.append(f"all {len(self.reports)} problems: {_summary_text(self.summary)}"
                     + (f"; {len(self.errors)} references not evaluated" if self.errors else ""))
        return "\n\n".join(parts)


def _timing_words(mode: str | None) -> str:
    words = {"device": "device time (each call issued behind the L2 flush and a ~1 ms spin on every SM; "
                       "--timing host counts its host time too)",
             "device, sleep cover": "device time, the host's issuing hidden behind the L2 flush and "
                                    "torch.cuda._sleep (no CUDA compiler for the full cover)",
             "device, flush cover only": "device time, the host's issuing hidden behind the L2 flush only (this "
                                         "torch has no torch.cuda._sleep)",
             "host": "host time counted (the device idle when each call starts)",
             "cpu": "wall clock"}
    return words.get(mode, mode or "-")


def _summary_text(s: dict) -> str:
    fast = ", ".join(f"fast_{p:g} {s[f'fast_{p:g}']:.2f}" for p in FAST_P)
    geo = f"{s['geomean_speedup']:.3g}x" if s["geomean_speedup"] else "-"
    return f"{s['ok']}/{s['candidates']} ok; {fast}; geomean speedup of correct {geo}"


def _num(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def _pct(nbytes: int, ms: float, bw: float) -> str:
    return f"{nbytes / (ms * 1e-3) / bw * 100:.0f}% of copy bandwidth" if ms and bw else "-"


def finite_numbers(value):
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_numbers(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_numbers(v) for v in value]
    return value
