"""`fastnorm eval` on CPU: verdicts, cheat detection, isolation, CLI/JSON, plus unit tests of its pieces.

Each candidate costs two child processes (the judge and the candidate's own, ~3 s each for `import torch`),
so candidates are grouped into a few evaluate() calls shared by many tests (module-scoped fixtures).
"""
import json
import math
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from fastnorm.harness import VERDICTS, CandidateResult, EvaluationError, evaluate
from fastnorm.harness import checks, cli, messages, shared_tensors
from fastnorm.harness.judge import CLOCK_LOOKS, MIN_TIMED_CALLS, with_more_looks
from fastnorm.harness.timing_verdict import FLOOR_MARGIN
from fastnorm.harness.channel import ProtocolError, decode_value, encode_value, tensor_leaves
from fastnorm.harness.report import summarize
from fastnorm.harness.tamper import ModuleSnapshot
from fastnorm.harness.timing import TimingStats, TrialHooks, copy_bandwidth, time_callable
from fastnorm.harness.timing_verdict import judge_timing
from fastnorm.harness.isolation import last_stage, stage_seconds

CANDIDATES = Path(__file__).resolve().parent / "candidates"
SMALL = CANDIDATES / "ref_layer_norm_small.py"
LARGE = CANDIDATES / "ref_layer_norm_large.py"
FAST = ["--trials", "2", "--perf-trials", "3", "--warmup", "1", "-q"]

RUNTIME_SET = ["good_layer_norm", "wrong_output", "wrong_shape", "raises_in_forward", "segfault", "mutates_input",
               "inplace_alias", "returns_reference_output", "stale_output", "background_thread", "out_of_memory",
               "monkeypatches_reference", "degrades_after_warmup"]
LOAD_SET = ["bad_load_inline_kwarg", "missing_cpp_sources", "compile_error_flag", "compile_error_in_init",
            "no_modelnew", "ctor_raises"]
# Issue 22: attacks on the evaluator itself (its clock, its checks, its expected outputs, its verdict).
ATTACK_SET = ["patches_perf_counter", "patches_event_elapsed_time", "patches_synchronize", "rewires_harness",
              "replaces_harness_module", "gc_referrers_search", "lazy_output", "adapts_to_warmup", "forges_verdict",
              "ctypes_clock", "records_importer"]
# Attacks on timing that only the judge's own clock sees; LARGE, so that a cut of 3x is milliseconds.
CLOCK_SET = ["restores_patched_clock", "rewrites_timing_samples", "disables_tamper_check", "memoized_fast",
             "good_layer_norm"]


def cand(name: str) -> str:
    return str(CANDIDATES / f"{name}.py")


@pytest.fixture(scope="module")
def quiet_children():
    # Children inherit this: one intra-op thread keeps them fast and their timing stable on a shared 2-core box.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield


@pytest.fixture(scope="module")
def runtime_run(tmp_path_factory, quiet_children):
    """The CLI over candidates that import fine and fail (or not) at run time; returns (exit code, JSON, by name)."""
    json_path = tmp_path_factory.mktemp("eval") / "report.json"
    rc = cli.main([str(SMALL), *map(cand, RUNTIME_SET), "--device", "cpu", "--timeout", "120", "--jobs", "1",
                   "--json", str(json_path), *FAST])
    doc = json.loads(json_path.read_text())
    return rc, doc, {Path(r["candidate"]).stem: r for r in doc["results"]}


@pytest.fixture(scope="module")
def attack_run(quiet_children, tmp_path_factory):
    """The attacks of issue 22 (warm-up 2: adapts_to_warmup needs two calls back to back)."""
    import_log = tmp_path_factory.mktemp("imports") / "importers.txt"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FASTNORM_TEST_IMPORT_LOG", str(import_log))
        report = evaluate(SMALL, list(map(cand, ATTACK_SET)), device="cpu", trials=2, perf_trials=5, warmup=2,
                          timeout=120, jobs=1)
    return {Path(r.candidate).stem: r for r in report.results}, import_log.read_text().split()


@pytest.fixture(scope="module")
def clock_run(quiet_children):
    report = evaluate(LARGE, list(map(cand, CLOCK_SET)), device="cpu", trials=2, perf_trials=5, warmup=1,
                      timeout=120, jobs=1)
    return {Path(r.candidate).stem: r for r in report.results}


@pytest.fixture(scope="module")
def load_run(quiet_children):
    """Candidates that fail while importing/constructing, imported by the build pool (build_jobs=2) ahead of
    the judge."""
    report = evaluate(SMALL, list(map(cand, LOAD_SET)), device="cpu", trials=1, perf_trials=2, warmup=1,
                      timeout=120, jobs=1, build_jobs=2)
    return {Path(r.candidate).stem: r for r in report.results}


