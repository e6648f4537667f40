"""The results table `fastnorm bench` prints: one line per row, time / GB/s / % of copy for each
implementation some row timed, then fastnorm's speedup over each baseline and over the fastest one.
Plain text or Markdown. Implementations no row timed get a line below the table saying why."""
from fastnorm.bench.runner import BASELINES, IMPLS, RowResult

_TEXT_COLUMNS = ["suite", "op", "dtype", "shape", "dims"]


def fmt_us(us) -> str:
    if us is None:
        return "n/a"
    if us < 10:
        return f"{us:.2f}"
    if us < 1000:
        return f"{us:.1f}"
    return f"{us:.0f}"


def fmt_num(value, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def fmt_rate(gbs) -> str:
    """GB/s with about three significant digits (CPU rows are small numbers, GPU rows thousands)."""
    if gbs is None:
        return "n/a"
    return f"{gbs:.2f}" if gbs < 10 else f"{gbs:.1f}" if gbs < 100 else f"{gbs:.0f}"


def fmt_bytes(nbytes: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{nbytes} B"


def shown_impls(rows) -> list:
    """fastnorm and every implementation some row timed, in IMPLS order."""
    return [name for name in IMPLS if name == "fastnorm" or any(r.impls[name].timed for r in rows)]


def headers(impls) -> list:
    return (_TEXT_COLUMNS + [h for impl in impls for h in (f"{impl} us", "GB/s", "%copy")]
            + [f"vs {name}" for name in impls if name in BASELINES] + ["vs best", "max err"])


def row_cells(row: RowResult, impls=IMPLS) -> list:
    c = row.case
    cells = [c.suite, c.op, c.dtype, c.shape_str + c.layout_str, c.dims_str]
    baselines = [name for name in impls if name in BASELINES]
    if row.status != "ok":
        word = "FAILED" if row.status == "failed" else "skipped"
        cells += [word] + [""] * (len(impls) * 3 - 1) + [""] * (len(baselines) + 1)
    else:
        for name in impls:
            r = row.impls[name]
            cells += [fmt_us(r.median_us), fmt_rate(r.gbs), fmt_num(r.pct_copy, ".1f")]
        cells += [fmt_num(row.speedup_vs(name), ".2f", "x") for name in baselines]
        cells.append(fmt_num(row.speedup_vs_best(), ".2f", "x"))
    err = row.check.max_abs_err if row.check is not None else None
    cells.append("" if err is None else f"{err:.1e}")
    return cells


def align(head, body, markdown: bool = False, left=range(len(_TEXT_COLUMNS))) -> str:
    """Rows of cells as an aligned table: the columns whose indices are in `left` left-aligned text,
    the rest right-aligned numbers; or a Markdown table."""
    widths = [max(len(h), *(len(cells[i]) for cells in body)) for i, h in enumerate(head)]

    def line(cells):
        parts = [cell.ljust(w) if i in left else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths))]
        return "| " + " | ".join(parts) + " |" if markdown else "  ".join(parts).rstrip()

    out = [line(head)]
    if markdown:
        out.append("|" + "|".join("-" * (w + 2) if i in left else ("-" * (w + 1) + ":")
                                  for i, w in enumerate(widths)) + "|")
    else:
        out.append("  ".join("-" * w for w in widths))
    out += [line(cells) for cells in body]
    return "\n".join(out)


def format_table(rows, markdown: bool = False) -> str:
    """All rows as an aligned text table (or a Markdown table), then one line per implementation that
    no row timed, with the reason its first row gives."""
    impls = shown_impls(rows)
    text = align(headers(impls), [row_cells(r, impls) for r in rows], markdown)
    ok_rows = [r for r in rows if r.status == "ok"]
    for name in IMPLS:
        if name not in impls and ok_rows:
            text += f"\n{name}: not timed ({ok_rows[0].impls[name].note or 'n/a'})"
    return text
