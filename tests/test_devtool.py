"""benchmarks/devtool.py, the developer tools for a GPU machine: on CPU, every command imports and answers
--help with its purpose, arguments are checked before anything runs, and `host` (which runs on CPU too)
measures."""
import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastnorm

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
COMMANDS = {"time", "breakdown", "host", "latency", "resident", "sweep", "split", "configs", "ab", "abrows",
            "abfamily", "sanitize", "repro", "profile"}


@pytest.fixture
def devtool(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("devtool")


def test_every_command_is_there_and_answers_help_with_its_purpose(devtool, capsys):
    assert set(devtool.COMMANDS) == COMMANDS
    for name, command in devtool.COMMANDS.items():
        assert command.purpose and "\n" not in command.purpose and command.example
        with pytest.raises(SystemExit) as info:
            devtool.main([name, "--help"])
        assert info.value.code == 0
        out = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
        assert f"usage: devtool.py {name}" in out and " ".join(command.purpose.split()) in out


def test_bad_arguments_are_usage_errors_before_any_gpu_work(devtool, capsys):
    for argv in (["nope"], ["repro", "3x4", "int32"], ["repro", "3x", "float32"], ["profile", "ln_seed:fp64"],
                 ["profile", "no_such_case"], ["resident", "label", "16by4"], ["time", "--", "16x4"]):
        with pytest.raises(SystemExit) as info:
            devtool.main(argv)
        assert info.value.code == 2, argv
    with pytest.raises(SystemExit, match="give the shapes after --"):
        devtool.main(["ab", "FASTNORM_X=1"])
    with pytest.raises(SystemExit, match="not a shape"):
        devtool.main(["ab", "-", "--", "16x"])
    with pytest.raises(SystemExit, match="give the rows after --"):
        devtool.main(["abrows", "FASTNORM_X=1"])
    for row in ("LN fp32 36x", "LN fp64 36x3378", "GN fp32 36x3378", "LN fp32 36x3378 skew3"):
        with pytest.raises(SystemExit, match="cannot read the row"):
            devtool.main(["abrows", "-", "--", row])
    with pytest.raises(SystemExit, match="give the problems after --"):
        devtool.main(["abfamily", "--train", "-"])
    with pytest.raises(SystemExit, match="no problems/frobenius_norm_3x5x9x11.py with a solutions/"):
        devtool.main(["abfamily", "-", "--", "frobenius_norm_3x5x9x11"])  # a test problem, no solution


def test_shared_shape_and_byte_helpers(devtool):
    import torch

    from fastnorm_dev import measure

    assert measure.parse_shape("16384x4096") == (16384, 4096) and measure.parse_shape("2x3x4x5") == (2, 3, 4, 5)
    x, w = torch.zeros(4, 8, dtype=torch.bfloat16), torch.zeros(8, dtype=torch.bfloat16)
    assert measure.norm_bytes(x, w, None) == (2 * 32 + 8) * 2
    xf = torch.randn(3, 5, 7, dtype=torch.float64)
    wf, bf = torch.rand(5, dtype=torch.float64), torch.randn(5, dtype=torch.float64)
    ref = measure.float64_norm(xf, wf, bf, 1, 2, rms=False)
    expect = torch.nn.functional.layer_norm(xf.transpose(1, 2), (5,), wf, bf, 1e-5).transpose(1, 2)
    assert torch.allclose(ref, expect, atol=1e-12)
    assert measure.relative_error(ref.float(), ref) < 1e-6


def test_the_script_runs_from_anywhere(tmp_path):
    env = dict(os.environ)
    src = str(Path(fastnorm.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "devtool.py"), "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert all(name in proc.stdout for name in COMMANDS)


def test_host_command_measures_on_cpu(devtool, capsys):
    assert devtool.main(["host"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["F.layer_norm", "fastnorm.layer_norm",
                                                  "torch.ops.fastnorm.layer_norm", "ext.norm_forward"]
    assert all(float(line.split()[1]) > 0 and line.endswith("us/call") for line in lines)


def test_gpu_check_script_parses_and_names_its_stages():
    script = BENCHMARKS / "gpu_check.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)  # syntax only: the stages need a GPU machine
    text = script.read_text()
    for stage in ("build)", "tests)", "sanitize)", "steadiness)", "scale)"):
        assert stage in text
    assert "eval_steadiness.py" in text and "eval_scale.py" in text and "devtool.py sanitize" in text


def collected(args: list) -> set:
    """The test ids `pytest <args>` would run (collection only: the CUDA tests need not run here)."""
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          capture_output=True, text=True, cwd=BENCHMARKS.parent, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_gpu_check_parts_run_every_cuda_test_once():
    """The stages that split the CUDA tests into call-sized parts select each CUDA test exactly once."""
    text = (BENCHMARKS / "gpu_check.sh").read_text()
    parts = {name: collected(shlex.split(args)) for name, args in
             re.findall(r"run (quick|harness|slow|hundred) \d+ python3 -m pytest -q -p no:cacheprovider (.*?) ;;", text)}
    assert set(parts) == {"quick", "harness", "slow", "hundred"}
    assert len(parts["hundred"]) == 1 and all(parts.values())
    everything = collected(["-m", "cuda", "tests"])
    assert sum(len(p) for p in parts.values()) == len(everything) and set().union(*parts.values()) == everything


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given without CUDA")
def test_eval_steadiness_says_it_needs_a_gpu(tmp_path):
    root = BENCHMARKS.parent
    done = subprocess.run([sys.executable, str(BENCHMARKS / "eval_steadiness.py"),
                           str(root / "problems" / "layer_norm_16x64x256x256.py"),
                           str(root / "solutions" / "layer_norm_16x64x256x256.py"), "--runs", "1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "needs a CUDA GPU" in done.stderr


def test_eval_scale_builds_ahead_with_the_build_pool(monkeypatch):
    """eval_scale's builds-ahead runs must name their build jobs: evaluate's None leaves the pool off on a GPU,
    which made session 14's builds-ahead run the sequential one again."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    scale = importlib.import_module("eval_scale")
    assert scale.CONFIGS["sequential"]["build_jobs"] == 0
    assert scale.CONFIGS["one_gpu_builds_ahead"]["build_jobs"] >= 1
    assert scale.CONFIGS["all_gpus"]["build_jobs"] >= 1
