"""The results table `fastnorm bench` prints: one line per row, time / GB/s / % of copy for each
implementation, then fastnorm's speedup over eager and over torch.compile. Plain text or Markdown."""
from fastnorm.bench.runner import IMPLS, RowResult

HEADERS = (["suite", "op", "dtype", "shape", "dims"]
           + [h for impl in IMPLS for h in (f"{impl} us", "GB/s", "%copy")]
           + ["vs eager", "vs compile", "max err"])
_LEFT = 5  # the first five columns are text, the rest numbers


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


def row_cells(row: RowResult) -> list:
    c = row.case
    cells = [c.suite, c.op, c.dtype, c.shape_str, c.dims_str]
    if row.status != "ok":
        word = "FAILED" if row.status == "failed" else "skipped"
        cells += [word] + [""] * (len(IMPLS) * 3 - 1) + ["", ""]
    else:
        for name in IMPLS:
            r = row.impls[name]
            cells += [fmt_us(r.median_us), fmt_rate(r.gbs), fmt_num(r.pct_copy, ".1f")]
        cells += [fmt_num(row.speedup_vs("eager"), ".2f", "x"), fmt_num(row.speedup_vs("compile"), ".2f", "x")]
    err = row.check.max_abs_err if row.check is not None else None
    cells.append("" if err is None else f"{err:.1e}")
    return cells


def format_table(rows, markdown: bool = False) -> str:
    """All rows as an aligned text table (or a Markdown table)."""
    body = [row_cells(r) for r in rows]
    widths = [max(len(h), *(len(cells[i]) for cells in body)) for i, h in enumerate(HEADERS)]

    def line(cells):
        parts = [cell.ljust(w) if i < _LEFT else cell.rjust(w) for i, (cell, w) in enumerate(zip(cells, widths))]
        return "| " + " | ".join(parts) + " |" if markdown else "  ".join(parts).rstrip()

    out = [line(HEADERS)]
    if markdown:
        out.append("|" + "|".join(("-" * (w + 1) + ":") if i >= _LEFT else "-" * (w + 2)
                                  for i, w in enumerate(widths)) + "|")
    else:
        out.append("  ".join("-" * w for w in widths))
    out += [line(cells) for cells in body]
    return "\n".join(out)
