"""`fastnorm bench` end to end on this machine's CPU (real fastnorm kernels, real timing), with and
without matplotlib, plus its argument handling; and a short GPU run where a GPU exists."""
import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from png_header import SIGNATURE, png_size

import fastnorm
from fastnorm.bench import chart, cli, report, runner, suites
from fastnorm.bench.cases import eager_fn

SRC = Path(fastnorm.__file__).resolve().parents[1]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC)] + [p for p in [env.get("PYTHONPATH")] if p])
    return env


def test_cpu_quick_suite_end_to_end(tmp_path):
    json_path, png_path = tmp_path / "r" / "cpu.json", tmp_path / "c" / "cpu.png"
    proc = subprocess.run([sys.executable, "-m", "fastnorm", "bench", "--device", "cpu", "--quick",
                           "--json", str(json_path), "--chart", str(png_path)],
                          capture_output=True, text=True, timeout=1200, env=_env())
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    expected = suites.select("cpu", quick=True)
    assert f"[1/{len(expected)}]" in out and f"[{len(expected)}/{len(expected)}]" in out
    assert "copy bandwidth:" in out and "fastnorm us" in out and "vs eager" in out

    doc = json.loads(json_path.read_text())
    assert doc["device_type"] == "cpu" and doc["copy_bandwidth_gbs"] > 0
    assert doc["command"] == ["fastnorm", "bench", "--device", "cpu", "--quick", "--json", str(json_path),
                              "--chart", str(png_path)]
    assert [(r["op"], r["dtype"], r["shape"]) for r in doc["rows"]] == \
        [(c.op, c.dtype, list(c.shape)) for c in expected]
    for row in doc["rows"]:
        assert row["status"] == "ok" and row["check"]["ok"] is True, row
        for name in ("fastnorm", "eager"):
            impl = row["impls"][name]
            assert impl["median_us"] > 0 and impl["min_us"] <= impl["median_us"] and impl["pct_copy"] > 0
        assert row["impls"]["compile"]["median_us"] is None  # compile is off by default on CPU
        assert row["speedup_vs_eager"] > 0 and row["speedup_vs_compile"] is None
    if not chart.available():
        assert out.count(chart.MISSING) == 1 and not png_path.exists()
        return
    # compile is off on CPU: two implementations a case; the last-dim rows get a row-length chart too
    assert png_size(png_path.read_bytes()) == chart.bar_chart_size(len(expected), 2)
    rows_png = png_path.with_name("cpu-rows.png")
    assert png_size(rows_png.read_bytes()) == (chart.WIDTH_PX, chart.ROWS_CHART_HEIGHT_PX)
    assert f"wrote {json_path}, {png_path}, {rows_png} in" in out


def test_default_output_paths_and_filters(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["--device", "cpu", "--quick", "--suite", "latency", "--op", "rms", "--dtype", "bf16",
                     "--markdown", "--timing", "host"])
    out = capsys.readouterr().out
    assert rc == 0
    name = report.slug(report.device_name(torch.device("cpu")))
    json_path = tmp_path / "benchmarks" / "results" / f"bench-{name}.json"
    doc = json.loads(json_path.read_text())
    assert [r["shape"] for r in doc["rows"]] == [[32, 4096]]
    assert doc["settings"]["timing"] == "host"
    if chart.available():
        assert json_path.with_suffix(".png").read_bytes()[:8] == SIGNATURE
    assert not json_path.with_name(json_path.stem + "-rows.png").exists()  # latency rows: no length chart
    assert "| latency | rms_norm" in out


