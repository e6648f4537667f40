"""bench --mode fwd|bwd|train: the bytes each mode counts, what a trial times, the gradient check that
decides FAILED before timing, and torch.compile's backward under retain_graph. Stand-ins for fastnorm
(PyTorch's own functions, made wrong on purpose where a test needs it) and a fake timer."""
import math

import pytest
import torch
import torch.nn.functional as F
from bench_fakes import FakeTimer

from fastnorm.bench import check, modes
from fastnorm.bench.cases import BenchCase, eager_fn, make_grad_output, make_inputs
from fastnorm.bench.runner import Runner, TimingPlan

CPU = torch.device("cpu")
LN = BenchCase("lastdim", "layer_norm", "fp32", (6, 130), (1,), affine=True)
RMS = BenchCase("lastdim", "rms_norm", "bf16", (5, 64), (1,), affine=True)
RMS_CHANNEL = BenchCase("seed", "rms_norm", "fp32", (3, 5, 4, 7), (1,), affine=False)


def _runner(mode, timer=None, **kw):
    kw.setdefault("fastnorm_factory", eager_fn)
    logs = []
    run = Runner(CPU, TimingPlan(4, 2, 5.0, 1), 1e10, use_compile=kw.pop("use_compile", False),
                 timer=timer or FakeTimer(), log=logs.append, mode=mode, **kw)
    return run, logs


def test_bwd_bytes_read_x_and_dy_write_dx_and_count_the_parameters():
    m, n = 16384, 4096
    ln = BenchCase("train", "layer_norm", "bf16", (m, n), (1,), affine=True)
    rms = BenchCase("train", "rms_norm", "bf16", (m, n), (1,), affine=True)
    bare = BenchCase("train", "rms_norm", "fp32", (m, n), (1,), affine=False)
    # LayerNorm: x, dy read, dx written; weight read, dweight and dbias written (bias is not read).
    assert ln.minimal_bytes("bwd") == (3 * m * n + 3 * n) * 2
    assert rms.minimal_bytes("bwd") == (3 * m * n + 2 * n) * 2  # weight read, dweight written
    assert bare.minimal_bytes("bwd") == 3 * m * n * 4
    for case in (ln, rms, bare):
        assert case.minimal_bytes("train") == case.minimal_bytes("fwd") + case.minimal_bytes("bwd")
        assert case.minimal_bytes() == case.minimal_bytes("fwd")
    assert ln.minimal_bytes("fwd") == (2 * m * n + 2 * n) * 2
    with pytest.raises(ValueError, match="unknown mode"):
        ln.minimal_bytes("backward")


def test_backward_working_set_is_larger_and_counts_padded_storage():
    case = BenchCase("seed", "rms_norm", "fp32", (112, 64, 512, 512), (1,), affine=False)
    assert case.working_set_bytes("bwd") > case.working_set_bytes("fwd")
    assert case.working_set_bytes("bwd") < 72 * 2**30  # 90% of an 80 GB GPU: the train suite's last row runs
    padded = BenchCase("sweep", "layer_norm", "fp32", (10, 100), (1,), True, pad=28)
    assert padded.working_set_bytes() - BenchCase("sweep", "layer_norm", "fp32", (10, 100), (1,), True) \
        .working_set_bytes() == (9 * 28) * 4


def _counting(fn):
    calls = []

    def counted(x, w, b):
        calls.append(1)
        return fn(x, w, b)
    return counted, calls


def test_fwd_times_the_forward_on_inputs_without_grad():
    x, w, b = make_inputs(LN, CPU)
    assert not x.requires_grad
    fn, calls = _counting(eager_fn(LN))
    call = modes.timed_call("fwd", fn, x, w, b)
    assert calls == []
    assert torch.equal(call(), F.layer_norm(x, (130,), w, b, 1e-5)) and len(calls) == 1


def test_bwd_runs_the_forward_once_and_times_only_the_backward():
    x, w, b = make_inputs(LN, CPU, requires_grad=True)
    dy = make_grad_output(LN, CPU)
    fn, calls = _counting(eager_fn(LN))
    call = modes.timed_call("bwd", fn, x, w, b, dy)
    assert len(calls) == 1  # the forward ran, outside the timed call
    first, second = call(), call()  # retain_graph: the same graph runs every trial
    assert len(calls) == 1 and len(first) == 3
    expect = torch.autograd.grad(F.layer_norm(x, (130,), w, b, 1e-5), [x, w, b], dy)
    for got, again, want in zip(first, second, expect):
        assert torch.equal(got, want) and torch.equal(again, want)