# ---------------------------------------------------------------------------------------------------------
# End to end on CPU

def test_json_document_schema_and_exit_code(runtime_run):
    rc, doc, by_name = runtime_run
    assert rc == 1  # not every candidate is ok
    assert doc["device"] == "cpu" and doc["reference"] == str(SMALL)
    assert [Path(r["candidate"]).stem for r in doc["results"]] == RUNTIME_SET  # input order kept
    for r in doc["results"]:
        for key in ("candidate", "verdict", "message", "max_abs_err", "ref_ms", "cand_ms", "speedup"):
            assert key in r, key
        assert r["verdict"] in VERDICTS
        assert (r["message"] == "") == (r["verdict"] == "ok"), r
        assert "\n" not in r["message"]
    summary = doc["summary"]
    assert summary["candidates"] == len(RUNTIME_SET) and summary["ok"] == 1
    assert summary["fast_0"] == pytest.approx(1 / len(RUNTIME_SET))
    assert {"fast_1", "fast_1.5", "fast_2", "geomean_speedup"} <= set(summary)
    assert doc["baseline"]["min_bytes"] == 2 * 4 * 16 * 32 * 33 * 4
    # the timing mode asked for (eval's default) and what it means on this device
    assert doc["settings"]["timing"] == "device" and doc["baseline"]["timing_mode"] == "cpu"
    assert by_name["good_layer_norm"]["cand_timing"]["mode"] == doc["baseline"]["ref_timing"]["mode"] == "cpu"


def test_honest_candidate_is_ok_and_timed(runtime_run):
    r = runtime_run[2]["good_layer_norm"]
    assert r["verdict"] == "ok", r["message"]
    assert r["max_abs_err"] <= 1e-5
    assert r["cand_ms"] > 0 and r["ref_ms"] > 0
    assert r["speedup"] == pytest.approx(r["ref_ms"] / r["cand_ms"])
    t = r["cand_timing"]
    # 3 asked; a candidate gets at least MIN_TIMED_CALLS (the judge's clock check takes their median)
    assert t["min_ms"] <= t["q1_ms"] <= t["median_ms"] <= t["q3_ms"] and t["trials"] == max(3, MIN_TIMED_CALLS)
    assert r["achieved_gbps"] > 0 and r["pct_of_copy_bw"] > 0


def test_where_a_candidates_time_goes(runtime_run):
    """stage_s: seconds in each stage its judge announced, from the process start ("spawn") to its exit, in
    order; they add up to the judge's wall time. A candidate that killed its judge still has the stages it
    reached."""
    r = runtime_run[2]["good_layer_norm"]
    stages = r["stage_s"]
    assert list(stages)[0] == "spawn" and list(stages)[-1] == "post-timing check"
    assert {"import candidate", "trial 0: candidate forward", "timing"} <= set(stages)
    assert all(v >= 0 for v in stages.values())
    assert sum(stages.values()) == pytest.approx(r["wall_s"], abs=0.05 + 0.001 * len(stages))
    died = runtime_run[2]["segfault"]["stage_s"]
    assert died and "spawn" in died and "timing" not in died


def test_stages_from_the_progress_file(tmp_path):
    """Each stage until the next, the last until the end, a repeated stage added up, "spawn" before the first;
    a line torn by a dying worker is skipped; no file, or no stage in it: None."""
    times = tmp_path / "progress.txt"
    times.write_text("10.5\timport\n11.0\ttrial\n12.0\ttiming\n12.5\ttrial\n")
    assert stage_seconds(times, 10.0, 14.0) == {"spawn": 0.5, "import": 0.5, "trial": 2.5, "timing": 0.5}
    times.write_text("10.5\timport\n11.")
    assert stage_seconds(times, 10.0, 14.0) == {"spawn": 0.5, "import": 3.5}
    times.write_text("")
    assert stage_seconds(times, 10.0, 14.0) is None
    assert stage_seconds(tmp_path / "missing.txt", 0.0, 1.0) is None
    assert last_stage(times) == "start" and last_stage(tmp_path / "missing.txt") == "start"
    times.write_text("10.5\timport\n11.0\ttrial 0: checks\n11.")
    assert last_stage(times) == "trial 0: checks"


def test_wrong_output_names_worst_element(runtime_run):
    r = runtime_run[2]["wrong_output"]
    assert r["verdict"] == "wrong_output"
    assert "worst at output #0[" in r["message"] and "expected" in r["message"]
    assert r["max_abs_err"] > 1e-4


