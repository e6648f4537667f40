"""The optional Liger column: skipped with the reason where liger_kernel does not import or does not
take the case, timed (and compared with) where it does. A fake liger_kernel module stands in here."""
import types

import pytest
import torch
import torch.nn.functional as F
from bench_fakes import FakeTimer
from conftest import rms_norm_definition

from fastnorm.bench import cases
from fastnorm.bench.cases import BenchCase, Unavailable, eager_fn, liger_fn, make_inputs
from fastnorm.bench.runner import Runner, TimingPlan

CPU = torch.device("cpu")
LN = BenchCase("lastdim", "layer_norm", "fp32", (6, 130), (1,), affine=True)
LN_SEED = BenchCase("seed", "layer_norm", "fp32", (2, 3, 4, 5), (1, 2, 3), affine=True)
RMS_CHANNEL = BenchCase("seed", "rms_norm", "fp32", (2, 5, 4, 7), (1,), affine=False)


def _fake_liger(calls):
    """liger_kernel.transformers.functional's two norms, as PyTorch's, recording their arguments."""
    def liger_layer_norm(x, w, b, eps):
        calls.append(("ln", x.shape, w.shape, b.shape))
        return F.layer_norm(x, x.shape[-1:], w, b, eps)

    def liger_rms_norm(x, w, eps, offset, casting_mode, in_place):
        calls.append(("rms", x.shape, None if w is None else w.shape, in_place))
        return rms_norm_definition(x, x.shape[-1:], w, eps)
    return types.SimpleNamespace(liger_layer_norm=liger_layer_norm, liger_rms_norm=liger_rms_norm)


@pytest.fixture
def no_liger(monkeypatch):
    monkeypatch.setattr(cases, "_liger_functional", lambda: "liger_kernel not importable (test)")


@pytest.fixture
def fake_liger(monkeypatch):
    calls = []
    monkeypatch.setattr(cases, "_liger_functional", lambda: _fake_liger(calls))
    return calls


def _run(case, **kw):
    logs = []
    run = Runner(CPU, TimingPlan(4, 2, 5.0, 1), 1e10, use_compile=False, timer=FakeTimer(),
                 fastnorm_factory=eager_fn, log=logs.append, **kw)
    return run, logs


def test_without_liger_the_column_is_skipped_with_the_reason_logged_once(no_liger):
    run, logs = _run(LN)
    rows = [run.run(LN), run.run(LN)]
    for row in rows:
        assert row.status == "ok" and not row.impls["liger"].timed
        assert row.impls["liger"].note == "skipped: liger_kernel not importable (test)"
    assert sum("liger: skipped" in line for line in logs) == 1


def test_liger_takes_trailing_dims_only_and_layer_norm_with_a_weight(fake_liger):
    with pytest.raises(Unavailable, match="last dim only"):
        liger_fn(RMS_CHANNEL)
    with pytest.raises(Unavailable, match="needs a weight"):
        liger_fn(BenchCase("lastdim", "layer_norm", "fp32", (4, 8), (1,), affine=False))
    x, w, b = make_inputs(LN, CPU)
    with pytest.raises(Unavailable, match="CUDA only"):  # Triton kernels: the fn refuses CPU tensors
        liger_fn(LN)(x, w, b)


def test_liger_gets_rows_of_the_last_dim_and_a_fresh_dx(fake_liger, monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))  # let the fake run on CPU
    x, w, b = make_inputs(LN_SEED, CPU)
    y = liger_fn(LN_SEED)(x, w, b)
    assert fake_liger[-1] == ("ln", (2, 60), (60,), (60,)) and y.shape == x.shape
    assert torch.allclose(y, eager_fn(LN_SEED)(x, w, b), atol=1e-5)
    rms = BenchCase("lastdim", "rms_norm", "bf16", (3, 16), (1,), affine=False)
    x, w, _ = make_inputs(rms, CPU)
    liger_fn(rms)(x, w, None)
    assert fake_liger[-1] == ("rms", (3, 16), None, False)  # in_place=False: dy is reused by every trial


@pytest.mark.parametrize("mode", ["fwd", "bwd", "train"])
def test_liger_is_timed_and_can_be_the_fastest_baseline(fake_liger, monkeypatch, mode):
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    run, _ = _run(LN, mode=mode)
    row = run.run(LN)
    assert row.impls["liger"].timed and row.impls["liger"].median_us == row.impls["eager"].median_us
    row.impls["liger"].median_us /= 2
    assert row.best_baseline() == "liger" and row.speedup_vs_best() == pytest.approx(0.5)


def test_liger_failing_on_a_case_is_na_not_a_crash(monkeypatch):
    def broken(case):
        def fn(x, w, b):
            raise RuntimeError("triton: out of resources")
        return fn
    run, _ = _run(LN, liger_factory=broken)
    row = run.run(LN)
    assert row.status == "ok" and row.impls["fastnorm"].timed
    assert not row.impls["liger"].timed and "out of resources" in row.impls["liger"].note
