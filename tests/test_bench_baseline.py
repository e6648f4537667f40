"""`fastnorm bench --baseline` / `--compare`: fabricated bench JSON documents compared (regressed,
faster, within tolerance, missing and untimed rows, mode and device mismatches) and the exit statuses
through the CLI. Nothing is timed: the one run through `fastnorm bench` uses a stand-in runner."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from bench_fakes import fake_row

import fastnorm
from fastnorm.bench import baseline, cli, report
from fastnorm.bench.cases import BenchCase

H100 = "NVIDIA H100 80GB HBM3"
RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"

LN = BenchCase("train", "layer_norm", "bf16", (64, 256), (1,), True)
RMS = BenchCase("train", "rms_norm", "fp32", (32, 512), (1,), True)
LN_NO_AFFINE = BenchCase("train", "layer_norm", "bf16", (64, 256), (1,), False)  # same label as LN
PADDED = BenchCase("sweep", "rms_norm", "fp16", (8, 100), (1,), False, offset=1, pad=3)
LATENCY = BenchCase("latency", "rms_norm", "bf16", (1, 4096), (1,), True)


def row(case, fastnorm_us, status="ok", mode="train"):
    times = {"fastnorm": fastnorm_us / 1e3, "eager": 1.0} if status == "ok" else {}
    return report.row_doc(fake_row(case, times, status=status, mode=mode))


def doc(rows, mode="train", device=H100, commit="abc1234", timing="device"):
    return {"mode": mode, "device": device, "device_type": "cuda", "torch": "2.11.0+cu130",
            "fastnorm_commit": commit, "settings": {"timing": timing, "flush_l2": True}, "rows": rows}


def write(path, document):
    path.write_text(json.dumps(document))
    return path


def test_rows_sorted_into_regressed_faster_and_within_tolerance():
    old = doc([row(LN, 100.0), row(RMS, 200.0), row(LN_NO_AFFINE, 50.0), row(PADDED, 10.0)])
    new = doc([row(PADDED, 11.0), row(RMS, 150.0), row(LN_NO_AFFINE, 52.0), row(LN, 130.0)])
    result = baseline.compare(new, old, 0.05, path="old.json")
    assert [(c.label, c.baseline_us, c.new_us) for c in result.regressed] == \
        [(LN.label, 100.0, 130.0), (PADDED.label, 10.0, 11.0)]  # worst first: 1.3x, then 1.1x
    assert result.regressed[0].ratio == pytest.approx(1.3)
    assert [c.label for c in result.improved] == [RMS.label] and result.improved[0].ratio == pytest.approx(0.75)
    assert [c.label for c in result.within] == [LN_NO_AFFINE.label]  # 4% slower: within 5%
    assert result.compared == 4 and result.status == 1 and not result.warnings
    assert not (result.only_baseline or result.only_new or result.not_compared)

    text = result.format()
    assert "REGRESSED, more than 5% slower, worst first (2):" in text
    lines = text.splitlines()
    worst = next(i for i, line in enumerate(lines) if line.endswith("1.300x"))
    assert lines[worst].split() == ["train", "LN", "bf16", "64x256", "last", "100.0", "130.0", "1.300x"]
    assert lines[worst + 1].split()[:2] == ["sweep", "RMS"] and lines[worst + 1].split()[-3:] == \
        ["10.0", "11.0", "1.100x"]
    assert "faster by more than 5% (1):" in text and "0.750x" in text
    assert lines[-1] == "baseline: 2 of 4 rows REGRESSED; 1 faster, 1 within 5%"
    assert "against baseline old.json (fastnorm abc1234, NVIDIA H100 80GB HBM3" in lines[0]


def test_tolerance_is_configurable():
    old, new = doc([row(LN, 100.0), row(RMS, 100.0)]), doc([row(LN, 104.0), row(RMS, 120.0)])
    assert [c.label for c in baseline.compare(new, old, 0.03).regressed] == [RMS.label, LN.label]
    loose = baseline.compare(new, old, 0.25)
    assert not loose.regressed and loose.status == 0 and len(loose.within) == 2
    assert "no row regressed (2 compared); 0 faster, 2 within 25%" in loose.format()
    with pytest.raises(ValueError):
        baseline.compare(new, old, -0.1)


def test_missing_and_untimed_rows_are_listed_not_counted():
    old = doc([row(LN, 100.0), row(RMS, 100.0), row(LATENCY, 5.0), row(PADDED, 0, status="skipped")])
    new = doc([row(LN, 100.0), row(RMS, 0, status="failed"), row(LN_NO_AFFINE, 40.0), row(PADDED, 9.0)])
    result = baseline.compare(new, old)
    assert result.compared == 1 and result.status == 0
    assert result.only_baseline == [f"latency: {LATENCY.label}"]
    assert result.only_new == [f"train: {LN_NO_AFFINE.label}"]
    assert result.not_compared == [f"train: {RMS.label} (new: failed)", f"sweep: {PADDED.label} (baseline: skipped)"]
    text = result.format()
    assert f"only in the baseline (1): latency: {LATENCY.label}" in text
    assert f"only in the new run (1): train: {LN_NO_AFFINE.label}" in text
    assert "not compared, fastnorm not timed (2):" in text


def test_rows_match_by_what_they_measure_not_position_or_label():
    """Older documents have no label, offset or pad (and no mode: they timed the forward)."""
    legacy = {k: v for k, v in row(LN, 100.0, mode="fwd").items() if k not in ("label", "offset", "pad")}
    old = {"device": H100, "rows": [legacy]}
    new = doc([row(LN_NO_AFFINE, 100.0, mode="fwd"), row(LN, 200.0, mode="fwd")], mode="fwd")
    result = baseline.compare(new, old)
    assert [(c.label, c.ratio) for c in result.regressed] == [(LN.label, 2.0)]
    assert result.only_new == [f"train: {LN_NO_AFFINE.label}"]


def test_mode_mismatch_is_refused_device_and_timing_mismatches_warn():
    rows = [row(LN, 100.0)]
    with pytest.raises(baseline.BaselineError, match="--mode train, the new run --mode bwd"):
        baseline.compare(doc(rows, mode="bwd"), doc(rows, mode="train"))
    result = baseline.compare(doc(rows, device="NVIDIA H200", timing="host"), doc(rows))
    assert result.status == 0 and len(result.warnings) == 2
    assert "the baseline ran on NVIDIA H100 80GB HBM3, the new run on NVIDIA H200" in result.warnings[0]
    assert "timing device, the new run with host" in result.warnings[1]
    assert "warning: the baseline ran on NVIDIA H100" in result.format()


def test_load_rejects_what_is_not_a_bench_json(tmp_path):
    cases = {"broken.json": "{not json", "empty.json": json.dumps(doc([])),
             "model.json": json.dumps({"suite": "model", "rows": [{"mode": "forward", "ms": 1.0}]}),
             "odd.json": json.dumps({"rows": [{"ms": 1.0}]}),
             "twice.json": json.dumps(doc([row(LN, 1.0), row(LN, 2.0)])),
             "nested.json": json.dumps(doc([dict(row(LN, 1.0), shape=[[64], [256]])]))}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(baseline.BaselineError, match=name):
            baseline.load(tmp_path / name)
    with pytest.raises(baseline.BaselineError, match="cannot read"):
        baseline.load(tmp_path / "absent.json")


def test_compare_exit_statuses(tmp_path, capsys):
    old = write(tmp_path / "old.json", doc([row(LN, 100.0), row(RMS, 100.0)]))
    slower = write(tmp_path / "slower.json", doc([row(LN, 100.0), row(RMS, 110.0)]))
    same = write(tmp_path / "same.json", doc([row(LN, 102.0), row(RMS, 97.0)], device="NVIDIA H200"))
    failed = write(tmp_path / "failed.json", doc([row(LN, 0, status="failed"), row(RMS, 90.0)]))
    fwd = write(tmp_path / "fwd.json", doc([row(LN, 100.0, mode="fwd")], mode="fwd"))

    assert cli.main(["--compare", str(slower), "--baseline", str(old)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSED, more than 5% slower, worst first (1):" in out and "1.100x" in out
    assert cli.main(["--compare", str(slower), "--baseline", str(old), "--baseline-tolerance", "10%"]) == 0
    assert "no row regressed (2 compared)" in capsys.readouterr().out
    assert cli.main(["--compare", str(same), "--baseline", str(old)]) == 0  # another GPU: a warning only
    assert "warning: the baseline ran on NVIDIA H100 80GB HBM3" in capsys.readouterr().out
    assert cli.main(["--compare", str(failed), "--baseline", str(old)]) == 1  # a failed check still fails
    assert f"FAILED checks in {failed}: train: {LN.label}" in capsys.readouterr().out
    assert cli.main(["--compare", str(fwd), "--baseline", str(old)]) == 2
    assert "the baseline timed --mode train, the new run --mode fwd" in capsys.readouterr().out
    assert cli.main(["--compare", str(tmp_path / "absent.json"), "--baseline", str(old)]) == 2
    for bad in (["--compare", str(old)], ["--chart-from", str(old), "--baseline", str(old)],
                ["--compare", str(old), "--baseline", str(old), "--chart-from", str(old)],
                ["--compare", str(old), "--baseline", str(old), "--baseline-tolerance", "-1"]):
        with pytest.raises(SystemExit) as info:
            cli.main(bad)
        assert info.value.code == 2


def test_committed_results_compare_with_themselves_and_refuse_other_modes(capsys):
    train, fwd = RESULTS / "h100-train.json", RESULTS / "h100.json"  # h100.json predates labels and modes
    assert cli.main(["--compare", str(train), "--baseline", str(train)]) == 0
    assert "no row regressed (14 compared); 0 faster, 14 within 5%" in capsys.readouterr().out
    assert cli.main(["--compare", str(fwd), "--baseline", str(fwd)]) == 0
    assert cli.main(["--compare", str(fwd), "--baseline", str(train)]) == 2


def test_python_dash_m_entry_point(tmp_path):
    old = write(tmp_path / "old.json", doc([row(LN, 100.0)]))
    new = write(tmp_path / "new.json", doc([row(LN, 150.0)]))
    src = str(Path(fastnorm.__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [src, os.environ.get("PYTHONPATH")] if p))
    proc = subprocess.run([sys.executable, "-m", "fastnorm", "bench", "--compare", str(new), "--baseline", str(old)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "1.500x" in proc.stdout


class _FakeRunner:
    """Stands in for bench.runner.Runner: each row "takes" times[label] us (None: FAILED), nothing runs."""
    times = {}

    def __init__(self, device, plan, copy_bw, *, mode="fwd", **_):
        self.mode = mode

    def run(self, case):
        us = self.times.get(case.label)
        return fake_row(case, {"fastnorm": us / 1e3, "eager": 1.0} if us else {},
                        status="ok" if us else "failed", mode=self.mode)


@pytest.fixture
def fake_bench(monkeypatch):
    """`fastnorm bench` on the CPU with rows that time as told, no timing, copy or charts."""
    import fastnorm.harness.timing as timing

    monkeypatch.setattr(cli, "Runner", _FakeRunner)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda *a, **k: 1e10)
    monkeypatch.setattr(cli, "write_charts", lambda doc, path: [])
    monkeypatch.setattr(_FakeRunner, "times", {})
    return _FakeRunner.times


RUN = ["--device", "cpu", "--suite", "latency"]  # four rows, none timed: the runner is a stand-in


def _cpu_latency_doc(us=10.0, mode="fwd"):
    """A baseline of the rows RUN runs, each at `us`, as this machine's CPU wrote it; and those cases."""
    cases = cli.suites.select("cpu", suites=["latency"])
    rows = [report.row_doc(fake_row(c, {"fastnorm": us / 1e3, "eager": 1.0}, mode=mode)) for c in cases]
    return doc(rows, mode=mode, device=report.device_name(torch.device("cpu"))), cases


