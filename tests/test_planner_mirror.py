"""The solver's Python mirror of the CUDA planner (solve/planner_rules.py) names, beside each constant, the
header and the C++ constant it copies: the two must hold the same value, or the solver would plan kernels
the build does not launch (and prune the tune grid wrongly)."""
import re
from pathlib import Path

import pytest

from fastnorm.solve import planner_rules

KERNELS = Path(planner_rules.__file__).resolve().parents[1] / "kernels"
MIRRORED = re.compile(r"^([A-Z][A-Z0-9_]*) = .*#\s*([a-z_]+\.(?:cuh|h|cpp))\s+(k[A-Za-z0-9]+)\b", re.M)
SIMPLE = re.compile(r"^[0-9\s<>()*+]+$")  # integer literals and shifts: evaluated as Python


def mirrored_constants():
    text = Path(planner_rules.__file__).read_text()
    return MIRRORED.findall(text)


def test_mirrored_constants_are_found():
    assert len(mirrored_constants()) >= 10


@pytest.mark.parametrize("name,header,cpp", mirrored_constants())
def test_mirrored_constant_matches_its_header(name, header, cpp):
    source = (KERNELS / header).read_text()
    match = re.search(rf"\b{cpp}\s*=\s*([^;]+);", source)
    if match is None or not SIMPLE.match(match.group(1)):
        pytest.skip(f"{cpp} in {header} is not a plain integer constant")  # e.g. a function of the element size
    assert getattr(planner_rules, name) == eval(match.group(1)), f"{name} != {header} {cpp} = {match.group(1)}"
