"""`fastnorm eval`: build, verify and time KernelBench-style ModelNew candidates, each in its own process.

Importing this package does not import torch; timing helpers live in fastnorm.harness.timing.
"""
from fastnorm.harness.evaluate import EvaluationError, evaluate
from fastnorm.harness.report import VERDICTS, Baseline, CandidateResult, EvalReport

__all__ = ["evaluate", "EvaluationError", "EvalReport", "CandidateResult", "Baseline", "VERDICTS"]