def test_run_with_baseline_stores_the_comparison_and_exits_1_on_a_regression(tmp_path, capsys, fake_bench):
    old, cases = _cpu_latency_doc()
    old_path = write(tmp_path / "old.json", old)
    fake_bench.update({c.label: 10.0 for c in cases})
    fake_bench[cases[0].label] = 20.0
    out_path = tmp_path / "new.json"
    assert cli.main(RUN + ["--json", str(out_path), "--baseline", str(old_path)]) == 1
    out = capsys.readouterr().out
    assert "REGRESSED, more than 5% slower" in out and "2.000x" in out and "warning" not in out
    assert f"baseline: 1 of {len(cases)} rows REGRESSED; 0 faster, {len(cases) - 1} within 5%" in out
    stored = json.loads(out_path.read_text())["baseline"]
    assert stored["path"] == str(old_path) and stored["fastnorm_commit"] == "abc1234"
    assert stored["tolerance"] == 0.05 and stored["compared"] == len(cases)
    assert [(r["label"], r["ratio"]) for r in stored["regressions"]] == [(cases[0].label, 2.0)]

    fake_bench[cases[0].label] = 10.0
    assert cli.main(RUN + ["--json", str(out_path), "--baseline", str(old_path)]) == 0
    assert json.loads(out_path.read_text())["baseline"]["regressions"] == []


