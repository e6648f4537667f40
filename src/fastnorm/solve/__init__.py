"""`fastnorm solve`: from a KernelBench reference problem to a verified, self-contained ModelNew file.

The reference's forward is captured with torch.fx, its normalizations (LayerNorm, RMSNorm, BatchNorm,
InstanceNorm, GroupNorm, L1 / L2 / Frobenius; module, functional or hand-written) are replaced by calls
of fastnorm's kernels compiled inline, the launch configuration is chosen by timing, and the file is written once `fastnorm eval` has verified it.
"""
from fastnorm.solve.problem import UnsupportedProblem
from fastnorm.solve.solver import SolveFailed, SolveResult, plan_solution, solve

__all__ = ["solve", "plan_solution", "SolveResult", "SolveFailed", "UnsupportedProblem"]
