"""`fastnorm eval --timing device|host` (issue 29): the option's way from the CLI / API to every timing loop, the
order of what the CUDA timing loop queues ahead of each announced call (on fake CUDA primitives: this runs on a
CPU-only machine), and the judge's clock check in both modes. No child processes: cheap."""
import contextlib
import itertools
from pathlib import Path

import pytest
import torch

from fastnorm.harness import cli, evaluate, judge, timing
from fastnorm.harness.batch import Measured
from fastnorm.harness.candidate_process import CandidateSide
from fastnorm.harness import candidate_process
from fastnorm.harness.evaluate import DEFAULT_TIMING, TIMING_MODES, evaluate_batch
from fastnorm.harness.isolation import ChildOutcome
from fastnorm.harness.loading import load_module
from fastnorm.harness.outcomes import result_from
from fastnorm.harness.pool import LocalPool
from fastnorm.harness.report import Baseline, EvalReport
from fastnorm.harness.timing_verdict import judge_timing

CANDIDATES = Path(__file__).resolve().parent / "candidates"
SMALL = CANDIDATES / "ref_layer_norm_small.py"
GOOD = str(CANDIDATES / "good_layer_norm.py")


# ---------------------------------------------------------------------------------------------------------
# The option's way in: CLI -> evaluate -> the workers' config; the solver

def test_timing_modes_agree_between_the_torch_free_parent_and_timing():
    assert TIMING_MODES == timing.TIMING_MODES == ("device", "host")
    assert DEFAULT_TIMING == timing.DEFAULT_TIMING == "device"  # issue 29: steadier medians
    assert timing.include_host_for("host") is True and timing.include_host_for("device") is False
    with pytest.raises(ValueError, match="timing must be one of device, host"):
        timing.include_host_for("wall")


@pytest.mark.parametrize("argv,expected", [([], "device"), (["--timing", "host"], "host"),
                                           (["--timing", "device"], "device")])
def test_cli_timing_flag_reaches_evaluate(monkeypatch, capsys, argv, expected):
    seen = {}

    class Report:
        all_ok = True

        def format_table(self):
            return "table"

    def fake_evaluate(reference, candidates, **options):
        seen.update(options)
        return Report()

    monkeypatch.setattr(cli, "evaluate", fake_evaluate)
    assert cli.main([str(SMALL), GOOD, "-q", *argv]) == 0
    assert seen["timing"] == expected


def test_cli_rejects_an_unknown_timing_mode(capsys):
    with pytest.raises(SystemExit):
        cli.main([str(SMALL), GOOD, "--timing", "wall"])
    assert "invalid choice: 'wall'" in capsys.readouterr().err


def test_evaluate_rejects_an_unknown_timing_mode():
    with pytest.raises(ValueError, match="timing must be one of"):
        evaluate(SMALL, [GOOD], device="cpu", timing="wall")


@pytest.mark.parametrize("mode", ["device", "host"])
def test_timing_mode_reaches_every_workers_config_and_the_report(monkeypatch, mode):
    """evaluate_batch puts the mode in each problem's config, which the local pool merges into the baseline's
    and the judge's worker configs and Ray ships with each task; the report's settings name it."""
    configs = []

    def fake_run(self, jobs, handle):
        for job in jobs:
            configs.append(dict(job.problem.config))
        ref_timing = {"median_ms": 1.0, "min_ms": 0.9, "iqr_ms": 0.1, "mode": "cpu"}
        baseline = Baseline(device="cpu", device_name="cpu", torch_version="x", ref_timing=ref_timing,
                            copy_bw=1e9, min_bytes=1, timing_mode="cpu")
        handle(Measured(jobs[0].problem, "cpu", baseline))

    monkeypatch.setattr(LocalPool, "run", fake_run)
    batch = evaluate_batch([(SMALL, [GOOD])], device="cpu", timing=mode)
    assert [c["timing"] for c in configs] == [mode]
    report = batch.reports[0]
    assert report.settings["timing"] == mode
    assert report.to_json()["settings"]["timing"] == mode
    assert report.to_json()["baseline"]["timing_mode"] == "cpu"
    assert "timing: wall clock" in report.format_table()


