"""Charts of a bench run, drawn with matplotlib (the optional `plot` extra) from the run's JSON document,
so a committed result can be drawn again: % of copy bandwidth per case and implementation (grouped
horizontal bars), and % of copy against row length for suites whose cases have one.

Drawn on a bare Figure with the Agg canvas: no pyplot state, no display needed. Every implementation
column in the document gets a colour, so a new one (e.g. liger) is charted without changes here.
"""
import math
from pathlib import Path
from typing import Optional

from fastnorm.bench import modes

MISSING = 'charts need matplotlib: pip install "fastnorm[plot]"'

COLORS = {"fastnorm": "#1f77b4", "eager": "#8c8c8c", "compile": "#ff7f0e", "liger": "#2ca02c"}
EXTRA_COLORS = ("#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")  # other columns, in order
LEGEND = {"fastnorm": "fastnorm", "eager": "PyTorch eager", "compile": "torch.compile", "liger": "Liger"}
OP_MARKERS = {"layer_norm": "o", "rms_norm": "s"}
OP_NAMES = {"layer_norm": "LayerNorm", "rms_norm": "RMSNorm"}
FAILED_COLOR = "#c81e1e"

DPI = 100
WIDTH_PX = 1200
HEAD_PX, FOOT_PX = 120, 60             # title and legend above the bars, the axis below
BAR_PX, GROUP_GAP_PX = 13, 12          # one bar; the space between two cases
ROWS_CHART_HEIGHT_PX = 560             # the row-length chart
MAX_AXIS = 300  # % of copy; bars beyond it are clipped, their numbers still say the truth


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width_px: int, height_px: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Constrained layout, 0.1 inch around the axes (as a dict: the form old and new matplotlib both take).
    fig = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI,
                 constrained_layout={"w_pad": 0.1, "h_pad": 0.1})
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")
    return path


def implementations(doc: dict) -> list:
    """The implementation columns some row timed, in the document's order; all of them when none was."""
    names = _ordered(name for row in doc["rows"] for name in row["impls"])
    timed = [n for n in names if any(_pct(row, n) is not None for row in doc["rows"])]
    return timed or names


