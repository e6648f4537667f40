"""Worst rows first: fastnorm against the fastest baseline (eager, torch.compile, Liger) of each row,
with the rows that miss issue 20's targets flagged: slower than 0.97x the fastest baseline, or under
90% of copy where some baseline reaches 90%. Printed for suites that ask for it (Suite.rank_worst)."""
from fastnorm.bench.runner import BASELINES, RowResult
from fastnorm.bench.table import align, fmt_num, fmt_us

SPEED_TARGET = 0.97   # fastnorm >= this x the fastest baseline
COPY_TARGET = 90.0    # % of copy fastnorm must reach where a baseline reaches it


def flags(row: RowResult) -> list:
    """The targets a row misses, as short phrases (empty when it meets them or was not timed)."""
    if row.status == "failed":
        return ["FAILED"]
    out = []
    ratio = row.speedup_vs_best()
    if ratio is not None and ratio < SPEED_TARGET:
        out.append(f"below {SPEED_TARGET}x {row.best_baseline()}")
    ours = row.impls["fastnorm"].pct_copy
    top = max(BASELINES, key=lambda name: row.impls[name].pct_copy or 0.0)
    theirs = row.impls[top].pct_copy or 0.0
    if ours is not None and ours < COPY_TARGET <= theirs:
        out.append(f"under {COPY_TARGET:.0f}% of copy ({ours:.1f}%; {top} {theirs:.1f}%)")
    return out


def worst_first(rows) -> list:
    """FAILED rows, then timed rows by speedup over the fastest baseline (lowest first), then the rest
    (skipped, or no baseline timed) in their order."""
    def key(item):
        i, row = item
        ratio = row.speedup_vs_best()
        if row.status == "failed":
            return (0, 0.0, i)
        return (1, ratio, i) if ratio is not None else (2, 0.0, i)
    return [row for _, row in sorted(enumerate(rows), key=key)]


_HEAD = ["case", "vs best", "best", "fastnorm us", "%copy", "best us", "%copy", "flags"]


def _cells(row: RowResult) -> list:
    if row.status != "ok":
        word = "FAILED" if row.status == "failed" else "skipped"
        return [row.case.label, word, "", "", "", "", "", row.note or "; ".join(flags(row))]
    best = row.best_baseline()
    ours = row.impls["fastnorm"]
    theirs = row.impls[best] if best else None
    return [row.case.label, fmt_num(row.speedup_vs_best(), ".2f", "x"), best or "",
            fmt_us(ours.median_us), fmt_num(ours.pct_copy, ".1f"),
            fmt_us(theirs.median_us) if theirs else "", fmt_num(theirs.pct_copy, ".1f") if theirs else "",
            "; ".join(flags(row))]


def summary(rows) -> str:
    flagged = [r for r in rows if flags(r)]
    slow = [r for r in rows if any(f.startswith("below") for f in flags(r))]
    under = [r for r in rows if any(f.startswith("under") for f in flags(r))]
    failed = [r for r in rows if r.status == "failed"]
    return (f"{len(flagged)} of {len(rows)} rows flagged: {len(slow)} below {SPEED_TARGET}x the fastest "
            f"baseline, {len(under)} under {COPY_TARGET:.0f}% of copy where a baseline reaches it, "
            f"{len(failed)} FAILED")


def format_ranking(rows, markdown: bool = False) -> str:
    """The rows worst first (see worst_first), one line each, and a summary line."""
    ordered = worst_first(rows)
    table = align(_HEAD, [_cells(r) for r in ordered], markdown, left={0, 2, 7})
    return table + "\n" + summary(rows)
