"""The JSON document of a bench run: where it ran, what it measured, every row's check and timings."""
from datetime import datetime, timezone
import json
import math
import os
import platform
import re
import subprocess
from pathlib import Path

import torch

from fastnorm.bench import ranking
from fastnorm.bench.runner import BASELINES, IMPLS, ImplResult, RowResult

_IMPL_KEYS = ("median_us", "min_us", "iqr_us", "trials", "gbs", "pct_copy")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # Linux: the CPU model; elsewhere whatever platform knows
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "CPU " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "CPU " + (platform.processor() or platform.machine() or "unknown")


def slug(name: str, limit: int = 48) -> str:
    """File-name form of a device name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    text = re.sub(r"\((r|tm)\)", "", name.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-")[:limit].rstrip("-") or "device"


def git_commit(where: Path):
    """HEAD of the git checkout holding `where`, or None (not a checkout, no commit yet, no git).
    FASTNORM_COMMIT overrides it, for runs from a copy of the tree without its .git (a GPU machine)."""
    given = os.environ.get("FASTNORM_COMMIT", "").strip().lower()
    if re.fullmatch(r"[0-9a-f]{7,40}", given):  # short hashes too: a wrong-looking value must not fall back
        return given
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where, capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    head = done.stdout.strip()
    return head if done.returncode == 0 and re.fullmatch(r"[0-9a-f]{40}", head) else None


def _num(value):
    """JSON has no NaN/inf: those become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _impl_doc(r: ImplResult) -> dict:
    doc = {key: _num(getattr(r, key)) for key in _IMPL_KEYS}
    if r.compile_s is not None:
        doc["compile_s"] = r.compile_s
    if r.note:
        doc["note"] = r.note
    return doc


def row_doc(row: RowResult) -> dict:
    c = row.case
    doc = {"suite": c.suite, "label": c.label, "op": c.op, "dtype": c.dtype, "shape": list(c.shape),
           "normalized": list(c.dims), "affine": c.affine, "eps": c.eps, "offset": c.offset, "pad": c.pad,
           "bytes": c.minimal_bytes(row.mode), "status": row.status}
    if row.check is not None:
        doc["check"] = {"max_abs_err": _num(row.check.max_abs_err), "ok": row.check.ok,
                        "atol": row.check.atol, "rtol": row.check.rtol}
        if row.check.error:
            doc["check"]["error"] = row.check.error
    else:
        doc["check"] = {"max_abs_err": None, "ok": None}
    doc["impls"] = {name: _impl_doc(row.impls[name]) for name in IMPLS}
    for name in BASELINES:
        doc[f"speedup_vs_{name}"] = _num(row.speedup_vs(name))
    doc["best_baseline"] = row.best_baseline()
    doc["speedup_vs_best"] = _num(row.speedup_vs_best())
    doc["flags"] = ranking.flags(row)
    if row.note:
        doc["note"] = row.note
    return doc


def document(rows, *, device: torch.device, copy_bw: float, command, settings: dict, mode: str = "fwd") -> dict:
    return {
        "mode": mode,
        "device": device_name(device),
        "device_type": device.type,
        "torch": torch.__version__,
        "fastnorm_commit": git_commit(Path(__file__).resolve().parent),
        "command": list(command),
        "copy_bandwidth_gbs": copy_bw / 1e9,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": settings,
        "rows": [row_doc(r) for r in rows],
    }


def write_json(doc: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, allow_nan=False) + "\n")