def test_wrong_shape(runtime_run):
    r = runtime_run[2]["wrong_shape"]
    assert r["verdict"] == "wrong_shape"
    assert "(4, 16, 1056)" in r["message"] and "(4, 16, 32, 33)" in r["message"]


def test_exception_in_forward_is_runtime_error_with_location(runtime_run):
    r = runtime_run[2]["raises_in_forward"]
    assert r["verdict"] == "runtime_error"
    assert "invalid configuration argument" in r["message"] and "raises_in_forward.py:" in r["message"]


def test_segfault_is_runtime_error_and_evaluation_goes_on(runtime_run):
    rc, doc, by_name = runtime_run
    r = by_name["segfault"]
    assert r["verdict"] == "runtime_error"
    assert "SIGSEGV" in r["message"] and "segfault.py:" in r["message"]
    later = RUNTIME_SET[RUNTIME_SET.index("segfault") + 1:]
    assert all(by_name[n]["stage"] != "start" for n in later)  # the next candidates still ran


def test_input_mutation_is_cheating(runtime_run):
    r = runtime_run[2]["mutates_input"]
    assert r["verdict"] == "cheating" and "modified input #0" in r["message"]


def test_output_aliasing_an_input_is_cheating(runtime_run):
    r = runtime_run[2]["inplace_alias"]
    assert r["verdict"] == "cheating" and "aliases input #0" in r["message"]


def test_the_reference_output_is_not_in_the_candidates_process(runtime_run):
    r = runtime_run[2]["returns_reference_output"]  # it scans gc for it, finds nothing, returns zeros
    assert r["verdict"] == "wrong_output" and "got 0.0" in r["message"], r["message"]


def test_unwritten_output_fails(runtime_run):
    r = runtime_run[2]["stale_output"]
    assert r["verdict"] == "wrong_output" and "memory the harness had overwritten" in r["message"]


def test_work_finishing_after_return_is_cheating(runtime_run):
    r = runtime_run[2]["background_thread"]
    assert r["verdict"] == "cheating" and "still being written after forward returned" in r["message"]


def test_out_of_memory_is_runtime_error(runtime_run):
    r = runtime_run[2]["out_of_memory"]
    assert r["verdict"] == "runtime_error" and "allocate" in r["message"]


def test_monkeypatching_what_the_reference_calls_is_cheating(runtime_run):
    r = runtime_run[2]["monkeypatches_reference"]
    assert r["verdict"] == "cheating" and "torch.nn.functional.layer_norm" in r["message"]


def test_candidate_that_degrades_while_timed_is_caught(runtime_run):
    r = runtime_run[2]["degrades_after_warmup"]  # a timed call checked at random, or the check after timing
    assert r["verdict"] == "wrong_output", r["message"]
    assert "(checked at random)" in r["message"] or "after timing" in r["message"]


def test_table_lists_every_candidate(runtime_run, capsys):
    # the table was printed by the fixture's cli.main call before capsys existed; re-render from JSON instead
    from fastnorm.harness.report import Baseline, EvalReport
    _, doc, _ = runtime_run
    b = doc["baseline"]
    baseline = Baseline(**{k: b[k] for k in ("device", "device_name", "torch_version", "ref_timing", "copy_bw",
                                             "min_bytes", "outputs", "compiled_timing", "compile_error")})
    results = [CandidateResult(**{k: v for k, v in r.items() if k != "name"}) for r in doc["results"]]
    table = EvalReport(doc["reference"], baseline, results, doc["settings"]).format_table()
    for name in RUNTIME_SET:
        assert f"{name}.py" in table
    assert "summary:" in table and "fast_1.5" in table


@pytest.mark.parametrize("name, replaced", [("patches_perf_counter", "time.perf_counter"),
                                            ("patches_event_elapsed_time", "Event.elapsed_time"),
                                            ("patches_synchronize", "torch.cuda.synchronize"),
                                            ("rewires_harness", "fastnorm.harness.checks."),
                                            ("replaces_harness_module", "sys.modules['fastnorm.harness.checks']"),
                                            ("ctypes_clock", "changed the C function behind time.perf_counter")])
def test_rebinding_what_the_evaluator_runs_is_cheating(attack_run, name, replaced):
    r = attack_run[0][name]
    assert r.verdict == "cheating" and replaced in r.message, r.message
    assert "noticed after importing the candidate" in r.message


def test_expected_outputs_cannot_be_found_through_gc(attack_run):
    r = attack_run[0]["gc_referrers_search"]
    assert r.verdict == "wrong_output" and "got 0.0" in r.message, r.message


