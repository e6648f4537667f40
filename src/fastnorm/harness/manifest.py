"""What a batch evaluates: candidates given as files, directories or globs, and manifests of many problems.

A manifest (`fastnorm eval --manifest FILE`) lists reference/candidate pairs, one per line, in either form
(mixed freely; blank lines and lines starting with # are skipped):

    problems/layer_norm.py  attempts/layer_norm/try_001.py
    {"reference": "problems/rms_norm.py", "candidates": ["attempts/rms_norm/", "more/rms_*.py"]}

A text line is two whitespace-separated columns, REFERENCE CANDIDATE (paths without spaces); a JSON line
takes "candidate" (one) or "candidates" (a list). Every candidate entry may be a file, a directory (its
*.py files) or a glob. Relative paths are relative to the manifest's folder. Lines naming the same reference
make one problem, in order of first appearance.
"""
from __future__ import annotations

import glob
import json
import os
from pathlib import Path

_GLOB_CHARS = set("*?[")


class ManifestError(ValueError):
    """A manifest or a candidate list that cannot be read (bad line, empty glob or directory)."""


def expand_candidates(reference: str | os.PathLike | None, entries) -> list[Path]:
    """Files, directories (their *.py, sorted) and globs (sorted) -> absolute candidate paths, in order,
    without the reference itself. A file named twice runs twice (as before: repeated runs of one file). A
    path that does not exist is kept (it gets a load_error verdict); a directory or glob with no candidate is
    an error."""
    if isinstance(entries, (str, os.PathLike)):
        entries = [entries]
    skip = {Path(reference).resolve()} if reference is not None else set()
    out = []
    for entry in entries:
        text = str(entry)
        if os.path.isdir(text):
            found = sorted(Path(text).glob("*.py"))
            what = f"directory {text}"
        elif _GLOB_CHARS & set(text) and not os.path.exists(text):
            found = sorted(Path(p) for p in glob.glob(text) if os.path.isfile(p))
            what = f"pattern {text!r}"
        else:
            found, what = [Path(text)], None
        found = [p.resolve() for p in found if p.resolve() not in skip]
        if not found and what:
            raise ManifestError(f"no candidate files in {what}")
        out += found
    return out


def read_manifest(path: str | os.PathLike) -> list[tuple[Path, list[Path]]]:
    """The manifest's problems: [(reference, [candidate, ...]), ...], candidates expanded."""
    manifest = Path(path)
    try:
        lines = manifest.read_text().splitlines()
    except OSError as exc:
        raise ManifestError(f"cannot read manifest {path}: {exc}") from None
    base = manifest.resolve().parent
    problems: dict[Path, list[Path]] = {}
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{path}:{number}"
        reference, entries = _parse_line(line, where)
        reference = (base / reference).resolve()
        entries = [e if os.path.isabs(e) else str(base / e) for e in entries]
        try:
            candidates = expand_candidates(reference, entries)
        except ManifestError as exc:
            raise ManifestError(f"{where}: {exc}") from None
        problems.setdefault(reference, []).extend(candidates)
    if not problems:
        raise ManifestError(f"manifest {path} lists no problems")
    return list(problems.items())


def _parse_line(line: str, where: str) -> tuple[str, list[str]]:
    if line.startswith("{"):
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ManifestError(f"{where}: not a JSON object ({exc})") from None
        if not isinstance(item, dict):
            item = {}
        reference = item.get("reference")
        entries = item["candidates"] if "candidates" in item else [item["candidate"]] if "candidate" in item else None
        if not isinstance(reference, str) or not isinstance(entries, list) or not entries \
                or not all(isinstance(e, str) for e in entries):
            raise ManifestError(f'{where}: expected {{"reference": PATH, "candidate": PATH}} or '
                                f'{{"reference": PATH, "candidates": [PATH, ...]}}')
        return reference, entries
    columns = line.split()
    if len(columns) != 2:
        raise ManifestError(f"{where}: expected two columns, REFERENCE CANDIDATE (got {len(columns)})")
    return columns[0], [columns[1]]