def test_run_with_baseline_a_failed_check_still_exits_1(tmp_path, capsys, fake_bench):
    old, cases = _cpu_latency_doc()
    old_path = write(tmp_path / "old.json", old)
    fake_bench.update({c.label: 5.0 for c in cases})  # every timed row faster...
    fake_bench[cases[0].label] = None                 # ...but one FAILED its check
    assert cli.main(RUN + ["--json", str(tmp_path / "new.json"), "--baseline", str(old_path)]) == 1
    out = capsys.readouterr().out
    assert f"no row regressed ({len(cases) - 1} compared); {len(cases) - 1} faster" in out
    assert f"FAILED checks: {cases[0].label}" in out


def test_run_with_a_baseline_of_another_mode_stops_before_running(tmp_path, capsys, fake_bench, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where a run would write its JSON
    old, _ = _cpu_latency_doc(mode="train")
    old_path = write(tmp_path / "old.json", old)
    monkeypatch.setattr(cli, "Runner", None)  # constructing a runner would raise
    assert cli.main(RUN + ["--baseline", str(old_path)]) == 2
    assert "the baseline timed --mode train, the new run --mode fwd" in capsys.readouterr().out
    assert cli.main(["--device", "cpu", "--suite", "model", "--baseline", str(old_path)]) == 2
    assert "--suite model does not" in capsys.readouterr().out
    assert not (tmp_path / "benchmarks").exists()


def test_run_on_another_device_warns_before_and_after(tmp_path, capsys, fake_bench):
    old, cases = _cpu_latency_doc()
    old["device"] = H100
    old_path = write(tmp_path / "old.json", old)
    fake_bench.update({c.label: 10.0 for c in cases})
    assert cli.main(RUN + ["--json", str(tmp_path / "new.json"), "--baseline", str(old_path)]) == 0
    out = capsys.readouterr().out
    assert out.count(f"warning: the baseline ran on {H100}") == 2
    assert out.index("warning") < out.index("[1/")


# --suite family documents: rows of problems/ files, fastnorm's ModelNew in milliseconds, matched by problem.
def family_row(problem, fastnorm_ms, ok=True):
    return {"problem": problem, "input": "float32 (8, 8)", "bytes": 512, "ok": ok, "eager_ms": 1.0,
            "compile_ms": 1.0, "fastnorm_ms": fastnorm_ms if ok else None, "pct_copy": 50.0,
            "note": "" if ok else "wrong output"}


def family_doc(rows, mode="fwd", device=H100):
    return {"suite": "family", "device": device, "torch": "2.11.0+cu130", "fastnorm_commit": "abc1234",
            "copy_bandwidth_gbs": 3000.0, "timing": "device", "mode": mode, "rows": rows}


def test_family_rows_compare_by_problem(tmp_path):
    old = family_doc([family_row("group_norm_a", 6.65), family_row("batch_norm_b", 4.25), family_row("l2_c", 6.0),
                      family_row("gone_d", 1.0)])
    new = family_doc([family_row("batch_norm_b", 4.60), family_row("group_norm_a", 6.05),
                      family_row("l2_c", 6.1), family_row("new_e", 2.0), family_row("gone_d", 0, ok=False)])
    result = baseline.compare(new, old, 0.05, path="old.json")
    assert [(c.suite, c.label, c.baseline_us, c.new_us) for c in result.regressed] == \
        [("family", "batch_norm_b", pytest.approx(4250.0), pytest.approx(4600.0))]
    assert [c.label for c in result.improved] == ["group_norm_a"] and [c.label for c in result.within] == ["l2_c"]
    assert result.only_new == ["family: new_e"] and result.status == 1
    assert result.not_compared == ["family: gone_d (new: wrong output)"]
    assert "family batch_norm_b 4250 4600 1.082x" in " ".join(result.format().split())
    # a family run against norm rows, or the other way round, measures different things
    with pytest.raises(baseline.BaselineError, match="family rows, the new run norm rows"):
        baseline.compare(doc([row(LN, 1.0)]), old)
    with pytest.raises(baseline.BaselineError, match="--mode fwd, the new run --mode train"):
        baseline.compare(family_doc([family_row("group_norm_a", 1.0)], mode="train"), old)


def test_family_documents_load_and_the_committed_one_compares_with_itself(tmp_path):
    for name, bad in (("mixed.json", family_doc([family_row("a", 1.0), row(LN, 1.0)])),
                      ("twice.json", family_doc([family_row("a", 1.0), family_row("a", 2.0)]))):
        with pytest.raises(baseline.BaselineError, match=name):
            baseline.load(write(tmp_path / name, bad))
    committed = baseline.load(RESULTS / "h100-family.json")
    result = baseline.compare(committed, committed)
    assert result.status == 0 and result.compared == len(committed["rows"]) and not result.improved


def test_family_compare_files_exit_statuses(tmp_path, capsys):
    old = write(tmp_path / "old.json", family_doc([family_row("a", 1.0), family_row("b", 2.0)]))
    slower = write(tmp_path / "slower.json", family_doc([family_row("a", 1.2), family_row("b", 2.0)]))
    failed = write(tmp_path / "failed.json", family_doc([family_row("a", 0, ok=False), family_row("b", 1.0)]))
    same = write(tmp_path / "same.json", family_doc([family_row("a", 1.01), family_row("b", 1.99)]))
    assert cli.main(["--compare", str(slower), "--baseline", str(old)]) == 1
    assert "1 of 2 rows REGRESSED" in capsys.readouterr().out
    assert cli.main(["--compare", str(failed), "--baseline", str(old)]) == 1
    assert "FAILED checks in" in capsys.readouterr().out
    assert cli.main(["--compare", str(same), "--baseline", str(old)]) == 0


def test_family_suite_takes_a_family_baseline_only(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    family = write(tmp_path / "family.json", family_doc([family_row("a", 1.0)]))
    norm = write(tmp_path / "norm.json", doc([row(LN, 1.0)], mode="fwd"))
    assert cli.main(["--device", "cpu", "--suite", "family", "--baseline", str(norm)]) == 2
    assert "the baseline has norm rows, the new run family rows" in capsys.readouterr().out
    assert cli.main(["--device", "cpu", "--suite", "family,model", "--baseline", str(family)]) == 2
    assert "--suite family, model does not" in capsys.readouterr().out
    # accepted, then the family suite itself needs a GPU
    assert cli.main(["--device", "cpu", "--suite", "family", "--baseline", str(family)]) == 2
    assert "it needs a CUDA device" in capsys.readouterr().out