def test_solver_passes_the_mode_to_its_final_check(tmp_path):
    from fastnorm.solve import SolveFailed, solve
    from fastnorm.solve.solver import Verification

    problem = Path(__file__).resolve().parent / "solve_problems" / "rms_norm_channels.py"
    with pytest.raises(ValueError, match="timing must be one of"):
        solve(problem, tmp_path / "a.py", device="cpu", timing="wall")
    seen = []

    def verifier(reference, candidate, **kwargs):
        seen.append(kwargs["timing"])
        return Verification(False, "not verified here")

    with pytest.raises(SolveFailed):
        solve(problem, tmp_path / "b.py", device="cpu", tune_trials=1, log=lambda _: None, verify=verifier,
              timing="host")
    assert seen == ["host"]


# ---------------------------------------------------------------------------------------------------------
# The CUDA timing loop, on fake primitives: what is queued ahead of each announced call

class FakeCuda:
    """Stands in for the C-level CUDA calls timing.py bound at import; records their order."""

    def __init__(self, monkeypatch, log: list, sleep: bool = True):
        ids = itertools.count()

        class Event:
            def __init__(self, enable_timing=False):
                self.id = next(ids)

        monkeypatch.setattr(timing, "_cuda_synchronize", lambda: log.append("sync"))
        monkeypatch.setattr(timing, "flush_cache", lambda device: log.append("flush"))
        monkeypatch.setattr(timing, "_gpu_sleep", (lambda cycles: log.append("spin")) if sleep else None)
        cover = (lambda: log.append("cover")) if sleep == "full" else None
        monkeypatch.setattr(timing, "_full_cover", lambda device: cover)
        monkeypatch.setattr(timing.timing_cover, "available", lambda: cover is not None)
        monkeypatch.setattr(timing, "_Event", Event)
        monkeypatch.setattr(timing, "_event_record", lambda event, stream: log.append("record"))
        monkeypatch.setattr(timing, "_event_synchronize", lambda event: log.append("wait"))
        monkeypatch.setattr(timing, "_event_elapsed_ms", lambda start, end: 0.25)
        monkeypatch.setattr(timing, "_current_stream", lambda: None)
        monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())


class Announcing(timing.TrialHooks):
    def __init__(self, log):
        self.log = log

    def before_call(self, trial):
        self.log.append("s")

    def after_call(self, trial):
        self.log.append("e")


CUDA = torch.device("cuda")
TRIAL_TAIL = ["s", "record", "call", "record", "wait", "e", "sync"]  # announce, events around the call, tail


@pytest.mark.parametrize("include_host,sleep,head", [
    (False, "full", ["sync", "cover"]),         # device: idle, then flush + spin on every SM in one kernel
    (False, True, ["sync", "flush", "spin"]),   # no CUDA compiler: flush, torch.cuda._sleep's ~1 ms spin
    (False, False, ["sync", "flush"]),          # neither: the flush alone covers
    (True, True, ["flush", "sync"]),            # host: the device idle when the call is announced
])
def test_cuda_loop_queues_the_cover_ahead_of_each_announced_call(monkeypatch, include_host, sleep, head):
    log = []
    FakeCuda(monkeypatch, log, sleep)
    stats = timing.time_callable(lambda: log.append("call"), device=CUDA, trials=2, warmup=1,
                                 include_host=include_host, hooks=Announcing(log))
    assert stats.median_ms == 0.25 and len(stats.tails_ms) == 2
    assert log == ["call", "sync"] + (head + TRIAL_TAIL) * 2
    assert timing.effective_timing(CUDA, include_host) == (
        "host" if include_host else {"full": "device", True: "device, sleep cover", False: "device, flush cover only"}[sleep])


def test_effective_timing_on_cpu_and_without_a_flush():
    assert timing.effective_timing(torch.device("cpu"), False) == "cpu"
    assert timing.effective_timing("cpu", True) == "cpu"
    assert timing.effective_timing(CUDA, False, flush_l2=False) == "host"


class FakeChannel:
    def __init__(self, log):
        self.log, self.sent = log, []

    def send(self, kind, **fields):
        if kind in ("s", "e"):
            self.log.append(kind)
        self.sent.append((kind, fields))


