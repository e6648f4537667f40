"""The printed results table: numbers, speedups, FAILED and n/a rows, Markdown form."""
from bench_fakes import fake_row

from fastnorm.bench.cases import BenchCase
from fastnorm.bench.runner import RowResult
from fastnorm.bench.table import fmt_bytes, fmt_rate, fmt_us, format_table, headers, shown_impls

CASE = BenchCase("lastdim", "rms_norm", "bf16", (16384, 4096), (1,), affine=True)


def _cells(line):
    return line.split()


def test_ok_row_shows_times_rates_and_speedups():
    row = fake_row(CASE, {"fastnorm": 0.1, "eager": 0.3, "compile": 0.15}, copy_bw=3e12)
    lines = format_table([row]).splitlines()
    assert len(lines) == 4 and lines[0].split()[0] == "suite" and lines[3] == "liger: not timed (n/a: test)"
    cells = _cells(lines[2])
    assert cells[:5] == ["lastdim", "rms_norm", "bf16", "16384x4096", "last"]
    gbs = CASE.minimal_bytes() / 1e-4 / 1e9
    assert cells[5] == "100.0" and cells[6] == f"{gbs:.0f}" and cells[7] == f"{100 * gbs / 3000:.1f}"
    assert cells[14] == "3.00x" and cells[15] == "1.50x" and cells[16] == "1.50x"  # vs best: compile


def test_failed_row_is_marked_and_has_no_times():
    row = fake_row(CASE, {}, status="failed")
    line = format_table([row]).splitlines()[2]
    assert "FAILED" in line and "x" not in line.split("FAILED")[1].replace("e-", "")
    assert line.rstrip().endswith("5.0e-01")


def test_missing_compile_is_na_and_speedup_vs_compile_too():
    rows = [fake_row(CASE, {"fastnorm": 0.1, "eager": 0.2}), fake_row(CASE, {"fastnorm": 0.1, "eager": 0.2,
                                                                          "compile": 0.4})]
    cells = _cells(format_table(rows).splitlines()[2])
    assert cells[11:14] == ["n/a", "n/a", "n/a"] and cells[14] == "2.00x" and cells[15] == "n/a"
    assert cells[16] == "2.00x"  # vs best: eager, the only baseline timed


def test_columns_of_implementations_no_row_timed_are_left_out_with_a_line_saying_why():
    row = fake_row(CASE, {"fastnorm": 0.1, "eager": 0.2})
    row.impls["liger"].note = "skipped: liger_kernel not importable"
    lines = format_table([row]).splitlines()
    assert "compile us" not in lines[0] and "liger us" not in lines[0] and "vs liger" not in lines[0]
    assert lines[0].split() == " ".join(headers(["fastnorm", "eager"])).split()
    assert headers(["fastnorm", "eager"])[-3:] == ["vs eager", "vs best", "max err"]
    assert lines[-2:] == ["compile: not timed (n/a: test)", "liger: not timed (skipped: liger_kernel not importable)"]
    assert shown_impls([row]) == ["fastnorm", "eager"]


def test_skipped_row():
    row = RowResult(CASE, "skipped", note="needs 40 GiB")
    assert "skipped" in format_table([row]).splitlines()[2]


def test_columns_align_across_rows():
    rows = [fake_row(CASE, {"fastnorm": 0.1, "eager": 0.3, "compile": 0.15}),
            fake_row(BenchCase("seed", "layer_norm", "fp32", (16, 64, 256, 256), (1, 2, 3), True),
                     {"fastnorm": 12.5, "eager": 8.1, "compile": 0.5})]
    lines = format_table(rows).splitlines()
    ends = {len(line) for line in lines[2:4]}
    assert len(ends) == 1  # right-aligned numbers end in the same column


def test_markdown_table_has_a_cell_per_header_on_every_line():
    rows = [fake_row(CASE, {"fastnorm": 0.1, "eager": 0.3}), fake_row(CASE, {}, status="failed")]
    lines = format_table(rows, markdown=True).splitlines()[:4]  # the table; lines on untimed columns follow
    assert all(line.count("|") == len(headers(shown_impls(rows))) + 1 for line in lines)
    assert set(lines[1]) <= set("|-:")


def test_time_formatting_keeps_three_significant_digits_or_so():
    assert fmt_us(3.14159) == "3.14" and fmt_us(314.159) == "314.2" and fmt_us(31415.9) == "31416"
    assert fmt_us(None) == "n/a"


def test_rates_and_byte_counts_read_well_at_any_scale():
    assert fmt_rate(2980.4) == "2980" and fmt_rate(17.25) == "17.2" and fmt_rate(0.4567) == "0.46"
    assert fmt_bytes(570_425_344) == "570.4 MB" and fmt_bytes(16_384) == "16.4 KB"
    assert fmt_bytes(15 * 10**9) == "15.0 GB" and fmt_bytes(12) == "12 B"
