"""The committed sweep of issue 20 (src/fastnorm/bench/sweep_cases.json): the generator's output, the
same on every run, and it covers what the issue asks for; and the training suite of issue 19."""
import importlib.util
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from fastnorm.bench import suites
from fastnorm.bench.cases import BenchCase, make_inputs

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_sweep", ROOT / "benchmarks" / "gen_sweep.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_list_is_the_generators_output_and_deterministic():
    gen = _generator()
    text = gen.render(gen.generate())
    assert text == gen.render(gen.generate())
    assert suites.SWEEP_FILE.read_text() == text, "run: python benchmarks/gen_sweep.py"
    assert json.loads(text)["seed"] == gen.SEED


def _is_prime(n):
    return n > 1 and all(n % d for d in range(2, math.isqrt(n) + 1))


# (device type, cases at least, byte cap on x's buffer, longest row, then at least this many of:
#  primes, misaligned, padded, channel cases, each dtype, each op)
COVERAGE = [("cuda", 150, 2 * 10**9, 2**24, 20, 20, 20, 30, 40, 70),
            ("cpu", 60, 8 * 10**6, 2**20, 10, 10, 10, 12, 20, 30)]


@pytest.mark.parametrize("device_type,total,cap,max_n,primes,misaligned,padded,channel,per_dtype,per_op",
                         COVERAGE)
def test_sweep_covers_issue_20(device_type, total, cap, max_n, primes, misaligned, padded, channel, per_dtype,
                               per_op):
    cases = suites.sweep_cases(device_type)
    assert len(cases) >= total and len({c.label for c in cases}) == len(cases)
    rows = [c for c in cases if c.trailing]
    lengths = [c.shape[-1] for c in rows]
    counts = [math.prod(c.shape[:-1]) for c in rows]
    assert min(counts) == 1 and max(counts) == 10**6
    assert min(lengths) == 1 and max(lengths) == max_n
    assert sum(_is_prime(n) and n > 2 for n in lengths) >= primes
    for step, rest in ((2, 1), (4, 2), (8, 4), (16, 8)):  # not a multiple of 2 / 4 / 8 / 16
        assert sum(n % step == rest for n in lengths) >= 5, (step, rest)
    assert sum(c.offset in (1, 2, 3) for c in cases) >= misaligned
    assert all(c.offset * c.element_size % 16 for c in cases if c.offset)  # never 16-byte aligned
    assert sum(c.pad > 0 for c in cases) >= padded
    channels = [c for c in cases if c.dims == (1,) and len(c.shape) == 4]
    assert len(channels) >= channel and {c.shape[1] for c in channels} >= {3, 1024}
    assert all(3 <= c.shape[1] <= 1024 for c in channels)
    assert {c.op for c in channels} == {"layer_norm", "rms_norm"}
    assert all(n >= per_dtype for n in Counter(c.dtype for c in cases).values())
    assert set(Counter(c.dtype for c in cases)) == {"fp32", "bf16", "fp16"}
    assert all(n >= per_op for n in Counter(c.op for c in cases).values())
    assert any(c.affine for c in cases) and any(not c.affine for c in cases)
    assert all(c.storage_numel * c.element_size <= cap for c in cases)


def test_sweep_suite_is_named_only_charted_by_row_length_and_ranked():
    sweep = suites.SUITES["sweep"]
    assert not sweep.default and sweep.by_row_length and sweep.rank_worst
    assert all(c.suite != "sweep" for c in suites.select("cuda"))
    quick = suites.select("cuda", quick=True, suites=["sweep"])
    assert 10 <= len(quick) <= 20 and quick == suites.sweep_cases("cuda")[::10]
    assert suites.select("cpu", suites=["sweep"]) == suites.sweep_cases("cpu")  # the CPU list without a GPU


def test_misaligned_and_padded_inputs_have_the_layout_their_case_states():
    case = BenchCase("sweep", "layer_norm", "fp32", (5, 3, 9), (2,), affine=True, offset=2, pad=7)
    assert case.strides == (48, 16, 1) and case.storage_numel == 2 + 4 * 48 + 2 * 16 + 8 + 1
    assert case.label == "LN fp32 5x3x9 last off2 pad7"
    x, _, _ = make_inputs(case, torch.device("cpu"))
    assert x.shape == (5, 3, 9) and x.stride() == (48, 16, 1) and x.storage_offset() == 2
    assert x.data_ptr() % 16 == 8  # 2 fp32 elements past an aligned allocation
    assert not x.is_contiguous()
    with pytest.raises(ValueError):
        BenchCase("sweep", "rms_norm", "fp32", (8,), (0,), affine=True, pad=1)


def test_train_suite_holds_issue_19_shapes_and_runs_the_big_rms_seed_last():
    cases = suites.select("cuda", suites=["train"])
    assert not suites.SUITES["train"].default
    shapes = {(c.shape, c.dtype) for c in cases if c.trailing and len(c.dims) == 1}
    assert shapes == {((16384, 4096), "bf16"), ((4096, 16384), "fp32"), ((8192, 5120), "bf16"),
                      ((65536, 1024), "bf16"), ((1024, 65536), "fp32"), ((4096, 14336), "fp16")}
    assert Counter(c.op for c in cases) == {"layer_norm": 7, "rms_norm": 7}
    assert [c.label for c in cases[-2:]] == ["LN fp32 16x64x256x256 last3", "RMS fp32 112x64x512x512 dim1"]
    assert max(cases, key=lambda c: c.working_set_bytes("train")) is cases[-1]
    assert all(c.numel <= 1 << 21 for c in suites.select("cpu", suites=["train"]))