def colors(impls) -> dict:
    extra = iter(EXTRA_COLORS * (1 + len(impls) // len(EXTRA_COLORS)))
    return {name: COLORS[name] if name in COLORS else next(extra) for name in impls}


def _pct(row: dict, impl: str) -> Optional[float]:
    return (row["impls"].get(impl) or {}).get("pct_copy")


def row_label(row: dict) -> str:
    """The case's label ("LN fp32 16384x4096 last"); documents written before rows carried one get it
    rebuilt from the case's fields."""
    if row.get("label"):
        return row["label"]
    from fastnorm.bench.cases import BenchCase

    return BenchCase(row["suite"], row["op"], row["dtype"], tuple(row["shape"]), tuple(row["normalized"]),
                     bool(row.get("affine", True)), offset=row.get("offset", 0), pad=row.get("pad", 0)).label


def row_length(row: dict) -> Optional[int]:
    """Elements a statistic is taken over, for rows normalized over their last dims; None otherwise."""
    shape, dims = row.get("shape"), row.get("normalized")
    if not shape or not dims or dims[-1] != len(shape) - 1:
        return None
    return math.prod(shape[d] for d in dims)


def axis_max(values) -> int:
    """Right end of the % of copy axis: 100 (the copy) or more when a value beats it, in steps of 25."""
    best = max((v for v in values if v is not None), default=0.0)
    return int(min(MAX_AXIS, max(100, math.ceil(best / 25) * 25)))


def title(doc: dict, heading: str = "% of copy bandwidth") -> str:
    """The mode and the heading, then what ran where: device, dtypes, torch, commit (when known), copy
    bandwidth and timing mode. Documents written before modes existed timed the forward."""
    dtypes = _ordered(row["dtype"] for row in doc["rows"] if row.get("dtype"))
    parts = [doc.get("device", "unknown device"), " + ".join(dtypes)]
    if doc.get("torch"):
        parts.append(f"torch {doc['torch']}")
    if doc.get("fastnorm_commit"):
        parts.append(f"commit {doc['fastnorm_commit'][:7]}")
    if doc.get("copy_bandwidth_gbs"):
        parts.append(f"copy {doc['copy_bandwidth_gbs']:.0f} GB/s")
    timing = (doc.get("settings") or {}).get("timing")
    if timing:
        parts.append(f"{timing} timing")
    mode = modes.TITLES.get(doc.get("mode", "fwd"), doc.get("mode"))
    return f"fastnorm bench, {mode}: {heading} (higher is better)\n" + ", ".join(parts)


def bar_chart_size(n_rows: int, n_impls: int) -> tuple:
    """(width, height) in pixels of the bar chart of n_rows cases and n_impls implementations."""
    group = n_impls * BAR_PX + GROUP_GAP_PX
    return WIDTH_PX, HEAD_PX + max(1, n_rows) * group + FOOT_PX


def bar_chart(doc: dict, path: Path) -> Path:
    """% of copy per case (top to bottom, in run order) and implementation, as grouped horizontal bars."""
    rows, impls = doc["rows"], implementations(doc)
    palette = colors(impls)
    fig = _figure(*bar_chart_size(len(rows), len(impls)))
    ax = fig.add_subplot()
    top = axis_max(_pct(row, n) for row in rows for n in impls)
    right = top * 1.06  # room for the numbers of bars that reach the axis
    bar = 1.0 / (len(impls) + 1)  # in units of one case; the rest of the unit is the gap
    for i, row in enumerate(rows):
        if row.get("status", "ok") != "ok":
            word = "FAILED" if row["status"] == "failed" else "SKIPPED"
            note = row.get("note") or (row.get("check") or {}).get("error") or ""
            ax.text(top * 0.01, i, f"{word} {note}".strip(), va="center", color=FAILED_COLOR, fontsize=8)
            continue
        for j, name in enumerate(impls):
            y = i + (j - (len(impls) - 1) / 2) * bar
            pct = _pct(row, name)
            if pct is None:
                ax.text(top * 0.005, y, "n/a", va="center", fontsize=6.5, color="#555555")
                continue
            ax.barh(y, min(pct, top), height=bar * 0.9, color=palette[name])
            ax.text(min(pct, top) + top * 0.004, y, f"{pct:.0f}%", va="center", fontsize=6.5,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3})  # legible over the 100% line

    suites = [row.get("suite", "") for row in rows]
    for i, suite in enumerate(suites):  # each suite's name on the line above its first case
        if i == 0 or suites[i - 1] != suite:
            if i:
                ax.axhline(i - 0.5, color="#999999", linewidth=0.8, linestyle="--")
            ax.text(right * 0.995, i - 0.5, suite, ha="right", va="bottom" if i == 0 else "center", fontsize=8,
                    style="italic", color="#444444",
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 1} if i else None)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([row_label(r) for r in rows], fontfamily="monospace", fontsize=9)
    ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)
    ax.set_xlim(0, right)
    ax.set_xticks(range(0, top + 1, 25 if top <= 150 else 50))
    ax.xaxis.set_major_formatter(_percent_formatter())
    ax.axvline(100, color="black", linewidth=1.2)
    ax.grid(axis="x", color="#dddddd")
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", length=0)
    for i in range(1, len(rows), 2):  # alternate bands so a case's bars read as one group
        ax.axhspan(i - 0.5, i + 0.5, color="#f4f4f4", zorder=0)
    _legend(ax, [(palette[n], LEGEND.get(n, n)) for n in impls])
    fig.suptitle(title(doc), fontsize=11)
    return _save(fig, path)


