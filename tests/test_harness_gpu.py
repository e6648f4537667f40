"""`fastnorm eval` on a CUDA GPU: the five real-world seed candidates, the CUDA-only cheats (side streams,
stale freed memory, illegal memory access), the attacks on the evaluator itself (issue 22: its clock, its
checks, its expected outputs, its verdict) and the guarantee that the evaluating process never touches CUDA.

Run on an H100: FASTNORM_SEEDS=... pytest tests/test_harness_gpu.py -m "cuda and not slow" (about 8 minutes,
mostly nvcc builds). Every evaluation here uses eval's default device timing (each call issued behind the L2
flush and the spin on every SM) unless it names timing="host"; test_seed_solution_in_both_timing_modes
compares the two.
"""
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from fastnorm.harness import evaluate

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

REPO = Path(__file__).resolve().parents[1]
# The seeds sit beside the checkout (../shared); a copy can be pointed at with FASTNORM_SEEDS (the GPU
# machine receives only the repository).
SEEDS = Path(os.environ.get("FASTNORM_SEEDS") or
             Path(__file__).resolve().parents[1].parent / "shared" / "seeds" / "solutions")
LAYER_NORM = REPO / "problems" / "layer_norm_16x64x256x256.py"
RMS_NORM = REPO / "problems" / "rms_norm_112x64x512x512.py"
CANDIDATES = Path(__file__).resolve().parent / "candidates"


def cand(name: str) -> str:
    return str(CANDIDATES / f"{name}.py")


def seed(i: int) -> Path:
    path = SEEDS / f"seed{i:03d}_modelnew.py"
    if not path.is_file():
        pytest.skip(f"seed solutions not found in {SEEDS}")
    return path