def test_lazy_output_is_cheating_naming_its_type(attack_run):
    r = attack_run[0]["lazy_output"]
    assert r.verdict == "cheating" and "LazyLayerNorm" in r.message and "__torch_dispatch__" in r.message, r.message
    assert "evaluator error" not in r.message


def test_candidate_that_adapts_to_warmup_is_caught_in_a_random_timed_call(attack_run):
    r = attack_run[0]["adapts_to_warmup"]
    assert r.verdict == "wrong_output" and "(checked at random)" in r.message, r.message


def test_forged_verdict_is_not_believed(attack_run):
    r = attack_run[0]["forges_verdict"]
    # Undumpable, the judge's /proc/PID/fd is closed to the candidate (wrong_output: it returns zeros); as root
    # it is not, and the forgery reaches the result pipe, but a result from a worker that was killed is ignored.
    assert r.verdict in ("wrong_output", "runtime_error"), (r.verdict, r.message)
    assert r.cand_timing is None


def test_candidate_code_runs_only_in_the_candidates_process(attack_run):
    r = attack_run[0]["records_importer"]
    assert r.verdict == "ok", r.message
    importers = attack_run[1]
    assert importers and all(path.endswith("candidate_process.py") for path in importers), importers


def test_clock_tampering_that_rebinds_nothing_is_caught_by_the_judges_clock(clock_run):
    for name in ("restores_patched_clock", "rewrites_timing_samples", "disables_tamper_check"):
        r = clock_run[name]
        assert r.verdict == "cheating", (name, r.verdict, r.message)
        # restores_patched_clock rebinds the loop's clock for most of the timed calls: a call checked at random
        # may notice it before the judge's clock does
        assert "clock disagrees with the judge's" in r.message or "fastnorm.harness.timing._" in r.message, r.message
    for name in ("rewrites_timing_samples", "disables_tamper_check"):
        assert "clock disagrees with the judge's" in clock_run[name].message, clock_run[name].message
    # The judge saw longer calls than the loop was left to report: call by call (the medians of the two sets
    # need not differ so on a loaded 2-core host, where one run had the judge's median 2.26 ms, the loop's 2.35)
    r = clock_run["rewrites_timing_samples"]
    assert r.cand_timing["external_excess_ms"] > r.cand_timing["loop_overhead_ms"]


def test_honest_candidate_agrees_with_the_judges_clock(clock_run):
    r = clock_run["good_layer_norm"]
    assert r.verdict == "ok", r.message
    t = r.cand_timing
    # (The median excess over all calls may be slightly negative: the judge's window is the announcements'.)
    assert t["loop_overhead_ms"] >= 0 and t["external_median_ms"] > 0 and t["external_excess_ms"] is not None, t


def test_cached_output_is_overwritten_once_returned(clock_run):
    r = clock_run["memoized_fast"]  # returns the same tensor again: the harness overwrote it after checking it
    assert r.verdict == "wrong_output" and "an output already returned" in r.message, r.message


def test_bad_load_inline_keyword_is_load_error_naming_the_call(load_run):
    r = load_run["bad_load_inline_kwarg"]
    assert r.verdict == "load_error"
    assert "unexpected keyword argument 'extra_cuda_flags'" in r.message
    assert "bad_load_inline_kwarg.py:5" in r.message and "load_inline(" in r.message


def test_missing_cpp_sources_is_load_error_naming_the_call(load_run):
    r = load_run["missing_cpp_sources"]
    assert r.verdict == "load_error"
    assert "load_inline()" in r.message and "cpp_sources" in r.message


def test_build_failure_is_compile_error_with_first_compiler_error(load_run):
    r = load_run["compile_error_flag"]
    assert r.verdict == "compile_error", r.message
    assert "error" in r.message and "-fthis-flag-does-not-exist" in r.message
    assert "layer_norm" in r.message  # the extension's name


def test_build_failure_in_constructor_is_compile_error(load_run):
    r = load_run["compile_error_in_init"]
    assert r.verdict == "compile_error", r.message
    assert "no_such_header.h" in r.message and "compile_error_in_init.py:10" in r.message


def test_missing_class_and_failing_constructor_are_load_errors(load_run):
    assert load_run["no_modelnew"].verdict == "load_error"
    assert "LayerNormFast" in load_run["no_modelnew"].message
    r = load_run["ctor_raises"]
    assert r.verdict == "load_error" and "constructing ModelNew" in r.message and "ctor_raises.py:" in r.message