def row_length_chart(doc: dict, path: Path, suites) -> Optional[Path]:
    """% of copy against row length (log axis) of the rows of `suites` that have a row length: one panel
    per dtype, one colour per implementation, one marker per op (filled: LayerNorm, open: RMSNorm);
    a series' points are joined when its row lengths are distinct. None (and no file) when no row
    qualifies."""
    rows = [r for r in doc["rows"] if r.get("suite") in suites and r.get("status", "ok") == "ok"
            and row_length(r) is not None]
    if not rows:
        return None
    from matplotlib.lines import Line2D
    from matplotlib.ticker import LogLocator

    impls, dtypes, ops = implementations(doc), _ordered(r["dtype"] for r in rows), _ordered(r["op"] for r in rows)
    palette = colors(impls)
    fig = _figure(WIDTH_PX, ROWS_CHART_HEIGHT_PX)
    grid = fig.add_gridspec(2, len(dtypes), height_ratios=(1, 14))  # a thin top row holds the legend
    axes = []
    for i in range(len(dtypes)):
        axes.append(fig.add_subplot(grid[1, i], sharey=axes[0] if axes else None))
    top = axis_max(_pct(r, n) for r in rows for n in impls)
    lengths = [row_length(r) for r in rows]
    tick_base = 4 if max(lengths) >= 64 * min(lengths) else 2  # ticks 1K, 4K, ... 4M; every 2x when narrow
    for ax, dtype in zip(axes, dtypes):
        for op in ops:
            series = sorted((r for r in rows if r["dtype"] == dtype and r["op"] == op), key=row_length)
            for name in impls:
                points = [(row_length(r), _pct(r, name)) for r in series if _pct(r, name) is not None]
                if not points:
                    continue
                xs, ys = zip(*points)
                ax.plot(xs, ys, color=palette[name], linestyle="-" if len(set(xs)) == len(xs) else "none",
                        linewidth=1, alpha=0.9, **_marker(op, palette[name]))
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=tick_base))
        ax.xaxis.set_major_formatter(_elements_formatter())
        ax.set_ylim(0, top)
        ax.axhline(100, color="black", linewidth=1.2)
        ax.grid(color="#dddddd")
        ax.set_title(dtype, fontsize=10)
        ax.set_xlabel("row length (elements)")
        if ax is not axes[0]:
            ax.tick_params(labelleft=False)
    axes[0].set_ylabel("% of copy bandwidth")
    axes[0].yaxis.set_major_formatter(_percent_formatter())
    handles = [Line2D([], [], color=palette[n], linewidth=6) for n in impls]
    handles += [Line2D([], [], linestyle="none", **_marker(op, "#444444")) for op in ops]
    labels = [LEGEND.get(n, n) for n in impls] + [OP_NAMES.get(op, op) for op in ops]
    legend_ax = fig.add_subplot(grid[0, :])
    legend_ax.axis("off")
    legend_ax.legend(handles, labels, loc="center", ncol=len(labels), frameon=False, fontsize=9)
    fig.suptitle(title(doc, "% of copy bandwidth by row length"), fontsize=11)
    return _save(fig, path)


def _marker(op: str, color: str) -> dict:
    """Marker of an op's points: LayerNorm filled circles, RMSNorm open squares, others filled triangles."""
    return {"marker": OP_MARKERS.get(op, "^"), "markersize": 6, "markeredgecolor": color,
            "markerfacecolor": "white" if op == "rms_norm" else color}


def _ordered(values) -> list:
    """The distinct values in order of first appearance."""
    seen = []
    for value in values:
        if value not in seen:
            seen.append(value)
    return seen


def rows_chart_path(chart_path: Path) -> Path:
    """Where the row-length chart goes: beside the bar chart, `<name>-rows.png`."""
    chart_path = Path(chart_path)
    return chart_path.with_name(chart_path.stem + "-rows" + chart_path.suffix)


def write_charts(doc: dict, chart_path: Path, row_length_suites=()) -> list:
    """The bar chart at `chart_path` and, when rows of `row_length_suites` have a row length, the
    row-length chart beside it. Returns the paths written. Needs matplotlib (see `available`)."""
    written = [bar_chart(doc, chart_path)]
    rows = row_length_chart(doc, rows_chart_path(chart_path), row_length_suites)
    return written + ([rows] if rows is not None else [])


def _legend(ax, entries):
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=label) for c, label in entries], loc="lower left",
              bbox_to_anchor=(0.0, 1.0), ncol=max(1, len(entries)), frameon=False, fontsize=9)


def _percent_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _: f"{value:.0f}%")


def _elements_formatter():
    """1024 -> "1K", 4194304 -> "4M": row lengths in binary units, as the shapes are powers of two."""
    from matplotlib.ticker import FuncFormatter

    def fmt(value, _):
        for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
            if value >= size:
                return f"{value / size:g}{unit}"
        return f"{value:g}"
    return FuncFormatter(fmt)