class FakeSide:
    """What CandidateSide.calibrate / .time use of their object, on the fake CUDA device."""

    def __init__(self, log):
        self.log, self.device, self.channel, self.cfg = log, CUDA, FakeChannel(log), {"candidate": "c.py"}

    def expect(self, kind):
        return {"kind": kind, "check": False}

    def overwrite_outputs(self, output, args):
        self.log.append("scrub")  # the candidate's process overwrites each returned output (queued work)

    def values(self, form, group):
        return []

    def call(self, args):
        self.log.append("call")

    def check_tampering(self, after):
        pass


@pytest.mark.parametrize("include_host", [False, True])
def test_null_candidate_is_timed_behind_the_same_cover_as_the_candidate(monkeypatch, include_host):
    """The judge subtracts the null candidate's excess (its clock minus the reported time) from the
    candidate's: with device timing both must run behind the same flush and spin, which the judge's clock sees
    and the events do not. The loops must queue the same things ahead of each announcement."""
    log = []
    FakeCuda(monkeypatch, log)
    monkeypatch.setattr(candidate_process, "_spin", lambda seconds: log.append("call"))
    side = FakeSide(log)
    CandidateSide.calibrate(side, {"trials": 3, "wait_ms": 1.0, "include_host": include_host})
    null_loop, log[:] = [x for x in log if x != "scrub"], []  # (a null call returns nothing to overwrite)
    CandidateSide.time(side, {"trials": 3, "warmup": 1, "args": [], "include_host": include_host})
    timed_loop = [x for x in log if x != "scrub"]  # the scrub runs after a trial's tail, before the next sync
    assert [kind for kind, _ in side.channel.sent if kind not in ("s", "e")] == ["timed", "timed"]

    null_head = ["sync"] if include_host else ["sync", "flush", "spin"]  # host: idle at "s" either way
    timed_head = ["flush", "sync"] if include_host else ["sync", "flush", "spin"]
    assert null_loop == ["call", "sync"] + (null_head + TRIAL_TAIL) * 3
    assert timed_loop == ["call", "sync"] + (timed_head + TRIAL_TAIL) * 3


class FakeCandidateLink:
    """A stand-in for the judge's link to the candidate's process: every exchange succeeds, and the trials the
    judge observes are (judge's clock, reported) times from `calibrate(trials)` and `timed(trials)`."""

    def __init__(self, calibrate, timed):
        self.calibrate, self.timed, self.observed = calibrate, timed, []

    def expect(self, kind):
        return {"kind": kind}

    def send(self, kind, **fields):
        pass

    def share(self, group, values):
        return None

    def check_outputs(self, reply, exp, atol, rtol, what):
        return 0.0, 0.0

    def observe_trials(self, command, trials, fields, picked=frozenset(), check=None):
        self.observed.append((command, fields))
        seen, reported = (self.calibrate if command == "calibrate" else self.timed)(trials)
        return seen, reported, []


@pytest.mark.parametrize("mode,include_host", [("device", False), ("host", True), (None, False)])
def test_judge_asks_for_the_configured_mode_in_calibration_and_timing(mode, include_host):
    """The judge (on CPU, with a stand-in for the candidate's process) sends the same include_host for the
    null candidate and the timed calls, and records the mode in the timing it reports."""

    cfg = {"seed": 0, "trials": 1, "perf_trials": 4, "warmup": 1, "reference": str(SMALL)}
    if mode is not None:
        cfg["timing"] = mode
    # the loop around a null call: the judge saw 1.1-1.19 ms more than reported
    link = FakeCandidateLink(lambda trials: ([1.1 + 0.01 * i for i in range(trials)], [0.0] * trials),
                             lambda trials: ([1.4] * trials, [0.3] * trials))
    ref_mod = load_module(str(SMALL), f"timing_mode_reference_{mode}")
    result = judge._judge(cfg, lambda stage: None, torch.device("cpu"), ref_mod, link)
    (calibrate, cal_fields), (time, time_fields) = link.observed
    assert (calibrate, time) == ("calibrate", "time")
    assert cal_fields["include_host"] is include_host and time_fields["include_host"] is include_host
    t = result["timing"]
    assert t["mode"] == "cpu"  # what the mode means on this device
    assert t["loop_overhead_ms"] == pytest.approx(1.145) and t["external_excess_ms"] == pytest.approx(1.1)
    assert judge_timing(t, min_bytes=1, copy_bw=1e12) is None