def test_class_option_and_physical_floor(quiet_children):
    """An honest candidate under another class name is ok; a memoizing one is below the bytes/bandwidth floor
    (with outputs left as returned: see test_cached_output_is_overwritten_once_returned)."""
    report = evaluate(LARGE, [cand("memoized_fast")], device="cpu", trials=2, perf_trials=5, warmup=1, timeout=120,
                      scrub_freed_memory=False)
    memo = report.results[0]
    assert memo.verdict == "cheating" and "physical floor" in memo.message, memo.message
    assert memo.cand_ms < report.baseline.floor_ms
    honest = evaluate(LARGE, [cand("no_modelnew")], device="cpu", class_name="LayerNormFast", trials=1,
                      perf_trials=5, warmup=1, timeout=120)
    assert honest.results[0].verdict == "ok", honest.results[0].message
    # Not above the floor itself: on a loaded 2-core machine the copy that sets the floor can measure
    # slower than an honest LayerNorm of the same bytes (CI: 1.60 against a 1.65 ms floor); the verdict
    # allows for that with FLOOR_MARGIN, and so does this check.
    assert honest.results[0].cand_ms > FLOOR_MARGIN * honest.baseline.floor_ms


def test_hang_is_killed_at_the_timeout(quiet_children):
    t0 = time.monotonic()
    report = evaluate(SMALL, [cand("hangs")], device="cpu", trials=1, perf_trials=2, warmup=1, timeout=10)
    r = report.results[0]
    assert r.verdict == "timeout" and "forward" in r.message, r.message
    assert 9 < r.wall_s < 20 and time.monotonic() - t0 < 60


def test_missing_reference_raises():
    with pytest.raises(EvaluationError):
        evaluate(CANDIDATES / "no_such_reference.py", [cand("good_layer_norm")], device="cpu")
    assert cli.main([str(CANDIDATES / "no_such_reference.py"), cand("good_layer_norm"), "-q"]) == 2


# ---------------------------------------------------------------------------------------------------------
# Units: messages

NVCC_LOG = """[1/3] /usr/local/cuda/bin/nvcc -c /tmp/x/torch_extensions/rms_norm/cuda.cu -o cuda.cuda.o
FAILED: cuda.cuda.o
/usr/local/cuda/bin/nvcc -Werror=foo -c /tmp/x/torch_extensions/rms_norm/cuda.cu -o cuda.cuda.o
/tmp/x/torch_extensions/rms_norm/cuda.cu(57): error: identifier "Features" is undefined
      dim3 threads(Features);
1 error detected in the compilation of "/tmp/x/torch_extensions/rms_norm/cuda.cu".
ninja: build stopped: subcommand failed."""


@pytest.mark.parametrize("log, expected", [
    (NVCC_LOG, 'cuda.cu(57): error: identifier "Features" is undefined'),
    ("/tmp/e/bad/main.cpp:2:22: error: 'y' was not declared in this scope", "main.cpp:2:22: error: 'y' was not"),
    ("c++: error: unrecognized command-line option '-fx'", "c++: error: unrecognized command-line option '-fx'"),
    ("/usr/bin/ld: main.o: undefined reference to `foo()'\ncollect2: error: ld returned 1 exit status",
     "ld: main.o: undefined reference to `foo()'"),
    ("ninja: build stopped: subcommand failed.", None),
])
def test_first_compiler_error(log, expected):
    got = messages.first_compiler_error(log)
    assert got == expected if expected is None else got.startswith(expected)


def test_exception_message_names_the_line_in_the_file(tmp_path):
    src = tmp_path / "cand.py"
    src.write_text("def f(**kw):\n    pass\n\nf(\n  1,\n)\n")
    try:
        exec(compile(src.read_text(), str(src), "exec"), {})
    except TypeError as exc:
        msg = messages.exception_message(exc, str(src))
    assert msg.startswith("TypeError: f() takes 0 positional arguments") and "cand.py:4 `f(`" in msg


def test_signal_and_crash_location():
    assert messages.signal_description(-11).startswith("SIGSEGV")
    log = ('Fatal Python error: Segmentation fault\n\nCurrent thread 0x1 (most recent call first):\n'
           '  File "/usr/lib/python3/ctypes/__init__.py", line 519 in string_at\n'
           '  File "/work/c/segfault.py", line 12 in forward\n  File "/x/worker.py", line 3 in main\n')
    assert messages.crash_location(log, "/work/c/segfault.py") == "segfault.py:12 in forward"


# ---------------------------------------------------------------------------------------------------------
# Units: checks

