"""`fastnorm bench --suite family` on the CPU: small problems against plain-PyTorch ModelNew files."""
import shutil
import textwrap

import torch

from fastnorm.bench import family_suite
from fastnorm.bench.cli import main
from test_solve_support import PROBLEMS_DIR

SOLUTION = textwrap.dedent('''\
    import torch
    import torch.nn as nn


    class ModelNew(nn.Module):
        def forward(self, x):
            return x / torch.norm(x, p=2, dim=1, keepdim=True) * {scale}
    ''')


def family_dirs(tmp_path, scale=1.0):
    problems, solutions = tmp_path / "problems", tmp_path / "solutions"
    problems.mkdir()
    solutions.mkdir()
    for name in ("l2_norm_13x257.py", "frobenius_norm_3x5x9x11.py"):  # the Frobenius one has no solution
        shutil.copy(PROBLEMS_DIR / name, problems / name)
    (solutions / "l2_norm_13x257.py").write_text(SOLUTION.format(scale=scale))
    return problems, solutions


def test_family_suite_checks_times_and_scores_each_solved_problem(tmp_path):
    problems, solutions = family_dirs(tmp_path)
    lines = []
    rows = family_suite.run(torch.device("cpu"), problems, solutions, reps=2, use_compile=False, copy_bw=1e10,
                            log=lines.append)
    assert [r.problem for r in rows] == ["l2_norm_13x257"]  # only problems with a solution
    row = rows[0]
    assert row.ok and row.note == "" and row.input == "float32 (13, 257)"
    assert row.bytes == 2 * 13 * 257 * 4
    assert row.eager_ms > 0 and row.fastnorm_ms > 0 and row.compile_ms is None
    assert row.pct_copy == 100.0 * row.bytes / (row.fastnorm_ms * 1e-3) / 1e10
    table = family_suite.format_rows(rows)
    assert table.splitlines()[0].split() == ["problem", "eager", "ms", "compile", "ms", "fastnorm", "ms", "vs",
                                             "eager", "vs", "compile", "%", "of", "copy"]
    doc = family_suite.to_json(torch.device("cpu"), rows, 1e10)
    assert doc["suite"] == "family" and doc["rows"][0]["speedup_vs_eager"] == row.eager_ms / row.fastnorm_ms


def test_family_suite_reports_a_wrong_solution_and_goes_on(tmp_path):
    problems, solutions = family_dirs(tmp_path, scale=1.01)
    rows = family_suite.run(torch.device("cpu"), problems, solutions, reps=2, use_compile=False, copy_bw=1e10,
                            log=lambda line: None)
    assert not rows[0].ok and "wrong output" in rows[0].note and rows[0].fastnorm_ms is None
    assert "FAILED" in family_suite.format_rows(rows, markdown=True)


def test_frobenius_moves_x_twice_and_y_once():
    x = torch.empty(3, 5)
    assert family_suite.minimal_bytes("frobenius_norm_112x64x512x512", [x]) == 3 * 15 * 4
    assert family_suite.minimal_bytes("group_norm_112x64x512x512", [x]) == 2 * 15 * 4


def test_family_suite_without_solutions_says_how(tmp_path):
    lines = []
    assert family_suite.run(torch.device("cpu"), tmp_path, tmp_path, reps=1, use_compile=False, copy_bw=1.0,
                            log=lines.append) is None
    assert "fastnorm solve" in lines[0]


def test_family_suite_needs_cuda(capsys):
    assert main(["--suite", "family", "--device", "cpu"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().out


GROUP_SOLUTION = textwrap.dedent('''\
    import torch.nn as nn

    import fastnorm


    class ModelNew(nn.Module):
        def __init__(self, num_channels, num_groups):
            super().__init__()
            self.gn = fastnorm.GroupNorm(num_groups, num_channels)

        def forward(self, x):
            return self.gn(x) * {scale}
    ''')


def train_dirs(tmp_path, scale="1.0"):
    problems, solutions = tmp_path / "problems", tmp_path / "solutions"
    problems.mkdir()
    solutions.mkdir()
    for name in ("group_norm_3x12x9x11.py", "l2_norm_13x257.py"):
        shutil.copy(PROBLEMS_DIR / name, problems / name)
    (solutions / "group_norm_3x12x9x11.py").write_text(GROUP_SOLUTION.format(scale=scale))
    (solutions / "l2_norm_13x257.py").write_text(SOLUTION.format(scale=1.0))
    return problems, solutions


def test_train_mode_times_forward_and_backward_of_the_norms_with_a_fused_backward(tmp_path):
    problems, solutions = train_dirs(tmp_path)
    timed = []

    def timer(fn, device, trials):
        out = fn()
        timed.append(out)
        return type("T", (), {"median_ms": 1.0})()

    rows = family_suite.run(torch.device("cpu"), problems, solutions, reps=2, use_compile=False, copy_bw=1e10,
                            log=lambda line: None, timer=timer, mode="train",
                            dtypes=[torch.float32, torch.bfloat16])
    # the p-norm problem has no fused backward: not a train row; one row a dtype
    assert [r.problem for r in rows] == ["group_norm_3x12x9x11 float32", "group_norm_3x12x9x11 bfloat16"]
    assert all(r.ok for r in rows), [r.note for r in rows]
    assert rows[1].input == "bfloat16 (3, 12, 9, 11)"
    assert rows[0].bytes == (2 + 3) * 3 * 12 * 9 * 11 * 4
    # each timed call returned the gradients of x, weight and bias
    assert len(timed) == 4 and all(len(out) == 3 for out in timed) and timed[-1][0].dtype == torch.bfloat16


def test_train_mode_catches_wrong_gradients(tmp_path):
    # forward within KernelBench's 1e-2 but gradients 0.5% off: the train check compares them too
    problems, solutions = train_dirs(tmp_path, scale="(1.0 + 0.005 * (x - x.detach()))")
    rows = family_suite.run(torch.device("cpu"), problems, solutions, reps=1, use_compile=False, copy_bw=1e10,
                            log=lambda line: None, mode="train")
    assert not rows[0].ok and "gradient 0" in rows[0].note and rows[0].fastnorm_ms is None


def test_grads_match_is_relative_to_the_largest_magnitude():
    e = [torch.tensor([1000.0, 1.0])]
    assert family_suite.grads_match(e, [torch.tensor([1000.5, 1.0])]) is None
    assert "tolerance" in family_suite.grads_match(e, [torch.tensor([1002.0, 1.0])])
    assert "2 gradients" in family_suite.grads_match(e, e * 2)
