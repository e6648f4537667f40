"""`fastnorm eval` on CPU: verdicts, cheat detection, isolation, CLI/JSON, plus unit tests of its pieces.

Each evaluation spawns one child process per candidate (~3 s each for `import torch`), so candidates are
grouped into a few evaluate() calls shared by many tests (module-scoped fixtures).
"""
import json
import math
import time
from pathlib import Path

import pytest
import torch

from fastnorm.harness import VERDICTS, CandidateResult, EvaluationError, evaluate
from fastnorm.harness import checks, cli, messages
from fastnorm.harness.report import summarize
from fastnorm.harness.timing import TimingStats, copy_bandwidth, time_callable
from fastnorm.harness.timing_verdict import judge_timing

CANDIDATES = Path(__file__).resolve().parent / "candidates"
SMALL = CANDIDATES / "ref_layer_norm_small.py"
LARGE = CANDIDATES / "ref_layer_norm_large.py"
FAST = ["--trials", "2", "--perf-trials", "3", "--warmup", "1", "-q"]

RUNTIME_SET = ["good_layer_norm", "wrong_output", "wrong_shape", "raises_in_forward", "segfault", "mutates_input",
               "inplace_alias", "returns_reference_output", "stale_output", "background_thread", "out_of_memory",
               "monkeypatches_reference", "degrades_after_warmup"]
LOAD_SET = ["bad_load_inline_kwarg", "missing_cpp_sources", "compile_error_flag", "compile_error_in_init",
            "no_modelnew", "ctor_raises"]


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
def load_run(quiet_children):
    """Candidates that fail while importing/constructing, imported in parallel (jobs=2) before the runs."""
    report = evaluate(SMALL, list(map(cand, LOAD_SET)), device="cpu", trials=1, perf_trials=2, warmup=1,
                      timeout=120, jobs=2)
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


def test_honest_candidate_is_ok_and_timed(runtime_run):
    r = runtime_run[2]["good_layer_norm"]
    assert r["verdict"] == "ok", r["message"]
    assert r["max_abs_err"] <= 1e-5
    assert r["cand_ms"] > 0 and r["ref_ms"] > 0
    assert r["speedup"] == pytest.approx(r["ref_ms"] / r["cand_ms"])
    t = r["cand_timing"]
    assert t["min_ms"] <= t["q1_ms"] <= t["median_ms"] <= t["q3_ms"] and t["trials"] == 3
    assert r["achieved_gbps"] > 0 and r["pct_of_copy_bw"] > 0


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


def test_returning_the_reference_output_is_cheating(runtime_run):
    r = runtime_run[2]["returns_reference_output"]
    assert r["verdict"] == "cheating" and "the reference's output" in r["message"]


def test_unwritten_output_fails(runtime_run):
    r = runtime_run[2]["stale_output"]
    assert r["verdict"] == "wrong_output"


def test_work_finishing_after_return_is_cheating(runtime_run):
    r = runtime_run[2]["background_thread"]
    assert r["verdict"] == "cheating" and "still being written after forward returned" in r["message"]


def test_out_of_memory_is_runtime_error(runtime_run):
    r = runtime_run[2]["out_of_memory"]
    assert r["verdict"] == "runtime_error" and "allocate" in r["message"]


def test_monkeypatching_what_the_reference_calls_is_cheating(runtime_run):
    r = runtime_run[2]["monkeypatches_reference"]
    assert r["verdict"] == "cheating" and "torch.nn.functional.layer_norm" in r["message"]


def test_candidate_that_degrades_while_timed_is_caught_after_timing(runtime_run):
    r = runtime_run[2]["degrades_after_warmup"]
    assert r["verdict"] == "wrong_output" and "after timing" in r["message"]


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
    """An honest candidate under another class name is ok; a memoizing one is below the bytes/bandwidth floor."""
    report = evaluate(LARGE, [cand("memoized_fast")], device="cpu", trials=2, perf_trials=5, warmup=1, timeout=120)
    memo = report.results[0]
    assert memo.verdict == "cheating" and "physical floor" in memo.message, memo.message
    assert memo.cand_ms < report.baseline.floor_ms
    honest = evaluate(LARGE, [cand("no_modelnew")], device="cpu", class_name="LayerNormFast", trials=1,
                      perf_trials=5, warmup=1, timeout=120)
    assert honest.results[0].verdict == "ok", honest.results[0].message
    assert honest.results[0].cand_ms > honest.baseline.floor_ms


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


def test_summary_fast_p_and_geomean():
    results = [CandidateResult("a", "ok", speedup=4.0), CandidateResult("b", "ok", speedup=1.2),
               CandidateResult("c", "ok", speedup=0.5), CandidateResult("d", "wrong_output")]
    s = summarize(results)
    assert (s["fast_0"], s["fast_1"], s["fast_1.5"], s["fast_2"]) == (0.75, 0.5, 0.25, 0.25)
    assert s["geomean_speedup"] == pytest.approx(math.exp((math.log(4) + math.log(1.2) + math.log(0.5)) / 3))
    assert summarize([CandidateResult("x", "timeout")])["geomean_speedup"] is None