def test_compare_reports_worst_element_and_tolerances():
    expected = torch.randn(3, 5, 7) * 3 + 1000
    actual = expected.clone()
    actual[1, 2, 3] += 0.5
    actual[2, 4, 6] += 0.05
    result = checks.compare(actual, expected, atol=1e-4, rtol=1e-4)
    assert not result.ok and result.mismatches == 1  # 0.05 is within 1e-4 + 1e-4 * 1000
    assert result.worst_index == (1, 2, 3) and result.max_abs_err == pytest.approx(0.5, rel=1e-3)
    assert checks.compare(expected.clone(), expected, 0.0, 0.0).ok


def test_compare_nan_and_inf_rules():
    expected = torch.tensor([1.0, float("nan"), float("inf"), -2.0])
    assert checks.compare(expected.clone(), expected, 1e-4, 1e-4).ok
    nan_where_finite = expected.clone()
    nan_where_finite[0] = float("nan")
    r = checks.compare(nan_where_finite, expected, 1e-4, 1e-4)
    assert not r.ok and r.worst_index == (0,)
    wrong_inf = expected.clone()
    wrong_inf[2] = 1e30
    assert not checks.compare(wrong_inf, expected, 1e-4, 1e-4).ok


def test_default_tolerances():
    assert checks.default_tolerance(torch.float32) == 1e-4
    assert checks.default_tolerance(torch.float16) == checks.default_tolerance(torch.bfloat16) == 1e-2
    assert checks.default_tolerance(torch.int64) == 0.0


def test_bitwise_equal_and_differences():
    a = torch.tensor([0.0, float("nan"), 3.0])
    assert checks.bitwise_equal(a, a.clone())  # NaN == NaN bitwise
    b = a.clone()
    b[0] = -0.0
    assert not checks.bitwise_equal(a, b) and checks.count_differences(a, b) == 1
    assert checks.bitwise_equal(torch.tensor([True, False]), torch.tensor([True, False]))


def test_storage_overlap():
    x = torch.randn(10, 10)
    assert checks.storages_overlap(x, x) and checks.storages_overlap(x[3:], x.t())
    assert not checks.storages_overlap(x, x.clone())


def test_footprint_and_scrub_pattern():
    x = torch.randn(4, 1).expand(4, 1000)
    assert checks.footprint_bytes(x) == 4 * 4 and checks.footprint_bytes(torch.empty(3, 5)) == 60
    scrubbed = torch.empty(6, dtype=torch.uint8).fill_(checks.SCRUB_BYTE).view(torch.float16)
    assert checks.count_scrub_pattern(scrubbed) == 3 and scrubbed.isnan().all()
    assert checks.scrub_freed_memory(torch.device("cpu"), [1000, 24]) == 1024
    returned = torch.randn(3, 4).t()
    checks.overwrite(returned)
    assert checks.count_scrub_pattern(returned) == 12


# ---------------------------------------------------------------------------------------------------------
# Units: timing, timing verdicts, summary

def test_timing_stats_quantiles():
    s = TimingStats.from_samples([5.0, 1.0, 3.0, 2.0, 4.0])
    assert (s.min_ms, s.q1_ms, s.median_ms, s.q3_ms, s.iqr_ms, s.mean_ms) == (1.0, 2.0, 3.0, 4.0, 2.0, 3.0)


def test_time_callable_measures_the_call_on_cpu():
    calls = []
    stats = time_callable(lambda: (calls.append(1), time.sleep(0.002)), device=torch.device("cpu"), trials=5,
                          warmup=2, flush_l2=False)
    assert len(calls) == 7 and stats.trials == 5
    assert stats.min_ms >= 2.0 and stats.device_tail_ms == 0.0


def test_copy_bandwidth_is_positive():
    assert copy_bandwidth(torch.device("cpu"), nbytes=8 << 20, trials=3) > 1e8  # any machine copies > 100 MB/s


def test_judge_timing():
    stats = {"median_ms": 1.0, "trials": 10, "device_tail_ms": 0.01}
    assert judge_timing(stats, min_bytes=10**6, copy_bw=1e12) is None  # floor 0.001 ms
    assert "floor" in judge_timing({**stats, "median_ms": 0.01}, min_bytes=10**8, copy_bw=1e12)  # floor 0.1 ms
    assert judge_timing({**stats, "median_ms": 0.01}, min_bytes=10**8, copy_bw=1e12, floor_check=False) is None
    assert "another stream" in judge_timing({**stats, "device_tail_ms": 3.0}, min_bytes=1, copy_bw=1e12)
    slow_sync = {**stats, "median_ms": 0.2, "device_tail_ms": 0.09}  # a machine whose idle synchronize is slow
    assert judge_timing(slow_sync, min_bytes=1, copy_bw=1e12, baseline_tail_ms=0.08) is None
    assert judge_timing(slow_sync, min_bytes=1, copy_bw=1e12) is not None