@pytest.mark.parametrize("late", [1, 2])
def test_a_late_null_call_does_not_set_the_loop_cost(late):
    """With device timing the judge sees each null call take the ~1.1 ms cover longer than reported, except a
    call whose host reached the start event only after the cover had run out (0.0035 ms on an H100): the loop's
    cost is the median of the null calls, so one or two such calls neither make an honest candidate a cheat nor
    widen the margin by the whole cover."""
    def calibrate(trials):
        seen = [1.1 + 0.002 * i for i in range(trials - late)] + [1.0035] * late
        return seen, [0.0] * (trials - late) + [1.0] * late

    link = FakeCandidateLink(calibrate, lambda trials: ([1.36] * trials, [0.26] * trials))  # honest: cover + 0.26
    cfg = {"seed": 0, "trials": 1, "perf_trials": 4, "warmup": 1, "reference": str(SMALL), "timing": "device"}
    ref_mod = load_module(str(SMALL), f"timing_mode_reference_late_{late}")
    t = judge._judge(cfg, lambda stage: None, torch.device("cpu"), ref_mod, link)["timing"]
    assert 1.1 <= t["loop_overhead_ms"] <= 1.12 and t["loop_overhead_spread_ms"] < 0.02, t
    assert judge_timing({**t, "mode": "device"}, min_bytes=1, copy_bw=1e12) is None
    cut = {**t, "mode": "device", "median_ms": 0.26 / 3, "external_excess_ms": 1.1 + 0.26 * 2 / 3}
    assert "clock disagrees" in judge_timing(cut, min_bytes=1, copy_bw=1e12)  # a clock cut to a third: caught


@pytest.mark.parametrize("seen,reported,covered,measured", [
    (1.1, 0.003, True, True),      # the wait ran under the cover: the judge saw the cover
    (0.008, 0.003, True, False),   # the judge read both announcements at once (not scheduled between them)
    (1.0035, 1.0, True, False),    # the host reached the start event after the cover had run out
    (1.02, 1.0, False, True),      # host timing: the call is the wait
    (0.5, 1.0, False, False),      # host timing, read late
])
def test_null_call_measured(seen, reported, covered, measured):
    assert judge.null_call_measured(seen, reported, covered) is measured


def test_a_calibration_read_late_is_done_again():
    """A judge that was not scheduled while the null calls ran (8 builds ahead on the host) reads their
    announcements at once and would set the loop's cost to ~0, making an honest candidate a cheat by the whole
    cover: the round is done again, before the candidate is loaded, and the measured round sets the cost."""
    rounds = iter([([0.008] * 10, [0.003] * 10), ([1.1 + 0.001 * i for i in range(10)], [0.003] * 10)])
    link = FakeCandidateLink(lambda trials: next(rounds), None)
    loop_ms = judge.calibrate_loop(link, include_host=False, covered=True)
    assert [command for command, _ in link.observed] == ["calibrate", "calibrate"]
    assert len(loop_ms) == 10 and 1.09 < loop_ms[0] <= loop_ms[-1] < 1.11


def test_a_calibration_never_measured_keeps_what_it_saw():
    link = FakeCandidateLink(lambda trials: ([0.008] * trials, [0.003] * trials), None)
    loop_ms = judge.calibrate_loop(link, include_host=False, covered=True)
    assert len(link.observed) == judge.NULL_ROUNDS and loop_ms == [pytest.approx(0.005)] * (10 * judge.NULL_ROUNDS)


# ---------------------------------------------------------------------------------------------------------
# The judge's clock check with device timing (fabricated numbers in the style of test_harness's)

# Device timing of a 0.26 ms model: the judge sees each call take the cover (flush ~0.07 ms + spin ~1 ms) plus
# the call plus its wake-up latency longer than the events report; so does the null candidate's loop.
DEVICE_HONEST = {"median_ms": 0.26, "trials": 100, "device_tail_ms": 0.01, "external_median_ms": 1.36,
                 "external_excess_ms": 1.10, "loop_overhead_ms": 1.08, "loop_overhead_spread_ms": 0.01,
                 "mode": "device"}
HOST_HONEST = {"median_ms": 0.31, "trials": 100, "device_tail_ms": 0.01, "external_median_ms": 0.34,
               "external_excess_ms": 0.03, "loop_overhead_ms": 0.02, "loop_overhead_spread_ms": 0.01,
               "mode": "host"}


