"""`fastnorm solve` from the command line: unsupported references, and the whole path on real kernels.

The end-to-end tests build the CPU kernels inline once (only those the solution calls: about 20 s on 2
cores; later runs reuse the build cached under TORCH_EXTENSIONS_DIR, and so does `fastnorm eval`), so
there are only two end-to-end runs; recognition is covered by test_solve_recognize.py.
"""
import pytest
import torch

from fastnorm.solve import SolveFailed, solve
from fastnorm.solve.cli import main
from fastnorm.solve.solver import Verification
from test_solve_support import PROBLEMS_DIR, seeds_check_in_fresh_process

FAST = ["--device", "cpu", "--tune-trials", "3", "--trials", "2", "--perf-trials", "5"]


@pytest.mark.parametrize("name,says", [
    ("unsupported_softmax.py", "found: Linear (self.fc), softmax"),
    ("unsupported_local_response_norm.py", "LocalResponseNorm (self.lrn)"),
    ("unsupported_control_flow.py", "torch.fx"),
])
def test_unsupported_reference_exits_2_and_writes_nothing(name, says, tmp_path, capsys):
    out = tmp_path / "solution.py"
    assert main([str(PROBLEMS_DIR / name), "-o", str(out)] + FAST) == 2
    err = capsys.readouterr().err
    assert says in err and "nothing written" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_missing_reference_and_bad_target(tmp_path, capsys):
    out = tmp_path / "solution.py"
    assert main([str(tmp_path / "missing.py"), "-o", str(out)] + FAST) == 2
    assert "no such file" in capsys.readouterr().err
    assert main([str(PROBLEMS_DIR / "rms_norm_channels.py"), "-o", str(out), "--target-speedup", "0"]) == 2
    assert not out.exists()


def test_cli_end_to_end_on_cpu_kernels(tmp_path, capsys):
    """Recognize, build, tune, verify with `fastnorm eval`, write; then the seeds' check in a fresh process."""
    problem = PROBLEMS_DIR / "rms_norm_channels.py"
    out = tmp_path / "out" / "rms_norm_channels_solution.py"
    assert main([str(problem), "-o", str(out)] + FAST) == 0
    printed = capsys.readouterr().out
    for text in ("recognized 1 normalization", "RMSNorm over dim 1 of float32 (3, 13, 9, 17)",
                 "hand-written x / sqrt(mean(x**2) + eps)", "threads=auto blocks_per_row=auto",
                 "verified: correct", f"wrote {out}"):
        assert text in printed, text
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # no temporary left beside it
    source = out.read_text()
    assert "_ext = load_inline(" in source and "return fused_rms_norm_over_dims(x, dim=1, eps=self.eps)" in source
    check = seeds_check_in_fresh_process(problem, out)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "fastnorm imported: False" in check.stdout


def test_solve_keeps_other_layers_and_writes_only_verified_files(tmp_path):
    """A LayerNorm between Linear layers (fx-generated forward) on the real kernels. The verifier is the
    seeds' check in a fresh process here (fastnorm eval is exercised above); a rejecting verifier
    leaves nothing behind."""
    problem = PROBLEMS_DIR / "linear_norm_linear.py"
    checks = []

    def seeds_verifier(reference, candidate, **_):
        done = seeds_check_in_fresh_process(reference, candidate)
        checks.append(done)
        return Verification(done.returncode == 0, done.stdout + done.stderr, speedup=1.0)

    out = tmp_path / "solution.py"
    lines = []
    result = solve(problem, out, device="cpu", tune_trials=3, log=lines.append, verify=seeds_verifier)
    assert out.exists() and result.verification.correct and len(checks) == 1
    assert "fastnorm imported: False" in checks[0].stdout
    assert [m.written_as for m in result.plan.matches] == ["nn.LayerNorm (self.norm)"]
    assert "self.fc1(x)" in out.read_text()

    rejected = tmp_path / "rejected.py"
    with pytest.raises(SolveFailed, match="rejected"):
        solve(problem, rejected, device="cpu", tune_trials=3, log=lines.append,
              verify=lambda *a, **k: Verification(False, "wrong_output: made up"))
    assert not rejected.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message for a machine without a GPU")
def test_cuda_requested_without_a_gpu(tmp_path, capsys):
    out = tmp_path / "solution.py"
    assert main([str(PROBLEMS_DIR / "rms_norm_channels.py"), "-o", str(out), "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not out.exists()


def test_final_check_timed_runs_fit_a_budget_on_cpu():
    from fastnorm.solve.solver import CPU_TIMING_BUDGET_MS, default_perf_trials

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert default_perf_trials(cuda, 8.0, 0.3) == 100
    assert default_perf_trials(cpu, 200.0, 100.0) == 20            # 3 s of 200 ms calls: 15, at least 20
    assert default_perf_trials(cpu, 1.0, 0.5) == 100               # short calls: capped at 100
    assert default_perf_trials(cpu, 60.0, 50.0) == int(CPU_TIMING_BUDGET_MS / 60.0)
    assert default_perf_trials(cpu, None, None) == 100             # nothing timed: the old default


def test_a_lone_launch_configuration_is_timed_briefly(tmp_path, monkeypatch):
    """On the CPU there is one launch configuration: nothing to choose, so the tuning times SINGLE_CONFIG_RUNS
    runs of each model (for the final check's budget), not tune_trials."""
    from fastnorm.solve import solver

    runs = []
    real_tune = solver.tune

    def counting_tune(*args, **kwargs):
        runs.append(kwargs["trials"])
        return real_tune(*args, **kwargs)

    monkeypatch.setattr(solver, "tune", counting_tune)
    lines = []
    result = solve(PROBLEMS_DIR / "linear_norm_linear.py", tmp_path / "solution.py", device="cpu", tune_trials=20,
                   log=lines.append, verify=lambda *a, **k: Verification(True, "ok", speedup=1.0))
    assert runs == [solver.SINGLE_CONFIG_RUNS] and result.reference_ms > 0
    assert any("1 launch configuration" in line and "nothing to choose" in line for line in lines), lines
