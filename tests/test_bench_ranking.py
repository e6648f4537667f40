"""Worst rows first against the fastest baseline, and the flags of issue 20's targets (0.97x the
fastest baseline; 90% of copy where a baseline reaches it), in the printout and in the JSON."""
import json

import torch
from bench_fakes import fake_row

from fastnorm.bench import ranking, report
from fastnorm.bench.cases import BenchCase
from fastnorm.bench.runner import RowResult

CASE = BenchCase("sweep", "rms_norm", "bf16", (4096, 4097), (1,), affine=True)
COPY_BW = CASE.minimal_bytes() / 1e-4  # 100% of copy at 0.1 ms


def _row(**times):
    return fake_row(CASE, times, copy_bw=COPY_BW)


def test_speedup_is_against_the_fastest_timed_baseline():
    row = _row(fastnorm=0.1, eager=0.3, compile=0.12, liger=0.2)
    assert row.best_baseline() == "compile" and abs(row.speedup_vs_best() - 1.2) < 1e-9
    assert _row(fastnorm=0.1).best_baseline() is None and _row(fastnorm=0.1).speedup_vs_best() is None


def test_flags_below_097_of_the_fastest_baseline():
    assert ranking.flags(_row(fastnorm=0.1, eager=0.0975)) == []  # 0.975x: within target
    assert ranking.flags(_row(fastnorm=0.1, eager=0.3, liger=0.096)) == ["below 0.97x liger"]


def test_flags_under_90_percent_of_copy_only_where_a_baseline_reaches_it():
    # fastnorm at 0.12 ms = 83% of copy; eager at 0.11 ms = 91%: both flags
    both = ranking.flags(_row(fastnorm=0.12, eager=0.11))
    assert both == ["below 0.97x eager", "under 90% of copy (83.3%; eager 90.9%)"]
    # nobody reaches 90%: fastnorm at 50% and faster than every baseline is not flagged
    assert ranking.flags(_row(fastnorm=0.2, eager=0.25, compile=0.3)) == []
    # within 0.97x of compile, but at 89.7% of copy where compile is at 90.9%: flagged on copy only
    assert ranking.flags(_row(fastnorm=0.1115, compile=0.11, eager=0.5)) == ["under 90% of copy (89.7%; compile 90.9%)"]
    assert ranking.flags(_row(fastnorm=0.1115, compile=0.108, eager=0.5)) == [
        "below 0.97x compile", "under 90% of copy (89.7%; compile 92.6%)"]


def test_worst_first_puts_failed_rows_then_lowest_ratios_then_untimed():
    fast, slow, failed = _row(fastnorm=0.1, eager=0.2), _row(fastnorm=0.2, eager=0.1), _row()
    failed.status = "failed"
    skipped = RowResult(CASE, "skipped", note="needs 90 GiB")
    middle = _row(fastnorm=0.1, eager=0.1)
    assert ranking.worst_first([fast, skipped, slow, middle, failed]) == [failed, slow, middle, fast, skipped]


def test_ranking_printout_lists_worst_first_with_flags_and_a_summary():
    rows = [_row(fastnorm=0.1, eager=0.2), _row(fastnorm=0.2, eager=0.1)]
    rows[1].case = BenchCase("sweep", "layer_norm", "fp16", (3, 5), (1,), affine=True, offset=1)
    lines = ranking.format_ranking(rows).splitlines()
    assert lines[0].split()[:3] == ["case", "vs", "best"]
    assert lines[2].startswith("LN fp16 3x5 last off1") and "0.50x" in lines[2] and "below 0.97x eager" in lines[2]
    assert lines[3].startswith("RMS bf16 4096x4097 last") and "2.00x" in lines[3]
    assert "under 90% of copy (50.0%; eager 100.0%)" in lines[2]
    assert lines[-1] == ("1 of 2 rows flagged: 1 below 0.97x the fastest baseline, 1 under 90% of copy where "
                         "a baseline reaches it, 0 FAILED")


def test_json_rows_carry_best_baseline_ratio_flags_and_the_mode(tmp_path):
    rows = [fake_row(CASE, {"fastnorm": 0.2, "eager": 0.3, "liger": 0.1}, copy_bw=COPY_BW, mode="bwd")]
    doc = report.document(rows, device=torch.device("cpu"), copy_bw=COPY_BW, command=["fastnorm", "bench"],
                          settings={}, mode="bwd")
    path = tmp_path / "b.json"
    report.write_json(doc, path)
    doc = json.loads(path.read_text())
    row = doc["rows"][0]
    assert doc["mode"] == "bwd" and row["bytes"] == CASE.minimal_bytes("bwd")
    assert row["best_baseline"] == "liger" and row["speedup_vs_best"] == 0.5 and row["speedup_vs_liger"] == 0.5
    assert row["flags"] == ["below 0.97x liger", "under 90% of copy (75.0%; liger 150.0%)"]
    assert row["offset"] == 0 and row["pad"] == 0
