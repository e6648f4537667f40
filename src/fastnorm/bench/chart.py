"""The bench chart: % of copy bandwidth per row and implementation, as horizontal grouped bars
(one group per row, labelled on the left, so long shape names stay legible). Drawn on png.Canvas."""
import math
from pathlib import Path

from fastnorm.bench.png import Canvas
from fastnorm.bench.runner import IMPLS

COLORS = {"fastnorm": (31, 119, 180), "eager": (150, 150, 150), "compile": (255, 127, 14)}
LEGEND = {"fastnorm": "fastnorm", "eager": "PyTorch eager", "compile": "torch.compile"}
INK, GRID, BAND, RED = (20, 20, 20), (222, 222, 222), (246, 246, 246), (200, 30, 30)

MARGIN, LABEL_SCALE = 16, 2
BAR, BAR_GAP, GROUP_GAP = 10, 2, 12
PLOT_WIDTH = 720
MAX_AXIS = 300  # % of copy; bars beyond it are clipped, their numbers still say the truth


def axis_max(rows) -> int:
    """Right end of the axis: 100% (the copy) or more when a row beats it, in steps of 25."""
    best = max((r.impls[n].pct_copy for r in rows for n in IMPLS if r.impls[n].pct_copy is not None),
               default=0.0)
    return int(min(MAX_AXIS, max(100, math.ceil(best / 25) * 25)))


def render_chart(rows, title: str, subtitle: str = "") -> Canvas:
    # Implementations no row timed (torch.compile when it is off) get neither bars nor a legend entry.
    impls = [n for n in IMPLS if any(r.impls[n].timed for r in rows)] or list(IMPLS)
    text_h = Canvas.text_height(LABEL_SCALE)
    labels = [r.case.label + ("" if r.case.suite != "latency" else " (latency)") for r in rows]
    label_w = max((Canvas.text_width(s, LABEL_SCALE) for s in labels), default=0)
    group_h = len(impls) * (BAR + BAR_GAP) - BAR_GAP + GROUP_GAP
    plot_x = MARGIN + label_w + 12
    head_h = 3 * (text_h + 8) + 8  # title, subtitle, legend
    plot_y = MARGIN + head_h
    plot_h = max(1, len(rows)) * group_h
    width = plot_x + PLOT_WIDTH + 70 + MARGIN
    height = plot_y + plot_h + text_h + 16 + MARGIN
    canvas = Canvas(width, height)

    canvas.draw_text(MARGIN, MARGIN, title, INK, LABEL_SCALE)
    canvas.draw_text(MARGIN, MARGIN + text_h + 8, subtitle, INK, LABEL_SCALE)
    x = MARGIN
    legend_y = MARGIN + 2 * (text_h + 8)
    for name in impls:
        canvas.fill_rect(x, legend_y, x + text_h, legend_y + text_h, COLORS[name])
        canvas.draw_text(x + text_h + 6, legend_y, LEGEND[name], INK, LABEL_SCALE)
        x += text_h + 6 + Canvas.text_width(LEGEND[name], LABEL_SCALE) + 24

    top = axis_max(rows)
    scale = PLOT_WIDTH / top
    for i in range(len(rows)):  # alternate bands so a group's bars read as one row
        if i % 2:
            canvas.fill_rect(MARGIN, plot_y + i * group_h, plot_x + PLOT_WIDTH, plot_y + (i + 1) * group_h, BAND)
    step = 25 if top <= 150 else 50
    for pct in range(0, top + 1, step):
        gx = plot_x + round(pct * scale)
        canvas.fill_rect(gx, plot_y, gx + (2 if pct == 100 else 1), plot_y + plot_h,
                         INK if pct in (0, 100) else GRID)
        tick = f"{pct}%"
        canvas.draw_text(gx - Canvas.text_width(tick, LABEL_SCALE) // 2, plot_y + plot_h + 8, tick, INK,
                         LABEL_SCALE)

    for i, (row, label) in enumerate(zip(rows, labels)):
        gy = plot_y + i * group_h + GROUP_GAP // 2
        bars_h = group_h - GROUP_GAP
        canvas.draw_text(MARGIN, gy + (bars_h - text_h) // 2, label, INK, LABEL_SCALE)
        if row.status != "ok":
            word = "FAILED" if row.status == "failed" else "SKIPPED"
            canvas.draw_text(plot_x + 6, gy + (bars_h - text_h) // 2, word, RED, LABEL_SCALE)
            continue
        for j, name in enumerate(impls):
            by = gy + j * (BAR + BAR_GAP)
            pct = row.impls[name].pct_copy
            if pct is None:
                canvas.draw_text(plot_x + 4, by + 1, "n/a", INK, 1)
                continue
            bw = max(1, round(min(pct, top) * scale))
            canvas.fill_rect(plot_x, by, plot_x + bw, by + BAR, COLORS[name])
            canvas.draw_text(plot_x + bw + 4, by + 1, f"{pct:.0f}%", INK, 1)
    return canvas


def write_chart(rows, path: Path, title: str, subtitle: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(render_chart(rows, title, subtitle).to_png())
