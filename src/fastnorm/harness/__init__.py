"""`fastnorm eval`: build, verify and time KernelBench-style ModelNew candidates, each in its own process.

Importing this package does not import torch; timing helpers live in fastnorm.harness.timing.
"""
from fastnorm.harness.evaluate import EvaluationError, evaluate, evaluate_batch
from fastnorm.harness.manifest import read_manifest
from fastnorm.harness.report import VERDICTS, Baseline, BatchReport, CandidateResult, EvalReport

__all__ = ["evaluate", "evaluate_batch", "read_manifest", "EvaluationError", "EvalReport", "BatchReport",
           "CandidateResult", "Baseline", "VERDICTS"]
