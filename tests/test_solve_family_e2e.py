"""`fastnorm solve` end to end on the normalization family's real CPU kernels (issue 21).

NEEDS the kernels' group_norm_forward, batch_norm_forward and p_normalize in the binding (the lead's half
of issue 21, FAMILY_CONTRACT.md): without them the inline build fails and so do these tests.

One model holds every family member, so one inline build (of the kernels it calls) serves the solve and
`fastnorm eval`: about a minute on 2 cores the first time.
"""
import textwrap

from fastnorm.solve.cli import main
from test_solve_support import check_sequence, seeds_check_in_fresh_process

FAST = ["--device", "cpu", "--tune-trials", "3", "--trials", "2", "--perf-trials", "5"]

FAMILY_MIX = textwrap.dedent('''\
    """Every family member of issue 21 in a row, as a KernelBench problem (training mode as built)."""
    import torch
    import torch.nn as nn


    class Model(nn.Module):
        def __init__(self, channels: int, groups: int):
            super().__init__()
            self.bn = nn.BatchNorm2d(channels, momentum=None)
            self.gn = nn.GroupNorm(groups, channels)
            self.inorm = nn.InstanceNorm2d(channels, affine=True, track_running_stats=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.inorm(self.gn(self.bn(x)))
            x = x / torch.norm(x, p=2, dim=1, keepdim=True)
            x = x / torch.mean(torch.abs(x), dim=(2, 3), keepdim=True)
            x = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True, unbiased=False) + 1e-5)
            return x / torch.norm(x, p="fro")


    def get_inputs():
        return [torch.rand(4, 12, 9, 11)]


    def get_init_inputs():
        return [12, 4]
    ''')


def test_family_cli_end_to_end_on_cpu_kernels(tmp_path, capsys):
    """Recognize, build, verify with `fastnorm eval` (training mode), write; then the written file on the
    real kernels over train / eval calls (outputs and every running statistic), and the seeds' check in
    a fresh process without fastnorm."""
    problem = tmp_path / "family_mix.py"
    problem.write_text(FAMILY_MIX)
    out = tmp_path / "out" / "family_mix_solution.py"
    assert main([str(problem), "-o", str(out)] + FAST) == 0
    printed = capsys.readouterr().out
    for text in ("recognized 7 normalizations", "BatchNorm over dim 0 and dims 2..3", "GroupNorm over 4 groups",
                 "InstanceNorm over dims 2..3", "L2Norm over dim 1", "L1Norm over dims 2..3",
                 "LayerNorm over dim 3", "FrobeniusNorm over dims 0..3", "verified: correct", f"wrote {out}"):
        assert text in printed, text
    source = out.read_text()
    assert "functions=['norm_forward', 'group_norm_forward', 'batch_norm_forward', 'p_normalize']" in source
    check_sequence(problem, out, ["train", "train", "train", "eval", "train"], tolerance=1e-4)
    check = seeds_check_in_fresh_process(problem, out)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "fastnorm imported: False" in check.stdout
