"""Where fastnorm's builds go, read from the environment (no torch here: the harness's isolation reads it too)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

# fastnorm's own build folder; a judge points its candidates' processes at one shared folder (harness/isolation.py)
# while their TORCH_EXTENSIONS_DIR stays private to each candidate.
BUILDS_ENV = "FASTNORM_EXTENSIONS_DIR"


def env_build_root(env: Mapping[str, str]) -> Path | None:
    """FASTNORM_EXTENSIONS_DIR of `env`, else its TORCH_EXTENSIONS_DIR, else None."""
    for var in (BUILDS_ENV, "TORCH_EXTENSIONS_DIR"):
        if env.get(var):
            return Path(env[var])
    return None