def gpu_memory_used_mib() -> int | None:
    """Device memory in use by anyone, from nvidia-smi (the test process itself must not create a context)."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                         capture_output=True, text=True)
    return int(out.stdout.split()[0]) if out.returncode == 0 and out.stdout.strip() else None


def test_seed_layer_norm_candidates():
    report = evaluate(LAYER_NORM, [seed(i) for i in range(4)], device="cuda", trials=2, perf_trials=5, timeout=500,
                      compile_baseline=True)
    r = {Path(x.candidate).stem[:7]: x for x in report.results}
    for ok in ("seed000", "seed002"):
        assert r[ok].verdict == "ok", r[ok].message
        assert r[ok].max_abs_err < 1e-3 and r[ok].speedup < 1  # correct but slower than eager
    assert r["seed001"].verdict == "load_error"
    assert "load_inline()" in r["seed001"].message and "cpp_sources" in r["seed001"].message
    assert "seed001_modelnew.py:" in r["seed001"].message
    assert r["seed003"].verdict == "load_error"
    assert "load_inline()" in r["seed003"].message and "'extra_cuda_flags'" in r["seed003"].message
    assert report.baseline.compiled_timing is not None, report.baseline.compile_error
    assert r["seed000"].speedup_vs_compiled is not None
    assert report.baseline.device.startswith("cuda") and report.baseline.copy_bw > 5e11  # an H100 copies > 0.5 TB/s


def test_seed_rms_norm_compile_error():
    report = evaluate(RMS_NORM, [seed(4)], device="cuda", trials=1, perf_trials=5, timeout=500)
    r = report.results[0]
    assert r.verdict == "compile_error"
    assert 'identifier "Features" is undefined' in r.message and "rms_norm" in r.message
    assert report.baseline.min_bytes == 2 * 112 * 64 * 512 * 512 * 4


ADVERSARIAL = ["good_layer_norm", "side_stream", "side_stream_extra_work", "stale_output", "returns_reference_output",
               "inplace_alias", "mutates_input", "memoized_fast", "background_thread", "monkeypatches_reference",
               "oob_write_cuda", "good_layer_norm", "segfault", "out_of_memory", "wrong_output", "wrong_shape",
               "raises_in_forward", "degrades_after_warmup"]
# Issue 22: the attacks on the evaluator itself, and an honest candidate after them.
ATTACKS = ["patches_event_elapsed_time", "patches_perf_counter", "patches_synchronize", "rewires_harness",
           "replaces_harness_module", "gc_referrers_search", "lazy_output", "adapts_to_warmup", "forges_verdict",
           "ctypes_clock", "restores_patched_clock", "rewrites_timing_samples", "disables_tamper_check",
           "good_layer_norm"]


@pytest.fixture(scope="module")
def adversarial():
    cuda_was_initialized = torch.cuda.is_initialized()
    memory_before = gpu_memory_used_mib()
    report = evaluate(LAYER_NORM, list(map(cand, ADVERSARIAL)), device="cuda", trials=2, perf_trials=10,
                      timeout=300)
    return report, cuda_was_initialized, memory_before


def test_adversarial_verdicts_on_cuda(adversarial):
    report = adversarial[0]
    r = report.results
    by = lambda name, k=0: [x for x, n in zip(r, ADVERSARIAL) if n == name][k]
    assert by("good_layer_norm").verdict == "ok", by("good_layer_norm").message
    assert by("good_layer_norm").max_abs_err <= 1e-5

    side = by("side_stream")
    assert side.verdict == "cheating" and "still being written after forward returned" in side.message
    extra = by("side_stream_extra_work")
    assert extra.verdict == "cheating" and "another stream" in extra.message, extra.message
    stale = by("stale_output")
    # Memory the allocator hands back after a scrub is named as such; fresh memory at the first trial (zeros on
    # the H100) is plain wrong values.
    assert stale.verdict == "wrong_output", stale.message
    assert "memory the harness had overwritten" in stale.message or "wrong values" in stale.message, stale.message
    assert by("returns_reference_output").verdict == "wrong_output"  # nothing of the reference's to find
    assert "got 0.0" in by("returns_reference_output").message
    assert by("inplace_alias").verdict == "cheating" and "aliases input #0" in by("inplace_alias").message
    assert by("mutates_input").verdict == "cheating" and "modified input #0" in by("mutates_input").message
    memo = by("memoized_fast")  # its cache is the output it returned, overwritten once checked
    assert memo.verdict == "wrong_output" and "an output already returned" in memo.message, memo.message
    assert by("background_thread").verdict == "cheating"
    assert by("monkeypatches_reference").verdict == "cheating"

    oob = by("oob_write_cuda")
    assert oob.verdict == "runtime_error" and "illegal memory access" in oob.message, oob.message
    assert by("good_layer_norm", 1).verdict == "ok"  # a poisoned context in one worker harms no other
    assert by("segfault").verdict == "runtime_error" and "SIGSEGV" in by("segfault").message
    assert by("out_of_memory").verdict == "runtime_error" and "out of memory" in by("out_of_memory").message
    assert by("wrong_output").verdict == "wrong_output" and "worst at output #0[" in by("wrong_output").message
    assert by("wrong_shape").verdict == "wrong_shape"
    assert by("raises_in_forward").verdict == "runtime_error"
    degrades = by("degrades_after_warmup")
    assert degrades.verdict == "wrong_output" and "checked at random" in degrades.message, degrades.message


def test_evaluating_process_never_touches_cuda(adversarial):
    report, cuda_was_initialized, memory_before = adversarial
    if not cuda_was_initialized:
        assert not torch.cuda.is_initialized()  # every CUDA call happened in the workers
    memory_after = gpu_memory_used_mib()
    if memory_before is not None and memory_after is not None:
        assert memory_after <= memory_before + 256, (memory_before, memory_after)  # workers gone, memory freed


def test_good_candidate_timing_is_consistent(adversarial):
    report = adversarial[0]
    good = report.results[0]
    t = good.cand_timing
    assert t["min_ms"] <= t["median_ms"] <= t["q3_ms"]
    assert t["device_tail_ms"] < report.baseline.ref_timing["device_tail_ms"] + 0.05  # no hidden work
    assert 0.5 < good.speedup < 2.0  # the same torch LayerNorm as the reference
    assert 0.5 < good.pct_of_copy_bw < 133  # eager LayerNorm runs the seed problem at ~2% of copy


def test_stale_output_fails_without_scrubbing_too():
    """The old evaluator needed to overwrite freed memory, or `return torch.empty_like(x)` passed: the allocator
    handed it the reference's freed output. The reference now runs in the judge's process, so the candidate's
    allocator never held it: wrong even with every overwrite off."""
    report = evaluate(LAYER_NORM, [cand("stale_output")], device="cuda", trials=1, perf_trials=3, timeout=300,
                      floor_check=False, scrub_freed_memory=False)
    r = report.results[0]
    assert r.verdict == "wrong_output", r.message


@pytest.fixture(scope="module")
def attacks():
    return evaluate(LAYER_NORM, list(map(cand, ATTACKS)), device="cuda", trials=2, perf_trials=20, warmup=3,
                    timeout=300)


def test_attacks_on_the_evaluator_on_cuda(attacks):
    by = {Path(r.candidate).stem: r for r in attacks.results}
    for name, replaced in [("patches_event_elapsed_time", "torch.cuda.streams.Event.elapsed_time"),
                           ("patches_perf_counter", "time.perf_counter"),
                           ("patches_synchronize", "torch.cuda.synchronize"),
                           ("rewires_harness", "fastnorm.harness.checks."),
                           ("replaces_harness_module", "sys.modules['fastnorm.harness.checks']"),
                           ("ctypes_clock", "changed the C function behind time.perf_counter")]:
        assert by[name].verdict == "cheating" and replaced in by[name].message, (name, by[name].message)
    assert by["gc_referrers_search"].verdict == "wrong_output"
    lazy = by["lazy_output"]
    assert lazy.verdict == "cheating" and "LazyLayerNorm" in lazy.message, lazy.message
    adapts = by["adapts_to_warmup"]
    assert adapts.verdict != "ok" and ("checked at random" in adapts.message or "floor" in adapts.message)
    assert by["forges_verdict"].verdict in ("wrong_output", "runtime_error"), by["forges_verdict"].message
    # rebinds the loop's event reader for the whole loop: noticed at a call checked at random
    restores = by["restores_patched_clock"]
    assert restores.verdict == "cheating" and "fastnorm.harness.timing._event_elapsed_ms" in restores.message
    # rebinds nothing / disables the identity checks first: only the judge's own clock sees it
    for name in ("rewrites_timing_samples", "disables_tamper_check"):
        r = by[name]
        assert r.verdict == "cheating" and "clock disagrees with the judge's" in r.message, (name, r.message)
    good = by["good_layer_norm"]
    assert good.verdict == "ok", good.message
    # The judge's clock agrees with the events to within its wake-up latency, once the loop's own cost
    # (measured with a null candidate) is taken off. With device timing that cost is mostly the cover
    # (flush + spin) queued ahead of each call, which takes longer after a call that left 268 MB of writes
    # behind than after the null candidate: 0.19 ms on this 8.2 ms model (H100); a few % of the median
    # allowed, far inside the verdict's 25%.
    t = good.cand_timing
    assert t["mode"] == "device", t
    assert t["median_ms"] * 0.9 - 0.05 <= t["external_median_ms"] - t["loop_overhead_ms"] <= t["median_ms"] * 1.1 + 0.1, t
    slack = 0.1 + 0.04 * t["median_ms"] + 2 * (t.get("loop_overhead_spread_ms") or 0.0)
    assert t["external_excess_ms"] - t["loop_overhead_ms"] < slack, t


def test_seed_solution_in_both_timing_modes(tmp_path):
    """Issue 29: the LayerNorm seed solution (a 0.26 ms model) is ok in both modes; device timing takes its host
    side out of the median (which moved 0.28-0.32 ms between processes with it counted) and is steady; the
    judge's calibration holds the cover only in device mode."""
    solution = REPO / "solutions" / "layer_norm_16x64x256x256.py"
    reports = {mode: evaluate(LAYER_NORM, [solution], device="cuda", trials=1, perf_trials=50, timeout=500,
                              extensions_dir=str(tmp_path), timing=mode) for mode in ("device", "host")}
    for mode, report in reports.items():
        r = report.results[0]
        assert r.verdict == "ok", (mode, r.message)
        assert report.settings["timing"] == mode
        assert report.baseline.timing_mode == report.baseline.ref_timing["mode"] == r.cand_timing["mode"] == mode
        assert r.speedup and r.speedup > 1, (mode, r.speedup)
    dev, host = (reports[mode].results[0].cand_timing for mode in ("device", "host"))
    assert dev["median_ms"] <= host["median_ms"] * 1.02, (dev, host)
    assert dev["iqr_ms"] <= 0.05 * dev["median_ms"], dev  # issue 29's target
    assert dev["loop_overhead_ms"] > 0.5 > host["loop_overhead_ms"], (dev, host)


