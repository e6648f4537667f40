"""The JSON document `fastnorm bench` writes."""
import json
import math

import torch
from bench_fakes import fake_row

from fastnorm.bench import report
from fastnorm.bench.cases import BenchCase
from fastnorm.bench.check import CheckResult
from fastnorm.bench.runner import RowResult

IMPL_KEYS = {"median_us", "min_us", "iqr_us", "gbs", "pct_copy"}


def _doc(rows):
    return report.document(rows, device=torch.device("cpu"), copy_bw=2.5e10,
                           command=["fastnorm", "bench", "--quick"], settings={"quick": True})


def test_document_schema(tmp_path):
    case = BenchCase("seed", "rms_norm", "fp32", (4, 16, 64, 64), (1,), affine=False)
    rows = [fake_row(case, {"fastnorm": 0.5, "eager": 1.0, "compile": 2.0}, copy_bw=2.5e10),
            fake_row(case, {}, status="failed"), RowResult(case, "skipped", note="too big")]
    path = tmp_path / "out" / "bench.json"
    report.write_json(_doc(rows), path)
    doc = json.loads(path.read_text())
    assert {"device", "torch", "fastnorm_commit", "command", "copy_bandwidth_gbs", "timestamp", "rows"} <= set(doc)
    assert doc["torch"] == torch.__version__ and doc["command"][:2] == ["fastnorm", "bench"]
    assert doc["copy_bandwidth_gbs"] == 25.0
    assert doc["fastnorm_commit"] is None or len(doc["fastnorm_commit"]) == 40
    ok, failed, skipped = doc["rows"]
    for row in doc["rows"]:
        assert {"suite", "label", "op", "dtype", "shape", "normalized", "bytes", "check", "impls", "speedup_vs_eager",
                "speedup_vs_compile"} <= set(row)
        assert set(row["impls"]) == {"fastnorm", "eager", "compile", "liger"}
        assert all(IMPL_KEYS <= set(v) for v in row["impls"].values())
    assert ok["label"] == "RMS fp32 4x16x64x64 dim1"
    assert ok["shape"] == [4, 16, 64, 64] and ok["normalized"] == [1] and ok["bytes"] == case.minimal_bytes()
    assert ok["check"] == {"max_abs_err": 1e-6, "ok": True, "atol": 1e-4, "rtol": 1e-4}
    assert math.isclose(ok["speedup_vs_eager"], 2.0) and math.isclose(ok["speedup_vs_compile"], 4.0)
    fast = ok["impls"]["fastnorm"]
    assert math.isclose(fast["median_us"], 500.0)
    assert math.isclose(fast["gbs"], case.minimal_bytes() / 5e-4 / 1e9)
    assert math.isclose(fast["pct_copy"], 100 * fast["gbs"] / 25.0)
    assert failed["status"] == "failed" and failed["check"]["ok"] is False
    assert failed["impls"]["fastnorm"]["median_us"] is None and failed["speedup_vs_eager"] is None
    assert skipped["status"] == "skipped" and skipped["note"] == "too big"


def test_nan_error_becomes_null_so_the_file_stays_strict_json(tmp_path):
    case = BenchCase("lastdim", "layer_norm", "bf16", (8, 64), (1,), affine=True)
    row = RowResult(case, "failed", CheckResult(math.nan, False, 1e-2, 1e-2, "RuntimeError: boom"))
    path = tmp_path / "b.json"
    report.write_json(_doc([row]), path)
    check = json.loads(path.read_text())["rows"][0]["check"]
    assert check["max_abs_err"] is None and check["error"] == "RuntimeError: boom"


def test_slug_makes_file_names_from_device_names():
    assert report.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    assert report.slug("CPU Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz").startswith("cpu-intel-xeon-platinum")
    assert report.slug("???") == "device"


def test_git_commit_is_none_outside_a_checkout(tmp_path):
    assert report.git_commit(tmp_path) is None


def test_git_commit_override_takes_short_and_full_hashes(tmp_path, monkeypatch):
    for given in ("ba90a6b", "BA90A6B", "0" * 40):
        monkeypatch.setenv("FASTNORM_COMMIT", given)
        assert report.git_commit(tmp_path) == given.lower()
    monkeypatch.setenv("FASTNORM_COMMIT", "not-a-hash")
    assert report.git_commit(tmp_path) is None