def test_without_matplotlib_json_and_table_are_written_and_one_line_says_why_no_chart(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    json_path = tmp_path / "r.json"
    rc = cli.main(["--device", "cpu", "--quick", "--suite", "latency", "--op", "rms", "--json", str(json_path)])
    out = capsys.readouterr().out
    assert rc == 0 and json.loads(json_path.read_text())["rows"]
    assert "fastnorm us" in out and out.count(chart.MISSING) == 1
    assert 'charts need matplotlib: pip install "fastnorm[plot]"' in out.splitlines()
    assert not list(tmp_path.glob("*.png"))
    assert cli.main(["--chart-from", str(json_path)]) == 1
    assert capsys.readouterr().out.strip() == chart.MISSING and not list(tmp_path.glob("*.png"))


@pytest.fixture
def eager_as_fastnorm(monkeypatch):
    """The CLI with PyTorch's eager functions standing in for fastnorm's kernels (no build needed)."""
    monkeypatch.setattr(cli, "Runner", functools.partial(runner.Runner, fastnorm_factory=eager_fn))


@pytest.mark.parametrize("mode", ["bwd", "train"])
def test_backward_modes_end_to_end(tmp_path, monkeypatch, capsys, eager_as_fastnorm, mode):
    monkeypatch.chdir(tmp_path)
    rc = cli.main(["--device", "cpu", "--quick", "--suite", "latency,train", "--op", "rms", "--mode", mode,
                   "--trials", "2", "--budget-ms", "5"])
    out = capsys.readouterr().out
    assert rc == 0, out
    name = report.slug(report.device_name(torch.device("cpu")))
    doc = json.loads((tmp_path / "benchmarks" / "results" / f"bench-{name}-{mode}.json").read_text())
    expected = suites.select("cpu", quick=True, suites=["latency", "train"], ops=["rms_norm"])
    assert doc["mode"] == mode and len(doc["rows"]) == len(expected) >= 2
    for row, case in zip(doc["rows"], expected):
        assert row["label"] == case.label and row["bytes"] == case.minimal_bytes(mode)
        assert row["check"]["ok"] and row["impls"]["fastnorm"]["median_us"] > 0
    assert f"rows, {chart.modes.TITLES[mode]}, compile off" in out
    assert "worst first" not in out  # only the sweep ranks its rows


def test_sweep_prints_its_rows_worst_first(tmp_path, capsys, eager_as_fastnorm):
    json_path = tmp_path / "s.json"
    rc = cli.main(["--device", "cpu", "--quick", "--suite", "sweep", "--trials", "2", "--budget-ms", "5",
                   "--json", str(json_path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    ranking = out.split("worst first (sweep): fastnorm against the fastest baseline of each row\n")[1]
    lines = ranking.splitlines()
    count = len(suites.select("cpu", quick=True, suites=["sweep"]))
    ratios = [float(re.split(r"\s{2,}", line)[1].rstrip("x")) for line in lines[2:2 + count]]
    assert ratios == sorted(ratios) and lines[2 + count].endswith("0 FAILED")
    doc = json.loads(json_path.read_text())
    assert doc["mode"] == "fwd" and all("flags" in row and "speedup_vs_best" in row for row in doc["rows"])


def test_bad_arguments_exit_with_usage_errors(capsys):
    for bad in (["--suite", "nope"], ["--timing", "wall"], ["--mode", "backward"]):
        with pytest.raises(SystemExit) as info:
            cli.main(bad)
        assert info.value.code == 2
    assert cli.main(["--device", "cpu", "--suite", "latency", "--dtype", "fp32"]) == 2  # no rows match
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            cli.main(["--device", "cuda"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_latency_rows_end_to_end(tmp_path):
    json_path = tmp_path / "gpu.json"
    rc = cli.main(["--quick", "--suite", "latency", "--no-compile", "--json", str(json_path)])
    doc = json.loads(json_path.read_text())
    assert rc == 0 and doc["device_type"] == "cuda" and doc["copy_bandwidth_gbs"] > 100
    assert all(r["check"]["ok"] and r["impls"]["fastnorm"]["median_us"] > 0 for r in doc["rows"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("mode", ["bwd", "train"])
def test_gpu_backward_modes_end_to_end(tmp_path, mode):
    """fastnorm's CUDA backward checked against float64 and timed next to eager, torch.compile (its
    backward under retain_graph in bwd mode) and Liger where it imports."""
    json_path = tmp_path / f"gpu-{mode}.json"
    rc = cli.main(["--quick", "--suite", "latency", "--mode", mode, "--trials", "5", "--json", str(json_path)])
    doc = json.loads(json_path.read_text())
    assert rc == 0 and doc["mode"] == mode
    for row in doc["rows"]:
        assert row["check"]["ok"], row
        for name in ("fastnorm", "eager", "compile"):
            assert row["impls"][name]["median_us"] > 0, (name, row["impls"][name])
        liger = row["impls"]["liger"]
        assert liger["median_us"] is not None or liger["note"].startswith("skipped: liger_kernel not importable")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_sweep_quick_checks_every_layout(tmp_path, capsys):
    json_path = tmp_path / "sweep.json"
    rc = cli.main(["--quick", "--suite", "sweep", "--no-compile", "--trials", "5", "--json", str(json_path)])
    doc = json.loads(json_path.read_text())
    assert "worst first (sweep)" in capsys.readouterr().out
    assert rc == 0 and all(row["check"]["ok"] for row in doc["rows"] if row["status"] != "skipped")