def test_judge_timing_compares_with_the_judges_clock():
    honest = {"median_ms": 1.0, "trials": 10, "device_tail_ms": 0.0, "external_median_ms": 1.04,
              "external_excess_ms": 0.04, "loop_overhead_ms": 0.02, "loop_overhead_spread_ms": 0.01}
    assert judge_timing(honest, min_bytes=1, copy_bw=1e12) is None
    cut = {**honest, "median_ms": 0.34, "external_excess_ms": 0.7}  # reported a third of what the judge saw
    reason = judge_timing(cut, min_bytes=1, copy_bw=1e12)
    assert "clock disagrees" in reason and "took 0.68 ms more" in reason and "0.34 ms" in reason, reason
    noisy = {**cut, "loop_overhead_spread_ms": 0.3}  # a loaded machine: the margin widens
    assert judge_timing(noisy, min_bytes=1, copy_bw=1e12) is None
    unseen = {**cut, "external_excess_ms": None}  # the judge never saw a call's start and end apart
    assert judge_timing(unseen, min_bytes=1, copy_bw=1e12) is None
    assert judge_timing({k: v for k, v in cut.items() if not k.startswith(("external", "loop"))},
                        min_bytes=1, copy_bw=1e12) is None  # no external measurement (older reports)


def test_disagreeing_clocks_get_more_looks():
    honest = {"median_ms": 1.0, "trials": 10, "device_tail_ms": 0.0, "external_median_ms": 1.04,
              "external_excess_ms": 0.04, "loop_overhead_ms": 0.02, "loop_overhead_spread_ms": 0.01}
    burst = {**honest, "external_excess_ms": 1.4}  # the judge descheduled over most of the calls

    def run(*timings):
        queue, said, slept = list(timings), [], []
        timing = with_more_looks(lambda: queue.pop(0), said.append, sleep=slept.append)
        return timing, len(timings) - len(queue), said, slept

    assert run(honest) == (honest, 1, [], [])  # agreeing clocks: timed once, no pause
    timing, runs, said, slept = run(burst, burst, honest)  # a burst over two looks: the third is judged
    assert timing is honest and runs == 3 and len(slept) == 2 and all(s > 0 for s in slept)
    assert said == [f"timing again (the clocks disagreed), look {k} of {CLOCK_LOOKS}" for k in (2, 3)]
    assert CLOCK_LOOKS == 3
    timing, runs, _, _ = run(*[burst] * (CLOCK_LOOKS + 1))  # a tampered clock disagrees every look: cheating
    assert runs == CLOCK_LOOKS and "clock disagrees" in judge_timing(timing, min_bytes=1, copy_bw=1e12)


def test_time_callable_calls_hooks_outside_the_measured_call():
    events = []

    class Recorder(TrialHooks):
        def before_call(self, trial):
            events.append(("before", trial))

        def after_call(self, trial):
            events.append(("after", trial))

        def after_trial(self, trial, output):
            events.append(("trial", trial, output))

        def after_warmup(self, output):
            events.append(("warmup", output))

    calls = iter(range(100))
    stats = time_callable(lambda: next(calls), device=torch.device("cpu"), trials=2, warmup=1, flush_l2=False,
                          hooks=Recorder())
    assert events == [("warmup", 0), ("before", 0), ("after", 0), ("trial", 0, 1), ("before", 1), ("after", 1),
                      ("trial", 1, 2)]
    assert len(stats.samples_ms) == 2 and "samples_ms" not in stats.to_dict()


def test_values_cross_the_pipe_as_plain_data():
    x, y = torch.ones(2), torch.zeros(3)
    value = [x, (3, 4.5, None), {"eps": 1e-5, "t": y}, torch.float16, "s", [True]]
    form = json.loads(json.dumps(encode_value(value, tensor=lambda t: 0 if t is x else 1)))
    back = decode_value(form, tensor=lambda k: ("tensor", k))
    assert back == [("tensor", 0), (3, 4.5, None), {"eps": 1e-5, "t": ("tensor", 1)}, torch.float16, "s", [True]]
    assert tensor_leaves(value) == [x, y]
    with pytest.raises(ValueError):
        encode_value(object())
    for bad in ({"tensor": 0}, {"class": "os.system"}, {"tuple": 3}, {"dtype": "object"}):
        with pytest.raises(ProtocolError):
            decode_value(bad)


