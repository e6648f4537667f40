"""Bench rows: the bytes each must move (the floor % of copy is measured against) and the suites."""
import pytest
import torch

from fastnorm.bench import suites
from fastnorm.bench.cases import BenchCase, eager_fn, make_inputs


def test_seed_layer_norm_bytes_count_x_y_weight_and_bias():
    case = BenchCase("seed", "layer_norm", "fp32", (16, 64, 256, 256), (1, 2, 3), affine=True)
    x = 16 * 64 * 256 * 256 * 4
    params = 2 * 64 * 256 * 256 * 4
    assert case.minimal_bytes() == 2 * x + params == 570_425_344


def test_seed_rms_norm_bytes_have_no_weight_and_scale_with_dtype():
    fp32 = BenchCase("seed", "rms_norm", "fp32", (112, 64, 512, 512), (1,), affine=False)
    bf16 = BenchCase("seed", "rms_norm", "bf16", (112, 64, 512, 512), (1,), affine=False)
    assert fp32.minimal_bytes() == 2 * 112 * 64 * 512 * 512 * 4
    assert bf16.minimal_bytes() * 2 == fp32.minimal_bytes()
    # The anchor's speed of light: 15 GB over 2.98 TB/s is ~5040 us.
    assert fp32.minimal_bytes() / 2.98e12 * 1e6 == pytest.approx(5044, rel=1e-3)


def test_lastdim_rms_reads_weight_only_layer_norm_weight_and_bias():
    rms = BenchCase("lastdim", "rms_norm", "bf16", (16384, 4096), (1,), affine=True)
    ln = BenchCase("lastdim", "layer_norm", "bf16", (16384, 4096), (1,), affine=True)
    assert rms.minimal_bytes() == (2 * 16384 * 4096 + 4096) * 2
    assert ln.minimal_bytes() == (2 * 16384 * 4096 + 2 * 4096) * 2


def test_working_set_of_the_big_rms_seed_fits_an_80gb_gpu_only():
    case = BenchCase("seed", "rms_norm", "fp32", (112, 64, 512, 512), (1,), affine=False)
    gib = case.working_set_bytes() / 2**30
    assert 30 < gib < 70


def test_labels_name_op_dtype_shape_and_dims():
    assert BenchCase("seed", "rms_norm", "bf16", (4, 16, 8, 8), (1,), False).label == "RMS bf16 4x16x8x8 dim1"
    assert BenchCase("seed", "layer_norm", "fp32", (2, 3, 4, 5), (1, 2, 3), True).dims_str == "last3"
    assert BenchCase("x", "layer_norm", "fp32", (2, 3, 4, 5), (1, 2), True).dims_str == "dims1-2"


def test_bad_cases_are_rejected():
    with pytest.raises(ValueError):
        BenchCase("seed", "layer_norm", "fp32", (2, 3, 4), (0, 2), True)  # not consecutive
    with pytest.raises(ValueError):
        BenchCase("seed", "group_norm", "fp32", (2, 3), (1,), True)
    with pytest.raises(ValueError):
        BenchCase("seed", "rms_norm", "fp32", (2, 3), (2,), True)


def test_gpu_suite_holds_seeds_lastdim_and_latency_rows():
    cases = suites.select("cuda")
    labels = {c.label for c in cases}
    assert len(labels) == len(cases) == 4 + 2 * 2 * 6 + 2 * 2
    for label in ("LN fp32 16x64x256x256 last3", "RMS bf16 112x64x512x512 dim1", "RMS fp32 16x4194304 last",
                  "LN bf16 1x4096 last"):
        assert label in labels
    assert all(c.dtype == "bf16" for c in cases if c.suite == "latency")


@pytest.mark.parametrize("device_type", ["cuda", "cpu"])
def test_quick_subset_rows_all_exist_and_are_few(device_type):
    full = suites.select(device_type)
    quick = suites.select(device_type, quick=True)
    keep = suites._GPU_QUICK if device_type == "cuda" else suites._CPU_QUICK
    assert {c.label for c in quick} == keep  # a typo in the quick list would drop a row silently
    assert 3 <= len(quick) < len(full) / 3
    assert any(c.suite == "seed" and c.dtype == "fp32" for c in quick)


def test_filters_narrow_by_suite_dtype_and_op():
    cases = suites.select("cpu", suites=["lastdim"], dtypes=["bf16"], ops=["rms_norm"])
    assert cases and all(c.suite == "lastdim" and c.dtype == "bf16" and c.op == "rms_norm" for c in cases)
    assert suites.select("cpu", suites=["latency"], dtypes=["fp32"]) == []


def test_a_registered_suite_is_selectable_and_runs_by_default_only_when_it_says_so(monkeypatch):
    extra = suites.Suite(lambda device_type: [BenchCase("extra", "rms_norm", "fp32", (2, 8), (1,), True)],
                         default=False)
    monkeypatch.setitem(suites.SUITES, "extra", extra)
    assert [c.suite for c in suites.select("cpu", suites=["extra"])] == ["extra"]
    assert all(c.suite != "extra" for c in suites.select("cpu"))
    assert {c.suite for c in suites.select("cpu", suites=["extra", "seed"])} == {"extra", "seed"}


def test_cpu_suite_is_small():
    assert all(c.numel <= 1 << 21 for c in suites.select("cpu"))


def test_eager_rms_reference_matches_formula_in_fp32_and_upcasts_bf16():
    case = BenchCase("seed", "rms_norm", "bf16", (3, 5, 7, 9), (1,), affine=False)
    x, w, b = make_inputs(case, torch.device("cpu"), seed=3)
    y = eager_fn(case)(x, w, b)
    xf = x.float()
    expect = (xf / torch.sqrt(torch.mean(xf ** 2, dim=1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16
    assert torch.equal(y, expect)


def test_inputs_are_seeded_and_affine_params_have_the_normalized_shape():
    case = BenchCase("lastdim", "layer_norm", "bf16", (5, 33), (1,), affine=True)
    x1, w1, b1 = make_inputs(case, torch.device("cpu"), seed=1)
    x2, _, _ = make_inputs(case, torch.device("cpu"), seed=1)
    x3, _, _ = make_inputs(case, torch.device("cpu"), seed=2)
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)
    assert w1.shape == b1.shape == (33,) and w1.dtype == torch.bfloat16
    rms = BenchCase("lastdim", "rms_norm", "fp32", (5, 33), (1,), affine=True)
    _, w, b = make_inputs(rms, torch.device("cpu"))
    assert w.shape == (33,) and b is None