def test_side_stream_started_ahead_of_the_cover_gains_nothing():
    """side_stream_no_wait does all its work on a stream that ignores the caller's. Under torch.cuda._sleep's
    one-thread spin that work ran before the start event, unseen by device timing (a small problem: the floor
    check cannot help); the full cover holds every thread slot, so the work starts with the start event and
    is timed in full, in both modes."""
    small = CANDIDATES / "ref_layer_norm_small.py"
    names = ["good_layer_norm", "side_stream_no_wait"]
    for mode in ("host", "device"):
        results = evaluate(small, list(map(cand, names)), device="cuda", trials=2, perf_trials=30, timeout=300,
                           timing=mode).results
        assert results[0].verdict == "ok", (mode, results[0].message)
        if results[1].verdict == "ok":
            assert results[1].cand_ms > 0.7 * results[0].cand_ms, (mode, results[0].cand_ms, results[1].cand_ms)
        if mode == "device":
            assert results[1].cand_timing is None or results[1].cand_timing["mode"] == "device", results[1]


@pytest.mark.slow
def test_a_hundred_candidates_leak_nothing():
    memory_before = gpu_memory_used_mib()
    report = evaluate(CANDIDATES / "ref_layer_norm_small.py", [cand("good_layer_norm")] * 100, device="cuda",
                      trials=1, perf_trials=1, warmup=1, timeout=120)
    assert all(r.verdict == "ok" for r in report.results)
    memory_after = gpu_memory_used_mib()
    if memory_before is not None and memory_after is not None:
        assert memory_after <= memory_before + 256