@pytest.mark.parametrize("honest", [DEVICE_HONEST, HOST_HONEST], ids=["device", "host"])
def test_clock_check_in_both_modes(honest):
    assert judge_timing(honest, min_bytes=1, copy_bw=1e12) is None
    # a clock cut to a third: the reported time shrinks, the judge's does not, so the excess grows by the cut
    cut_ms = honest["median_ms"] * 2 / 3
    cut = {**honest, "median_ms": honest["median_ms"] / 3, "external_excess_ms": honest["external_excess_ms"] + cut_ms}
    reason = judge_timing(cut, min_bytes=1, copy_bw=1e12)
    unexplained = cut["external_excess_ms"] - honest["loop_overhead_ms"]  # the cut + the honest 0.01-0.02 ms
    assert reason and "clock disagrees" in reason and f"took {unexplained:.3g} ms more" in reason, reason


def test_device_timing_needs_the_null_candidate_behind_the_same_cover():
    """Why the calibration runs in the timed calls' mode: a host-mode loop cost (no cover) subtracted from a
    device-mode excess (cover included) would call every honest candidate a cheat by the ~1 ms cover."""
    mismatched = {**DEVICE_HONEST, "loop_overhead_ms": HOST_HONEST["loop_overhead_ms"]}
    assert "clock disagrees" in judge_timing(mismatched, min_bytes=1, copy_bw=1e12)


def test_a_cover_shorter_than_calibrated_is_tampering_in_device_mode():
    """A candidate that shortens the spin (after disabling the module snapshot) would make room for ~1 ms of cut
    time under the check from above; the judge's clock sees the cover shrink. Host and CPU timings have no cover
    (a loaded CPU judge sees calls take less than reported): not checked from below there."""
    shortened = {**DEVICE_HONEST, "external_excess_ms": 0.05}  # the judge saw no cover at all
    assert "the timing loop was tampered with" in judge_timing(shortened, min_bytes=1, copy_bw=1e12)
    assert judge_timing({**DEVICE_HONEST, "external_excess_ms": 1.0}, min_bytes=1, copy_bw=1e12) is None  # jitter
    for mode in ("host", "cpu"):
        assert judge_timing({**HOST_HONEST, "external_excess_ms": -1.5, "mode": mode}, min_bytes=1,
                            copy_bw=1e12) is None


def test_floor_and_tail_checks_are_the_same_in_device_mode():
    floor = judge_timing({**DEVICE_HONEST, "median_ms": 0.01, "external_excess_ms": 1.35}, min_bytes=10**8,
                         copy_bw=1e12)  # floor 0.1 ms; the excess grew by the 0.25 ms not reported
    assert floor and ("floor" in floor or "clock disagrees" in floor)
    no_clock = {k: v for k, v in DEVICE_HONEST.items() if not k.startswith(("external", "loop"))}
    assert "floor" in judge_timing({**no_clock, "median_ms": 0.01}, min_bytes=10**8, copy_bw=1e12)
    assert "another stream" in judge_timing({**DEVICE_HONEST, "device_tail_ms": 3.0}, min_bytes=1, copy_bw=1e12)


def _outcome(timing_dict):
    return ChildOutcome(result={"verdict": "ok", "message": "", "timing": timing_dict}, returncode=0,
                        timed_out=False, stage="done", wall_s=1.0, log_tail="")


def test_speedup_only_between_timings_of_the_same_mode():
    baseline = Baseline(device="cuda", device_name="gpu", torch_version="x",
                        ref_timing={"median_ms": 0.52, "device_tail_ms": 0.01, "mode": "device"}, copy_bw=3e12,
                        min_bytes=1, timing_mode="device")
    same = result_from("c.py", _outcome(DEVICE_HONEST), 60, baseline, True)
    assert same.verdict == "ok" and same.speedup == pytest.approx(2.0) and same.message == ""
    other = result_from("c.py", _outcome({**DEVICE_HONEST, "mode": "device, flush cover only"}), 60, baseline, True)
    assert other.verdict == "ok" and other.speedup is None and "timed as 'device'" in other.message
    cheat = result_from("c.py", _outcome({**DEVICE_HONEST, "mode": "host", "device_tail_ms": 3.0}), 60, baseline,
                        True)
    assert cheat.verdict == "cheating" and "another stream" in cheat.message  # still judged
