"""fastnorm's developer tools for a GPU machine, run as `python benchmarks/devtool.py COMMAND`: timings of
fixed shapes (timing), A/B runs of planner overrides and switches (overrides), and single runs of kernel
paths for compute-sanitizer and ncu (kernel_runs). Shared set-up and timing: measure."""
from dataclasses import dataclass
from typing import Callable, Optional


@dataclass(frozen=True)
class Command:
    name: str
    purpose: str                         # one line: what it measures or runs
    example: str                         # a command line, as benchmarks/README.md lists it
    run: Callable                        # (parsed args) -> None or an exit code
    configure: Optional[Callable] = None  # (argparse parser) -> None: adds its arguments, if it takes any
