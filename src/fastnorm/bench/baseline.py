"""A bench run against a committed bench JSON (`fastnorm bench --baseline`, or `--compare` for two JSONs):
the rows where fastnorm's median got slower by more than a tolerance, worst first, and the rows only one
side has.

Rows are matched by what they measure (suite, op, dtype, shape, normalized dims, parameters, layout),
not by position or label, so a filtered run or a longer suite still lines up. `--suite family` documents
(rows of problems/ files, fastnorm's ModelNew in milliseconds) compare with each other, by problem. Times of different modes
measure different work, so a mode mismatch is refused; a different device or timing method only warns:
comparing across GPUs is a legitimate use, but the ratios then measure the devices as well as the code.
"""
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from fastnorm.bench.cases import BenchCase
from fastnorm.bench.table import align, fmt_us

DEFAULT_TOLERANCE = 0.05  # run-to-run spread on the H100 is 1-2% (benchmarks/README.md): 5% is a change

# Settings that change what a time means; their values in documents written before they existed.
_TIME_SETTINGS = {"timing": "device", "flush_l2": True}


class BaselineError(Exception):
    """The documents cannot be compared (unreadable, not a bench JSON, another mode): exit status 2."""


def doc_mode(doc: dict) -> str:
    return doc.get("mode") or "fwd"  # documents written before --mode existed timed the forward


def is_family_row(row: dict) -> bool:
    """A --suite family row (a problems/ file and its ModelNew), not a norm call's."""
    return "problem" in row


def doc_kind(doc: dict) -> str:
    return "family" if doc.get("suite") == "family" else "norm"


def row_key(row: dict) -> tuple:
    """What a row measures. The label is left out: it is derived from these fields (all but affine),
    and documents written before it existed have none. offset and pad default to 0 for the same reason.
    A family row is its problem (the file fixes the shapes and dtypes)."""
    if is_family_row(row):
        return ("family", str(row["problem"]))
    return (row["suite"], row["op"], row["dtype"], tuple(row["shape"]), tuple(row["normalized"]),
            bool(row["affine"]), row.get("offset", 0), row.get("pad", 0))


def row_suite(row: dict) -> str:
    return "family" if is_family_row(row) else row["suite"]


def case_label(row: dict) -> str:
    """The row's label, rebuilt from its fields where the document has none."""
    if is_family_row(row):
        return str(row["problem"])
    if row.get("label"):
        return row["label"]
    try:
        return BenchCase(row["suite"], row["op"], row["dtype"], tuple(row["shape"]), tuple(row["normalized"]),
                         bool(row["affine"]), offset=row.get("offset", 0), pad=row.get("pad", 0)).label
    except (KeyError, TypeError, ValueError, IndexError):
        return " ".join(str(part) for part in row_key(row)[1:])


def row_label(row: dict) -> str:
    """'suite: label': labels repeat across suites (the train suite reuses last-dim shapes)."""
    return f"{row_suite(row)}: {case_label(row)}"


def fastnorm_us(row: dict) -> Optional[float]:
    """fastnorm's median in microseconds, None where it was not timed (failed check, skipped row)."""
    if is_family_row(row):
        ms = row.get("fastnorm_ms") if row.get("ok") else None
        us = 1000.0 * ms if isinstance(ms, (int, float)) else None
        return us if us is not None and math.isfinite(us) and us > 0 else None
    impl = (row.get("impls") or {}).get("fastnorm") or {}
    us = impl.get("median_us")
    return float(us) if isinstance(us, (int, float)) and math.isfinite(us) and us > 0 else None


def _untimed_reason(row: dict) -> str:
    if is_family_row(row):
        return row.get("note") or ("failed" if not row.get("ok") else "not timed")
    if row.get("status") not in (None, "ok"):
        return row["status"]
    return ((row.get("impls") or {}).get("fastnorm") or {}).get("note") or "not timed"