def test_train_runs_forward_and_backward_every_trial():
    x, w, b = make_inputs(RMS, CPU, requires_grad=True)
    assert b is None and x.requires_grad and w.requires_grad
    dy = make_grad_output(RMS, CPU)
    fn, calls = _counting(eager_fn(RMS))
    call = modes.timed_call("train", fn, x, w, b, dy)
    assert calls == []
    grads = call()
    call()
    assert len(calls) == 2 and [g.shape for g in grads] == [x.shape, w.shape]


def test_unknown_mode_is_refused_before_any_row():
    with pytest.raises(ValueError, match="unknown mode"):
        _runner("inference")


@pytest.mark.parametrize("mode", ["bwd", "train"])
@pytest.mark.parametrize("case", [LN, RMS, RMS_CHANNEL], ids=lambda c: c.label)
def test_correct_gradients_are_checked_then_timed_with_mode_bytes(mode, case):
    timer = FakeTimer(ms=0.5)
    run, logs = _runner(mode, timer)
    row = run.run(case)
    assert row.status == "ok" and row.check.ok and row.mode == mode, row.check
    fast = row.impls["fastnorm"]
    assert fast.timed and fast.gbs == pytest.approx(case.minimal_bytes(mode) / 5e-4 / 1e9)
    assert row.impls["eager"].timed and timer.calls == [2, 4, 2, 4]


class _ScaledGrad(torch.autograd.Function):
    """Identity forward; backward scales the incoming gradient (a wrong backward kernel)."""

    @staticmethod
    def forward(ctx, t, scale):
        ctx.scale = scale
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


def _wrong_backward(where, scale=1.05):
    """fastnorm stand-in with a correct forward whose gradient of `where` (x or weight) is off."""
    def factory(case):
        reference = eager_fn(case)

        def fn(x, w, b):
            if where == "x":
                x = _ScaledGrad.apply(x, scale)
            else:
                w = _ScaledGrad.apply(w, scale)
            return reference(x, w, b)
        return fn
    return factory


@pytest.mark.parametrize("mode", ["bwd", "train"])
@pytest.mark.parametrize("where,name", [("x", "dx"), ("w", "dweight")])
def test_wrong_gradient_is_failed_names_it_and_is_never_timed(mode, where, name):
    timer = FakeTimer()
    run, logs = _runner(mode, timer, fastnorm_factory=_wrong_backward(where))
    row = run.run(LN)
    assert row.status == "failed" and not row.check.ok and timer.calls == []
    assert f"{name} out of tolerance" in row.check.error
    assert all("check failed" in r.note for r in row.impls.values())
    assert any("FAILED" in line for line in logs)


def test_forward_mode_ignores_the_backward():
    row = _runner("fwd", fastnorm_factory=_wrong_backward("x"))[0].run(LN)
    assert row.status == "ok"


def test_train_mode_checks_the_forward_output_too():
    def wrong_forward(case):
        reference = eager_fn(case)
        return lambda x, w, b: reference(x, w, b) * 1.05
    row = _runner("train", fastnorm_factory=wrong_forward)[0].run(LN)
    assert row.status == "failed" and "y out of tolerance" in row.check.error
    row = _runner("bwd", fastnorm_factory=wrong_forward)[0].run(LN)
    assert row.status == "failed" and "y out" not in row.check.error and "dx out of tolerance" in row.check.error


def test_a_backward_that_raises_is_failed_and_the_next_row_still_runs():
    """As the CPU fastnorm backward may fail to build: the row is FAILED with the error, the run goes on."""
    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.view_as(t)

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("undefined symbol: fastnorm_cpu_backward")

    def factory(case):
        reference = eager_fn(case)
        return lambda x, w, b: reference(NoBackward.apply(x), w, b)
    timer = FakeTimer()
    run, _ = _runner("bwd", timer, fastnorm_factory=factory)
    row = run.run(LN)
    assert row.status == "failed" and "fastnorm_cpu_backward" in row.check.error and timer.calls == []
    run.fastnorm_factory = eager_fn
    assert run.run(RMS).status == "ok"