def test_shared_buffer_descriptions_are_validated(tmp_path):
    exporter = shared_tensors.Exporter(torch.device("cpu"), str(tmp_path))
    raw, desc = exporter.empty(24)
    shared_tensors.view(raw, torch.float32, (2, 3), (3, 1), 0).copy_(torch.arange(6.0).view(2, 3))
    mapped = shared_tensors.open_exported(json.loads(json.dumps(desc)), torch.device("cpu"), str(tmp_path))
    assert mapped.view(torch.float32).tolist() == [0, 1, 2, 3, 4, 5]
    assert not (tmp_path / desc["file"]).exists()  # unlinked once mapped
    for bad in ({"nbytes": 8, "file": "../etc/passwd"}, {"nbytes": 8, "file": "buffer-missing"}, {"nbytes": -1},
                {"nbytes": 8, "ipc": [{"class": "builtins.eval"}]}):
        with pytest.raises(ProtocolError):
            shared_tensors.open_exported(bad, torch.device("cuda" if "ipc" in bad else "cpu"), str(tmp_path))
    # what a CUDA IPC description holds survives JSON, and only whitelisted classes come back
    args = (torch.Tensor, torch.Size([4]), (1,), 0, torch.storage.TypedStorage, torch.uint8, 0, b"\x00\xff", 4, 0,
            False, b"/torch_1", 0, None, True)
    forms = json.loads(json.dumps([shared_tensors._encode(a) for a in args]))
    assert tuple(shared_tensors._decode(f) for f in forms) == (args[0], (4,)) + args[2:]


def test_module_snapshot_names_what_was_rebound():
    module = types.ModuleType("fastnorm_test_tamper_target")
    exec("def clock():\n    return 1.0\nclass Event:\n    def elapsed(self):\n        return 2.0\n", vars(module))
    sys.modules[module.__name__] = module
    try:
        snapshot = ModuleSnapshot()
        assert snapshot.changes() == []
        original = module.clock
        module.clock = lambda: 0.5
        (change,) = snapshot.changes()
        assert change.startswith(f"replaced {module.__name__}.clock (now function ") and "test_harness.py:" in change
        module.clock = original
        original.__code__ = (lambda: 0.5).__code__
        assert snapshot.changes() == [f"changed the code, defaults or closure of {module.__name__}.clock in place"]
        module.Event.elapsed = lambda self: 0.0
        assert any(c.startswith(f"replaced {module.__name__}.Event.elapsed") for c in snapshot.changes())
        sys.modules[module.__name__] = types.ModuleType(module.__name__)
        assert snapshot.changes() == [f"replaced sys.modules['{module.__name__}'] (now a module)"]
        sys.modules[module.__name__] = module
        sys.setprofile(lambda *a: None)
        try:
            assert "installed a hook through sys.setprofile" in snapshot.changes()[0]
        finally:
            sys.setprofile(None)
    finally:
        del sys.modules[module.__name__]


def test_summary_fast_p_and_geomean():
    results = [CandidateResult("a", "ok", speedup=4.0), CandidateResult("b", "ok", speedup=1.2),
               CandidateResult("c", "ok", speedup=0.5), CandidateResult("d", "wrong_output")]
    s = summarize(results)
    assert (s["fast_0"], s["fast_1"], s["fast_1.5"], s["fast_2"]) == (0.75, 0.5, 0.25, 0.25)
    assert s["geomean_speedup"] == pytest.approx(math.exp((math.log(4) + math.log(1.2) + math.log(0.5)) / 3))
    assert summarize([CandidateResult("x", "timeout")])["geomean_speedup"] is None


def test_compare_over_many_chunks_finds_the_worst_element_and_every_mismatch(monkeypatch):
    from fastnorm.harness import checks

    monkeypatch.setattr(checks, "CPU_COMPARE_CHUNK_ELEMENTS", 7)  # 5 x 6 x 4 = 120 elements: 18 chunks
    expected = torch.randn(5, 6, 4, dtype=torch.float64).float()
    actual = expected.clone()
    actual[0, 0, 1] += 0.5       # first chunk
    actual[3, 2, 2] += 2.0       # a later chunk: the worst
    actual[4, 5, 3] = float("nan")  # the last element
    result = checks.compare(actual, expected, 1e-4, 1e-4)
    assert not result.ok and result.mismatches == 3 and result.numel == 120
    assert result.worst_index == (4, 5, 3)  # NaN against a number: infinitely wrong
    actual[4, 5, 3] = expected[4, 5, 3]
    result = checks.compare(actual, expected, 1e-4, 1e-4)
    assert result.mismatches == 2 and result.worst_index == (3, 2, 2)
    assert abs(result.max_abs_err - 2.0) < 1e-5
