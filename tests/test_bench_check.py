"""The correctness gate that decides whether a bench row is timed or reported FAILED."""
import math

import torch

from fastnorm.bench import check


def test_equal_outputs_pass_with_zero_error():
    ref = torch.randn(37, 101) + 1000
    result = check.compare(ref.clone(), ref)
    assert result.ok and result.max_abs_err == 0.0


def test_fp32_tolerance_is_relative_and_absolute():
    ref = torch.randn(1000)
    ok = check.compare(ref + 5e-5, ref)
    bad = check.compare(ref + 5e-3, ref)
    assert ok.ok and math.isclose(ok.max_abs_err, 5e-5, rel_tol=0.05)
    assert not bad.ok and bad.max_abs_err > 4e-3


def test_bf16_allows_one_rounding_step_but_not_a_wrong_value():
    ref = (torch.randn(4096) * 4).to(torch.bfloat16)
    stepped = (ref.view(torch.int16) + 1).view(torch.bfloat16)  # every element one bf16 ulp away
    assert not torch.equal(stepped, ref)
    assert check.compare(stepped, ref).ok
    wrong = ref.clone()
    wrong[17] = wrong[17] * 1.2 + 0.5
    assert not check.compare(wrong, ref).ok


def test_nan_or_inf_fails_and_reports_nan_error():
    ref = torch.randn(64)
    for value in (math.nan, math.inf):
        out = ref.clone()
        out[3] = value
        result = check.compare(out, ref)
        assert not result.ok and math.isnan(result.max_abs_err)


def test_shape_or_dtype_mismatch_fails():
    ref = torch.randn(4, 8)
    assert not check.compare(torch.randn(8, 4), ref).ok
    assert not check.compare(ref.double(), ref).ok


def test_chunks_cover_every_element(monkeypatch):
    monkeypatch.setattr(check, "_CHUNK", 7)
    ref = torch.randn(3, 11, 5)
    out = ref.clone()
    out[2, 10, 4] += 1.0  # the very last element, in a partial last chunk
    result = check.compare(out, ref)
    assert not result.ok and math.isclose(result.max_abs_err, 1.0, rel_tol=1e-5)
