"""The row runner: check before timing, FAILED rows untimed, n/a when an implementation cannot run,
rows skipped when they do not fit memory. Uses a fake timer and stand-ins for fastnorm."""
import torch
from bench_fakes import FakeTimer

from fastnorm.bench import runner as runner_mod
from fastnorm.bench.cases import BenchCase, eager_fn
from fastnorm.bench.runner import Runner, TimingPlan

CPU = torch.device("cpu")
LN = BenchCase("lastdim", "layer_norm", "fp32", (6, 130), (1,), affine=True)
RMS_BF16 = BenchCase("seed", "rms_norm", "bf16", (3, 5, 4, 7), (1,), affine=False)


def _runner(timer, *, fastnorm_factory=eager_fn, use_compile=False, **kw):
    logs = []
    run = Runner(CPU, TimingPlan(8, 2, 5.0, 1), 1e10, use_compile=use_compile, timer=timer,
                 fastnorm_factory=fastnorm_factory, log=logs.append, **kw)
    return run, logs


def test_correct_impl_is_checked_then_timed():
    timer = FakeTimer(ms=0.5)
    run, logs = _runner(timer)
    row = run.run(LN)
    assert row.status == "ok" and row.check.ok and row.check.max_abs_err == 0.0
    fast, eager = row.impls["fastnorm"], row.impls["eager"]
    assert fast.median_us == eager.median_us == 500.0
    assert fast.gbs == LN.minimal_bytes() / 5e-4 / 1e9 and fast.pct_copy == 100 * fast.gbs * 1e9 / 1e10
    assert row.speedup_vs("eager") == 1.0
    assert row.impls["compile"].median_us is None and "compile off" in row.impls["compile"].note
    assert row.speedup_vs("compile") is None
    # probe + real run per implementation; 5 ms budget / 0.5 ms = 10 trials, capped at 8
    assert timer.calls == [2, 8, 2, 8]
    assert any("check ok" in line for line in logs)


def test_wrong_output_is_failed_and_never_timed():
    timer = FakeTimer()

    def wrong(case):
        reference = eager_fn(case)
        return lambda x, w, b: reference(x, w, b) * 1.05 + 0.1
    run, logs = _runner(timer, fastnorm_factory=wrong)
    row = run.run(RMS_BF16)
    assert row.status == "failed" and not row.check.ok and row.check.max_abs_err > 0
    assert timer.calls == []
    assert all(not r.timed and "check failed" in r.note for r in row.impls.values())
    assert any("FAILED" in line for line in logs)


def test_raising_impl_is_failed_with_its_error():
    def broken(case):
        def fn(x, w, b):
            raise RuntimeError("no kernel for this shape")
        return fn
    timer = FakeTimer()
    row = _runner(timer, fastnorm_factory=broken)[0].run(LN)
    assert row.status == "failed" and "no kernel for this shape" in row.check.error and timer.calls == []


def test_row_that_does_not_fit_memory_is_skipped(monkeypatch):
    monkeypatch.setattr(runner_mod, "free_memory_bytes", lambda device: LN.working_set_bytes() // 2)
    timer = FakeTimer()
    run, logs = _runner(timer)
    row = run.run(LN)
    assert row.status == "skipped" and "GiB free" in row.note and timer.calls == []
    assert any("skipped" in line for line in logs)


def test_compile_failure_is_na_not_a_crash(monkeypatch):
    def no_compile(fn, **kwargs):
        raise RuntimeError("inductor backend unavailable")
    monkeypatch.setattr(torch, "compile", no_compile)
    timer = FakeTimer()
    row = _runner(timer, use_compile=True)[0].run(LN)
    assert row.status == "ok" and row.impls["fastnorm"].timed and row.impls["eager"].timed
    assert not row.impls["compile"].timed and "inductor backend unavailable" in row.impls["compile"].note


def test_compile_path_times_the_compiled_function(monkeypatch):
    compiled_calls = []

    def fake_compile(fn, **kwargs):
        assert kwargs.get("dynamic") is False
        return lambda *args: compiled_calls.append(1) or fn(*args)
    monkeypatch.setattr(torch, "compile", fake_compile)
    timer = FakeTimer(ms=0.25)
    row = _runner(timer, use_compile=True)[0].run(LN)
    assert row.impls["compile"].median_us == 250.0 and row.impls["compile"].compile_s is not None
    assert len(compiled_calls) > 3  # first (compiling) call + warm-ups + trials
    assert row.speedup_vs("compile") == 1.0


def test_timing_error_in_a_baseline_is_na(monkeypatch):
    timer = FakeTimer()

    def eager_that_fails_when_timed(case):
        calls = []

        def fn(x, w, b):
            calls.append(1)
            if len(calls) > 1:  # the reference call passes, the timed ones run out of memory
                raise torch.cuda.OutOfMemoryError("CUDA out of memory")
            return eager_fn(case)(x, w, b)
        return fn
    run = Runner(CPU, TimingPlan(4, 2, 5.0, 1), 1e10, use_compile=False, timer=timer,
                 eager_factory=eager_that_fails_when_timed, fastnorm_factory=eager_fn, log=lambda s: None)
    row = run.run(LN)
    assert row.impls["fastnorm"].timed and not row.impls["eager"].timed
    assert "OutOfMemoryError" in row.impls["eager"].note and row.speedup_vs("eager") is None


def test_trial_plan_fits_the_budget_within_bounds():
    plan = TimingPlan(max_trials=100, min_trials=10, budget_ms=300.0)
    assert plan.trials_for(0.01) == 100
    assert plan.trials_for(10.0) == 30
    assert plan.trials_for(1000.0) == 10


def test_timing_mode_reaches_the_timer():
    """The plan's include_host (bench --timing) is what every timing call gets; device time by default."""
    assert TimingPlan().include_host is False
    for include_host in (False, True):
        timer = FakeTimer()
        run = Runner(CPU, TimingPlan(4, 2, 5.0, 1, True, include_host), 1e10, use_compile=False, timer=timer,
                     fastnorm_factory=eager_fn, log=lambda _: None)
        assert run.run(LN).status == "ok"
        assert timer.include_host is include_host