def test_strided_and_misaligned_inputs_are_leaves_that_take_gradients():
    case = BenchCase("sweep", "rms_norm", "bf16", (7, 33), (1,), affine=True, offset=3, pad=5)
    x, w, _ = make_inputs(case, CPU, requires_grad=True)
    assert x.is_leaf and x.requires_grad and x.stride() == (38, 1) and x.storage_offset() == 3
    row = _runner("train")[0].run(case)
    assert row.status == "ok" and row.check.ok


def test_gradient_reference_in_slices_sums_dweight_over_all_of_them(monkeypatch):
    monkeypatch.setattr(check, "_CHUNK", 64)  # 6 rows of 130: one row a slice
    x, w, b = make_inputs(LN, CPU, requires_grad=True)
    dy = make_grad_output(LN, CPU)
    grads = torch.autograd.grad(F.layer_norm(x, (130,), w, b, 1e-5), [x, w, b], dy)
    results = check.check_gradients(grads, eager_fn(LN), x, w, b, dy, begin_dim=1)
    assert set(results) == {"dx", "dweight", "dbias"} and all(r.ok for r in results.values())
    # atol of the sums: the dtype's times sqrt(rows summed)
    assert results["dweight"].atol == pytest.approx(1e-4 * math.sqrt(6)) and results["dx"].atol == 1e-4
    last_row = grads[0].clone()
    last_row[-1, -1] += 0.01
    bad = check.check_gradients((last_row, grads[1], grads[2]), eager_fn(LN), x, w, b, dy, begin_dim=1)
    assert not bad["dx"].ok and bad["dweight"].ok
    partial = grads[1] - torch.autograd.grad(F.layer_norm(x[-1:], (130,), w, b, 1e-5), [w], dy[-1:])[0]
    bad = check.check_gradients((grads[0], partial, grads[2]), eager_fn(LN), x, w, b, dy, begin_dim=1)
    assert bad["dx"].ok and not bad["dweight"].ok and bad["dbias"].ok  # a dropped slice is caught


def test_float64_reference_tolerance_is_the_outputs_dtype():
    ref = torch.randn(300, dtype=torch.float64)
    out = (ref + 5e-3).to(torch.bfloat16)
    result = check.compare(out, ref, torch.bfloat16)
    assert result.ok and result.atol == 1e-2
    assert not check.compare(out, ref, torch.float32).ok  # bf16 output where fp32 was expected
    assert not check.compare((ref + 0.5).to(torch.bfloat16), ref, torch.bfloat16).ok
    combined = check.combine({"dx": result, "dweight": check.compare(out, ref + 1, torch.bfloat16)})
    assert not combined.ok and combined.error == "dweight out of tolerance" and combined.max_abs_err > 0.9


def test_compile_in_bwd_mode_turns_buffer_donation_off(monkeypatch):
    """torch.compile's backward refuses retain_graph=True when it donated the saved buffers."""
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "donated_buffer"):
        pytest.skip("this torch never donates buffers")
    seen = []

    def fake_compile(fn, **kwargs):
        def compiled(*args):
            seen.append(functorch_config.donated_buffer)
            return fn(*args)
        return compiled
    monkeypatch.setattr(torch, "compile", fake_compile)
    for mode, donated in (("bwd", False), ("train", functorch_config.donated_buffer)):
        seen.clear()
        row = _runner(mode, use_compile=True)[0].run(LN)
        assert row.impls["compile"].timed and row.impls["compile"].compile_s is not None
        assert seen and set(seen) == {donated}


def test_each_implementations_graph_is_freed_before_the_next_one_runs():
    """bwd keeps a forward graph alive while timing: it must be gone when the next implementation starts
    (the 7.5 GB RMSNorm seed fits only so)."""
    import weakref

    outputs = []

    def keeping(case):
        reference = eager_fn(case)

        def fn(x, w, b):
            y = reference(x, w, b)
            outputs.append(weakref.ref(y))
            return y
        return fn
    seen_alive = []

    def eager_watching(case):
        reference = eager_fn(case)

        def fn(x, w, b):
            seen_alive.append(sum(ref() is not None for ref in outputs))
            return reference(x, w, b)
        return fn
    run, _ = _runner("bwd", fastnorm_factory=keeping, eager_factory=eager_watching)
    row = run.run(LN)
    assert row.status == "ok" and row.impls["eager"].timed
    # the check's reference call, then eager's own forward: fastnorm's outputs are all dead by then
    assert seen_alive[-1] == 0 and len(outputs) >= 2