def load(path) -> dict:
    """A bench JSON with norm rows (what `fastnorm bench --json` writes) or a --suite family one, or
    BaselineError saying why not."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise BaselineError(f"{path}: cannot read it as JSON ({exc})") from None
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not isinstance(rows, list) or not rows:
        raise BaselineError(f"{path}: not a bench JSON (no rows)")
    if doc.get("suite") == "model":  # its rows are whole training steps, of their own kind
        raise BaselineError(f"{path}: a --suite model JSON; norm rows' and family rows' JSONs compare")
    family = doc_kind(doc) == "family"
    seen = set()
    for i, row in enumerate(rows):
        try:
            if not isinstance(row, dict) or is_family_row(row) != family:
                raise TypeError("not a " + ("family" if family else "norm") + " row")
            key = row_key(row)
            hash(key)  # a shape of lists would fail the lookups later
            if not family and not isinstance(row.get("impls"), dict):
                raise KeyError("impls")
        except (KeyError, TypeError, AttributeError) as exc:
            detail = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
            raise BaselineError(f"{path}: row {i} is not a bench row ({detail})") from None
        if key in seen:  # matching by identity needs each identity once
            raise BaselineError(f"{path}: row {i} ({row_label(row)}) appears twice")
        seen.add(key)
    return doc


def check_compatible(run: dict, baseline: dict) -> List[str]:
    """Warnings about what makes the two sets of times less comparable; BaselineError where they
    measure different things. `run` needs only mode, device and settings (checked before a run starts;
    `suite` too where it is the family's)."""
    if doc_kind(run) != doc_kind(baseline):
        raise BaselineError(f"the baseline has {doc_kind(baseline)} rows, the new run {doc_kind(run)} rows: "
                            f"they measure different things")
    if doc_mode(run) != doc_mode(baseline):
        raise BaselineError(f"the baseline timed --mode {doc_mode(baseline)}, the new run --mode "
                            f"{doc_mode(run)}: their times measure different work")
    warnings = []
    if run.get("device") != baseline.get("device"):
        warnings.append(f"the baseline ran on {baseline.get('device') or 'an unnamed device'}, the new run on "
                        f"{run.get('device') or 'an unnamed device'}: the ratios measure the devices too")
    for name, default in _TIME_SETTINGS.items():
        ours, theirs = _setting(run, name, default), _setting(baseline, name, default)
        if ours != theirs:
            warnings.append(f"the baseline ran with {name} {theirs}, the new run with {ours}: "
                            f"times taken differently")
    return warnings


def _setting(doc: dict, name: str, default):
    """A timing setting of a document: under "settings", or at the top (family documents' "timing")."""
    settings = doc.get("settings") or {}
    return settings[name] if name in settings else doc.get(name, default)


@dataclass
class RowChange:
    suite: str
    label: str
    baseline_us: float
    new_us: float

    @property
    def ratio(self) -> float:
        """new / baseline: above 1 is slower."""
        return self.new_us / self.baseline_us

    def to_json(self) -> dict:
        return {"suite": self.suite, "label": self.label, "baseline_us": self.baseline_us,
                "median_us": self.new_us, "ratio": self.ratio}


@dataclass
class Comparison:
    tolerance: float
    path: str = ""                      # the baseline file, as given
    source: dict = field(default_factory=dict)  # the baseline's commit, device, torch, mode
    warnings: List[str] = field(default_factory=list)
    regressed: List[RowChange] = field(default_factory=list)  # worst first
    improved: List[RowChange] = field(default_factory=list)   # best first
    within: List[RowChange] = field(default_factory=list)
    only_baseline: List[str] = field(default_factory=list)
    only_new: List[str] = field(default_factory=list)
    not_compared: List[str] = field(default_factory=list)     # in both, fastnorm untimed on a side

    @property
    def compared(self) -> int:
        return len(self.regressed) + len(self.improved) + len(self.within)

    @property
    def status(self) -> int:
        return 1 if self.regressed else 0

    def to_json(self) -> dict:
        return {"path": self.path, **self.source, "tolerance": self.tolerance, "warnings": self.warnings,
                "compared": self.compared, "regressions": [c.to_json() for c in self.regressed],
                "improvements": [c.to_json() for c in self.improved], "within": len(self.within),
                "only_in_baseline": self.only_baseline, "only_in_new": self.only_new,
                "not_compared": self.not_compared}

    def format(self, markdown: bool = False) -> str:
        pct = f"{100 * self.tolerance:g}%"
        src = self.source
        lines = [f"against baseline {self.path or '(unnamed)'} (fastnorm {src.get('fastnorm_commit') or '?'}, "
                 f"{src.get('device') or '?'}, torch {src.get('torch') or '?'}, --mode {src.get('mode')}): "
                 f"{_rows(self.compared)} compared (fastnorm's median), tolerance {pct}"]
        lines += [f"warning: {w}" for w in self.warnings]
        for title, changes in ((f"REGRESSED, more than {pct} slower, worst first", self.regressed),
                               (f"faster by more than {pct}", self.improved)):
            if changes:
                lines += ["", f"{title} ({len(changes)}):", _table(changes, markdown)]
        for title, labels in (("only in the baseline", self.only_baseline), ("only in the new run", self.only_new),
                              ("not compared, fastnorm not timed", self.not_compared)):
            if labels:
                lines += ["", f"{title} ({len(labels)}): {'; '.join(labels)}"]
        verdict = (f"{len(self.regressed)} of {_rows(self.compared)} REGRESSED" if self.regressed
                   else f"no row regressed ({self.compared} compared)")
        lines += ["", f"baseline: {verdict}; {len(self.improved)} faster, {len(self.within)} within {pct}"]
        return "\n".join(lines)


def _rows(n: int) -> str:
    return f"{n} row" + ("" if n == 1 else "s")


def _table(changes, markdown: bool) -> str:
    body = [[c.suite, c.label, fmt_us(c.baseline_us), fmt_us(c.new_us), f"{c.ratio:.3f}x"] for c in changes]
    return align(["suite", "row", "baseline us", "new us", "new/baseline"], body, markdown, left={0, 1})


def compare(run: dict, baseline: dict, tolerance: float = DEFAULT_TOLERANCE, path="") -> Comparison:
    """fastnorm's median in each row of `run` against the same row of `baseline` (both bench JSON
    documents; load() checks files). Raises BaselineError for a mode mismatch."""
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a fraction >= 0, got {tolerance}")
    result = Comparison(tolerance, str(path), warnings=check_compatible(run, baseline),
                        source={"fastnorm_commit": baseline.get("fastnorm_commit"), "device": baseline.get("device"),
                                "torch": baseline.get("torch"), "mode": doc_mode(baseline)})
    old = {row_key(r): r for r in baseline["rows"]}
    new_keys = set()
    for row in run["rows"]:
        key = row_key(row)
        new_keys.add(key)
        if key not in old:
            result.only_new.append(row_label(row))
            continue
        before, now = fastnorm_us(old[key]), fastnorm_us(row)
        if before is None or now is None:
            sides = [f"{side}: {_untimed_reason(r)}" for side, r, us in (("baseline", old[key], before),
                                                                          ("new", row, now)) if us is None]
            result.not_compared.append(f"{row_label(row)} ({', '.join(sides)})")
            continue
        change = RowChange(row_suite(row), case_label(row), before, now)
        if now > before * (1 + tolerance):
            result.regressed.append(change)
        elif now < before * (1 - tolerance):
            result.improved.append(change)
        else:
            result.within.append(change)
    result.only_baseline = [row_label(r) for key, r in old.items() if key not in new_keys]
    result.regressed.sort(key=lambda c: c.ratio, reverse=True)
    result.improved.sort(key=lambda c: c.ratio)
    return result
