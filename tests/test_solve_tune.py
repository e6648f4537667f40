"""Choosing the launch configuration: stop at the target, skip wrong or refused candidates, ignore noise.

The timer is a fake that reports a time per configuration, so nothing here measures anything.
"""
import types

import pytest
import torch

from fastnorm.solve import tune as tuning
from fastnorm.harness.timing import TimingStats


class FakeSolution:
    """A ModelNew stand-in whose speed and correctness depend on the solution module's configuration."""

    def __init__(self, module, times: dict, wrong=(), refused=()):
        self.module, self.times, self.wrong, self.refused = module, times, set(wrong), set(refused)
        self.timed = []

    def config(self):
        return (self.module.THREADS, self.module.BLOCKS_PER_ROW)

    def __call__(self, x):
        if self.config() in self.refused:
            raise RuntimeError("fastnorm kernel failed: too many resources requested for launch")
        return x * 2 + (1 if self.config() in self.wrong else 0)

    def timer(self, fn, *, device, trials):
        if "reference" in fn.__code__.co_freevars:  # tune's `lambda: reference(*inputs)`: 10 ms
            ms = 10.0
        else:
            ms = self.times.get(self.config(), 9.0)
            self.timed.append(self.config())
        fn()
        return TimingStats(ms, ms, ms, ms, ms, trials)


@pytest.fixture(autouse=True)
def healthy_device(monkeypatch):
    """The fake runs on the CPU even when it claims cuda: no CUDA context to probe after an error."""
    monkeypatch.setattr(tuning, "_device_usable", lambda device: True)


def run(times, target=None, wrong=(), refused=(), device_type="cuda", launch_overrides=True):
    module = types.SimpleNamespace(THREADS=-1, BLOCKS_PER_ROW=-1)
    solution = FakeSolution(module, times, wrong, refused)

    def reference(x):
        return x * 2

    x = torch.randn(4, 8)
    # The device only selects the candidate list here (the fake timer runs everything on the CPU).
    best, trials, ref_ms = tuning.tune(module, solution, reference, [x], torch.device(device_type),
                                       target_speedup=target, timer=solution.timer, trials=3, log=lambda _: None,
                                       launch_overrides=launch_overrides)
    return module, solution, best, trials, ref_ms


def test_kernels_without_launch_overrides_are_timed_once_at_auto():
    """BatchNorm, GroupNorm and p-norm solutions: their kernels take no THREADS / BLOCKS_PER_ROW."""
    _, solution, best, trials, _ = run({(0, 0): 5.0, (128, 0): 1.0}, launch_overrides=False)
    assert [(t.threads, t.blocks_per_row) for t in trials] == [(0, 0)] and solution.timed == [(0, 0)]
    assert best.ms == 5.0


def test_only_the_configurations_given_are_timed():
    """The solver passes the grid pruned to launches its build can make (kernel_needs.tune_configs)."""
    module = types.SimpleNamespace(THREADS=-1, BLOCKS_PER_ROW=-1)
    solution = FakeSolution(module, {(0, 0): 5.0, (64, 0): 4.0, (128, 8): 1.0})
    best, trials, _ = tuning.tune(module, solution, lambda x: x * 2, [torch.randn(4, 8)], torch.device("cuda"),
                                  target_speedup=None, timer=solution.timer, trials=3, log=lambda _: None,
                                  configs=[(0, 0), (64, 0)])
    assert [(t.threads, t.blocks_per_row) for t in trials] == [(0, 0), (64, 0)] and best.ms == 4.0


def test_candidates_start_with_auto_and_are_distinct():
    for device_type in ("cuda", "cpu"):
        configs = tuning.candidate_configs(device_type)
        assert configs[0] == (0, 0) and len(set(configs)) == len(configs)
    assert len(tuning.candidate_configs("cuda")) > 10


def test_fastest_candidate_wins_and_is_left_set():
    fast = tuning.candidate_configs("cuda")[7]
    module, _, best, trials, ref_ms = run({(0, 0): 5.0, fast: 2.0})
    assert (best.threads, best.blocks_per_row) == fast and best.speedup == pytest.approx(5.0)
    assert (module.THREADS, module.BLOCKS_PER_ROW) == fast
    assert ref_ms == 10.0 and len(trials) == len(tuning.candidate_configs("cuda"))


def test_stops_as_soon_as_the_target_is_met():
    configs = tuning.candidate_configs("cuda")
    third = configs[2]
    _, solution, best, trials, _ = run({(0, 0): 8.0, configs[1]: 7.0, third: 4.0, configs[5]: 1.0}, target=2.0)
    assert len(trials) == 3 and solution.timed == configs[:3]
    assert (best.threads, best.blocks_per_row) == third


def test_wrong_or_refused_candidates_are_skipped():
    configs = tuning.candidate_configs("cuda")
    wrong, refused = configs[1], configs[2]
    _, solution, best, trials, _ = run({(0, 0): 5.0, wrong: 1.0, refused: 1.0}, wrong=[wrong], refused=[refused])
    by_config = {(t.threads, t.blocks_per_row): t for t in trials}
    assert "max abs difference" in by_config[wrong].error and by_config[wrong].ms is None
    assert "too many resources" in by_config[refused].error and by_config[refused].ms is None
    assert wrong not in solution.timed and refused not in solution.timed
    assert (best.threads, best.blocks_per_row) != wrong


def test_an_override_within_noise_of_auto_is_not_chosen():
    configs = tuning.candidate_configs("cuda")
    _, _, best, _, _ = run({(0, 0): 5.0, configs[3]: 5.0 * (1 - tuning.NOISE_MARGIN / 2)}, target=None)
    # Everything else defaults to 9 ms: the barely faster override loses to auto.
    assert (best.threads, best.blocks_per_row) == (0, 0)


def test_no_correct_candidate_gives_none():
    module, _, best, trials, _ = run({}, wrong=tuning.candidate_configs("cpu"), device_type="cpu")
    assert best is None and len(trials) == 1 and trials[0].error


def test_outputs_match_checks_dtype_shape_and_values():
    a = torch.randn(3, 4)
    assert tuning.outputs_match(a, a.clone()) is None
    assert "expected" in tuning.outputs_match(a, a.double())
    assert "expected" in tuning.outputs_match((a, a), a)
    assert "max abs difference" in tuning.outputs_match(a, a + 1e-3)
    half = a.bfloat16()
    assert tuning.outputs_match(half, (a * (1 + 2 ** -9)).bfloat16()) is None


def test_a_poisoned_device_ends_the_search(monkeypatch):
    configs = tuning.candidate_configs("cuda")
    monkeypatch.setattr(tuning, "_device_usable", lambda device: False)
    _, _, best, trials, _ = run({(0, 0): 5.0}, refused=[configs[1]])
    assert len(trials) == 2 and trials[1].error and (best.threads, best.blocks_per_row) == (0, 0)
