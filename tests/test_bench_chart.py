"""The bench charts (matplotlib, the `plot` extra): PNGs of the expected size from a run's JSON document,
one colour per implementation column, the row-length chart only where rows have a row length."""
import json
from pathlib import Path

import pytest
import torch
from bench_fakes import fake_row
from png_header import png_size

from fastnorm.bench import chart, report
from fastnorm.bench.cases import BenchCase
from fastnorm.bench.cli import main as bench_main
from fastnorm.bench.runner import RowResult

pytest.importorskip("matplotlib")

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
SEED = BenchCase("seed", "rms_norm", "fp32", (4, 16, 64, 64), (1,), affine=False)
ROWS = [BenchCase("lastdim", op, dtype, (64, n), (1,), affine=True)
        for dtype in ("fp32", "bf16") for n in (1024, 16384) for op in ("layer_norm", "rms_norm")]


def _doc(rows, copy_bw=1e12):
    return report.document(rows, device=torch.device("cpu"), copy_bw=copy_bw, command=["fastnorm", "bench"],
                           settings={"timing": "device"})


def _timed(case, compile_ms=0.04):
    return fake_row(case, {"fastnorm": 0.01, "eager": 0.02, "compile": compile_ms})


def test_bar_chart_is_a_png_of_the_expected_size(tmp_path):
    rows = [_timed(SEED), fake_row(SEED, {}, status="failed"), RowResult(SEED, "skipped", note="too big")]
    rows += [_timed(case) for case in ROWS]
    path = chart.bar_chart(_doc(rows), tmp_path / "sub" / "chart.png")
    data = path.read_bytes()
    assert len(data) > 10_000
    assert png_size(data) == chart.bar_chart_size(len(rows), 3)
    assert chart.bar_chart_size(len(rows), 3)[1] > chart.bar_chart_size(len(rows), 2)[1]


def test_an_implementation_no_row_timed_gets_no_bars_or_legend(tmp_path):
    rows = [fake_row(case, {"fastnorm": 0.01, "eager": 0.02}) for case in ROWS]
    doc = _doc(rows)
    assert chart.implementations(doc) == ["fastnorm", "eager"]
    path = chart.bar_chart(doc, tmp_path / "c.png")
    assert png_size(path.read_bytes()) == chart.bar_chart_size(len(rows), 2)


def test_any_other_implementation_column_gets_its_own_colour(tmp_path):
    doc = _doc([_timed(case) for case in ROWS])
    for i, row in enumerate(doc["rows"]):  # a column the runner does not have yet, e.g. Liger's kernels
        row["impls"]["liger"] = {"median_us": 20.0, "pct_copy": 50.0 + i}
    impls = chart.implementations(doc)
    assert impls == ["fastnorm", "eager", "compile", "liger"]
    palette = chart.colors(impls)
    assert len(set(palette.values())) == 4 and palette["fastnorm"] == chart.COLORS["fastnorm"]
    path = chart.bar_chart(doc, tmp_path / "c.png")
    assert png_size(path.read_bytes()) == chart.bar_chart_size(len(ROWS), 4)


def test_row_length_chart_beside_the_bar_chart_for_rows_with_a_length(tmp_path):
    doc = _doc([_timed(SEED)] + [_timed(case) for case in ROWS])
    written = chart.write_charts(doc, tmp_path / "run.png", row_length_suites=("lastdim",))
    assert written == [tmp_path / "run.png", tmp_path / "run-rows.png"]
    assert png_size(written[1].read_bytes()) == (chart.WIDTH_PX, chart.ROWS_CHART_HEIGHT_PX)
    assert written[1].stat().st_size > 10_000


def test_no_row_length_chart_without_rows_that_have_one(tmp_path):
    doc = _doc([_timed(SEED)] + [_timed(case) for case in ROWS])
    assert chart.write_charts(doc, tmp_path / "a.png", row_length_suites=()) == [tmp_path / "a.png"]
    assert chart.row_length_chart(doc, tmp_path / "b.png", ("seed",)) is None  # channel rows: no length
    assert not (tmp_path / "a-rows.png").exists() and not (tmp_path / "b.png").exists()


def test_row_length_is_the_normalized_size_of_last_dim_rows_only():
    row = report.row_doc(_timed(ROWS[1]))
    assert chart.row_length(row) == 1024
    assert chart.row_length({"shape": [2, 3, 4, 5], "normalized": [1, 2, 3]}) == 60
    assert chart.row_length(report.row_doc(_timed(SEED))) is None  # over dim 1 of 4: strided, not a row


def test_axis_grows_past_100_percent_but_is_capped():
    assert chart.axis_max([3.0, None]) == 100
    assert chart.axis_max([130.0]) == 150
    assert chart.axis_max([900.0]) == chart.MAX_AXIS


def test_title_names_device_dtypes_commit_and_timing():
    doc = _doc([_timed(case) for case in ROWS])
    doc["fastnorm_commit"] = "38f974b0123"
    text = chart.title(doc)
    assert doc["device"] in text and "fp32 + bf16" in text and "commit 38f974b," in text
    assert "device timing" in text and "copy 1000 GB/s" in text
    assert text.startswith("fastnorm bench, forward: % of copy")  # documents without a mode timed the forward
    doc["mode"] = "train"
    assert chart.title(doc).startswith("fastnorm bench, forward + backward: % of copy")


def test_labels_come_from_the_document_or_are_rebuilt_for_older_ones():
    row = report.row_doc(_timed(SEED))
    assert chart.row_label(row) == SEED.label
    del row["label"]  # the committed results were written before rows carried their label
    assert chart.row_label(row) == SEED.label


def test_chart_from_draws_the_committed_results(tmp_path, capsys):
    source = RESULTS / "h100.json"
    doc = json.loads(source.read_text())
    out = tmp_path / "h100.png"
    assert bench_main(["--chart-from", str(source), "--chart", str(out)]) == 0
    assert png_size(out.read_bytes()) == chart.bar_chart_size(len(doc["rows"]), 3)
    assert png_size((tmp_path / "h100-rows.png").read_bytes()) == (chart.WIDTH_PX, chart.ROWS_CHART_HEIGHT_PX)
    assert f"wrote {out} and {tmp_path / 'h100-rows.png'}" in capsys.readouterr().out


def test_chart_from_a_file_that_is_not_a_bench_json_is_an_error(tmp_path, capsys):
    bad = tmp_path / "x.json"
    for text in ("[1, 2]", '{"rows": []}', "{"):
        bad.write_text(text)
        assert bench_main(["--chart-from", str(bad)]) == 2
    assert bench_main(["--chart-from", str(tmp_path / "missing.json")]) == 2
    assert "not a bench JSON" in capsys.readouterr().out
    assert not list(tmp_path.glob("*.png"))
