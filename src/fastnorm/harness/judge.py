"""The judge of `fastnorm eval` (the worker's "candidate" mode): it never imports the candidate's code.

It computes the reference's outputs for each trial and keeps them (and copies of the inputs) in its own
memory; starts the candidate in a process of its own (candidate_process.py); writes each trial's inputs into
buffers that process allocated; reads back copies of what forward returned and compares them here. Nothing of
the judge's is ever mapped into the candidate's process, and on Linux the judge makes itself undumpable, so its
memory, open files and pipes are closed to other processes of the same user (ptrace, /proc).

Timing runs in the candidate's process (a clock bound before the candidate loaded), but each timed call is
announced to the judge, which measures it with its own clock: reported times that cannot account for what
the judge saw, less the loop's own cost measured with a null candidate, are cheating (timing_verdict.py). The
judge also checks the outputs of timed calls picked at random after they returned.
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from fastnorm.harness import checks
from fastnorm.harness.candidate_start import StartedCandidate, configure_candidate_process, start_candidate_process
from fastnorm.harness.channel import Channel, ProtocolError, decode_value, dtype_name, encode_value, tensor_leaves
from fastnorm.harness.isolation import file_tail, last_stage
from fastnorm.harness.loading import (REFERENCE_MODULE, Progress, build_model, load_module, make_inputs,
                                      resolve_device, seed_everything, to_device)
from fastnorm.harness.messages import Verdict, process_death
from fastnorm.harness.shared_tensors import contiguous_strides, open_exported, raw_bytes, view
from fastnorm.harness.timing import (DEFAULT_TIMING, TimingStats, _quantile, effective_timing, include_host_for,
                                     synchronize)
from fastnorm.harness.timing_verdict import clock_disagrees

NULL_TRIALS = 10          # calls of the null candidate that measure the timing loop's own cost ...
NULL_WAIT_MS = 1.0        # ... each lasting this long
NULL_ROUNDS = 4           # rounds of NULL_TRIALS calls at most, until half a round's calls were measured ...
NULL_LATE_MS = 0.1        # ... those the judge saw take at least the wait less this (see null_call_measured)
# The clock check below takes a median over the timed calls: of one or two calls, a single scheduling hiccup
# on a loaded host (2.6 ms on a 2-core machine) is enough to call an honest candidate a cheat.
MIN_TIMED_CALLS = 5
CHECKS_PER_TRIALS = 25    # one timed call in this many (at least one) has its output checked, picked at random
FAILURE_VERDICTS = {"compile_error", "load_error", "runtime_error", "wrong_output", "wrong_shape", "cheating"}
_perf_counter = time.perf_counter


@dataclass
class Expected:
    inputs: list             # the trial's inputs as generated: what the candidate is given
    outputs: list            # the reference's outputs for them
    reference_mutates: bool  # the reference itself writes its inputs: then the candidate may too
    reference_aliases: set   # output indices where the reference returns (a view of) an input


def run_judge(cfg: dict, progress: Progress, started: StartedCandidate | None = None) -> dict:
    """started: the candidate's process, when the worker started it before importing torch (worker.main)."""
    if started is None:
        progress("start the candidate's process")
        started = start_candidate_process()
    configure_candidate_process(started, cfg, cfg["device"])
    device = resolve_device(cfg["device"])
    link = CandidateLink(cfg, started, device)
    try:
        progress("import reference")
        ref_mod = load_module(cfg["reference"], REFERENCE_MODULE)
        return _judge(cfg, progress, device, ref_mod, link)
    finally:
        link.close()


# Looks at the timed calls when the clocks disagree, and the pause before each new one (see with_more_looks).
CLOCK_LOOKS = 3
CLOCK_LOOK_PAUSE_S = 1.0


def with_more_looks(timed_calls, progress: Progress, looks: int = CLOCK_LOOKS, pause_s: float = CLOCK_LOOK_PAUSE_S,
                    sleep=time.sleep) -> dict:
    """The timed calls' statistics, timed again (up to `looks` times in all, after a pause) while the clocks
    disagree. A burst of scheduling on a loaded host delays the judge's reads for most of a few calls (two jobs on
    CI's 2 cores: an honest candidate's calls 1.35-1.4 ms longer by the judge's clock, sessions 37 and 44, the
    second time on both of two looks taken back to back) and passes once the burst is over; a candidate that
    tampers with its clock fails every look, and its last timing is the one judged. The calibration is not
    redone: it ran before any candidate code did."""
    timing = timed_calls()
    for look in range(2, looks + 1):
        if not clock_disagrees(timing):
            break
        progress(f"timing again (the clocks disagreed), look {look} of {looks}")
        sleep(pause_s)
        timing = timed_calls()
    return timing


def null_call_measured(seen_ms: float, reported_ms: float, covered: bool) -> bool:
    """Whether a null call's (judge's clock, reported) times measure the loop's cost. The null call waits
    NULL_WAIT_MS on the host between its two announcements, so a judge that saw less read the start late (not
    scheduled in between: both announcements read at once); with device timing on a GPU (covered) the wait
    runs under the cover (L2 flush + ~1.1 ms spin), so a reported time of half the wait or more means the host
    reached the start event only after the cover had run out. Either way the judge's excess misses the cover:
    on a host busy with 8 builds ahead (H200, session 40) one judge's calibration read 0.005 ms, and the honest
    candidate was called a cheat by the whole cover (1.1 ms)."""
    if seen_ms < reported_ms or seen_ms < NULL_WAIT_MS - NULL_LATE_MS:
        return False
    return not covered or reported_ms < NULL_WAIT_MS / 2


def calibrate_loop(link: "CandidateLink", include_host: bool, covered: bool) -> list:
    """The timing loop's cost around a null candidate, sorted (ms a call): rounds of NULL_TRIALS calls, before
    any candidate code is loaded, until half a round's calls were measured (null_call_measured); if no round
    gets there, what was measured, else every call the judge saw take longer than reported. The loop's cost is
    their median, as the timed calls' excess is, and its spread is measured from the lower quartile: not the
    minimum, which one late null call sets (an H100 null call showed 0.0035 ms instead of the cover's ~1.09, and
    the minimum made an honest solution a cheat by the whole cover: tests/test_solve_cuda.py, session 23)."""
    measured, loose = [], []
    for _ in range(NULL_ROUNDS):
        null_ms, null_samples, _ = link.observe_trials("calibrate", NULL_TRIALS,
                                                       {"trials": NULL_TRIALS, "wait_ms": NULL_WAIT_MS,
                                                        "include_host": include_host})
        calls = list(zip(null_ms, null_samples))
        measured += [e - s for e, s in calls if null_call_measured(e, s, covered)]
        loose += [e - s for e, s in calls if e >= s]
        if len(measured) >= NULL_TRIALS // 2:
            break
    return sorted(measured or loose) or [0.0]


def _judge(cfg: dict, progress: Progress, device: torch.device, ref_mod, link: "CandidateLink") -> dict:
    seed, atol, rtol = cfg["seed"], cfg.get("atol"), cfg.get("rtol")
    include_host = include_host_for(cfg.get("timing", DEFAULT_TIMING))
    progress("wait for the candidate's process")
    link.expect("hello")
    progress("calibrate the clock")
    # The null candidate runs in the timed calls' mode: with device timing the judge's clock sees the cover
    # (L2 flush + ~1 ms spin) queued ahead of every start event, so the loop's cost must hold it too
    # (CandidateSide.calibrate says why it then cancels exactly).
    loop_ms = calibrate_loop(link, include_host, covered=device.type == "cuda" and not include_host)
    progress("import candidate")
    link.send("import")
    link.expect("imported")

    progress("construct models")
    seed_everything(seed)
    init_inputs = to_device(list(ref_mod.get_init_inputs()), device)
    ref_model = build_model(ref_mod.Model, init_inputs, seed, device)
    link.send("build", init=link.share("init", init_inputs))
    link.expect("built")

    exp, args = None, None
    max_abs = max_rel = 0.0
    for trial in range(cfg["trials"]):
        what = f"in correctness trial {trial}"
        progress(f"trial {trial}: reference")
        exp = None  # release the previous trial's copies before allocating new ones
        inputs = make_inputs(ref_mod, seed + 1 + trial, device)
        args = link.share("inputs", inputs)  # before the reference runs: it may write its inputs
        exp = expected_outputs(ref_model, inputs, device)
        del inputs
        progress(f"trial {trial}: candidate forward")
        link.send("forward", label=what, args=args)
        reply = link.expect("outputs")
        progress(f"trial {trial}: checks")
        errs = link.check_outputs(reply, exp, atol, rtol, what)
        max_abs, max_rel = max(max_abs, errs[0]), max(max_rel, errs[1])

    progress("timing")
    trials = max(cfg["perf_trials"], MIN_TIMED_CALLS)
    # With a reference that writes its inputs, the timed calls' inputs are not the trial's any more.
    picked = set() if exp.reference_mutates else set(random.SystemRandom().sample(
        range(trials), min(trials, max(1, round(trials / CHECKS_PER_TRIALS)))))

    def timed_calls() -> dict:
        seen_ms, samples, tails = link.observe_trials(
            "time", trials, {"trials": trials, "warmup": cfg["warmup"], "args": args, "include_host": include_host},
            picked,
            lambda what: link.check_outputs(link.expect("outputs"), exp, atol, rtol, what))
        timing = TimingStats.from_samples(samples, tails).to_dict()
        # Over every call, not only those the judge saw take longer: the median of that subset is the
        # median of a few scheduling hiccups on a loaded machine (an honest CPU candidate was called a cheat
        # by 1.5 ms that way while most of its calls took less by the judge's clock than it reported).
        excess = sorted(e - s for e, s in zip(seen_ms, samples))
        loop_median = _quantile(loop_ms, 0.5)
        timing.update(external_median_ms=_quantile(sorted(seen_ms), 0.5),
                      external_excess_ms=_quantile(excess, 0.5) if excess else None,
                      loop_overhead_ms=loop_median, loop_overhead_spread_ms=loop_median - _quantile(loop_ms, 0.25),
                      mode=effective_timing(device, include_host))
        return timing

    timing = with_more_looks(timed_calls, progress)

    # A candidate that behaves only for its first few calls is caught here too: same inputs as the last trial.
    progress("post-timing check")
    if exp.reference_mutates:
        args = link.share("inputs", exp.inputs)
    link.send("forward", label="after timing", args=args)
    link.check_outputs(link.expect("outputs"), exp, atol, rtol, "after timing")
    return {"device": str(device), "verdict": "ok", "message": "", "max_abs_err": max_abs, "max_rel_err": max_rel,
            "timing": timing}


def expected_outputs(ref_model, inputs: list, device: torch.device) -> Expected:
    """Run the reference on the trial's inputs; keep its outputs and the inputs as they were before it ran."""
    saved = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    with torch.no_grad():
        outputs = checks.flatten_outputs(ref_model(*inputs))
    aliases = {i for i, o in enumerate(outputs) if isinstance(o, torch.Tensor)
               and any(isinstance(t, torch.Tensor) and checks.storages_overlap(o, t) for t in inputs)}
    outputs = [o.detach().clone() if i in aliases else o.detach() if isinstance(o, torch.Tensor) else o
               for i, o in enumerate(outputs)]
    mutates = any(isinstance(t, torch.Tensor) and not checks.bitwise_equal(t, s) for t, s in zip(inputs, saved))
    del inputs
    # The reference's temporaries may hold its results: overwrite them before the memory goes back to the
    # driver, where the candidate's process could be handed it.
    checks.scrub_freed_memory(device, [])
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return Expected(inputs=saved, outputs=outputs, reference_mutates=mutates, reference_aliases=aliases)


class CandidateLink:
    """The judge's end of the candidate's process: commands, replies, shared buffers, and its death."""

    def __init__(self, cfg: dict, started: StartedCandidate, device: torch.device):
        self.cfg, self.device, self.folder = cfg, device, cfg["share_dir"]
        self.mapped = {}     # group -> (specs, flat buffers mapped from the candidate's process, tensor views)
        self.reading = []    # output copies mapped for the check under way
        self.proc = started.proc
        self.channel = Channel(started.reply_fd, started.command_fd)

    # -- messages --------------------------------------------------------------------------------------------

    def send(self, kind: str, **fields) -> None:
        try:
            self.channel.send(kind, **fields)
        except OSError:  # its end of the pipe is closed: it died
            raise self.death() from None

    def expect(self, kind: str) -> dict:
        try:
            message = self.channel.recv()
        except ProtocolError as exc:
            raise _broken_protocol(f"{exc} where the judge expected {kind!r}") from None
        if message is None:
            raise self.death()
        if message["kind"] == "verdict":
            verdict, text = message.get("verdict"), message.get("message")
            if verdict not in FAILURE_VERDICTS or type(text) is not str:
                raise _broken_protocol(f"a verdict {str(verdict)[:40]!r} from the candidate's process")
            raise Verdict(verdict, text)
        if message["kind"] != kind:
            raise _broken_protocol(f"{message['kind']!r} where the judge expected {kind!r}")
        return message

    def death(self) -> Verdict:
        """The candidate's process closed its pipe: wait for it and say how it ended."""
        try:
            returncode = self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            returncode = self.proc.wait()
        return Verdict("runtime_error", process_death(returncode, file_tail(Path(self.cfg["log_path"])),
                                                      self.cfg["candidate"], last_stage(Path(self.cfg["progress_path"])),
                                                      "the candidate's process"))

    def close(self) -> None:
        try:
            self.channel.send("quit")
        except OSError:
            pass
        self.channel.close()
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    # -- trials announced by the candidate's process ----------------------------------------------------------

    def observe_trials(self, command: str, trials: int, fields: dict, picked=frozenset(), check=None):
        """Run the candidate's timing loop; returns (the judge's time of each call in ms, the times the
        candidate's process reported, its device tails). Checks the output of the calls in `picked`."""
        self.send(command, **fields)
        seen_ms = []
        for trial in range(trials):
            self._expect_trial("s", trial)
            start = _perf_counter()
            self._expect_trial("e", trial)
            seen_ms.append((_perf_counter() - start) * 1e3)
            self.send("go", check=trial in picked)
            if trial in picked:
                check(f"in timed trial {trial} (checked at random)")
        done = self.expect("timed")
        samples, tails = done.get("samples_ms"), done.get("tails_ms")
        if not (_floats(samples, trials) and _floats(tails, trials if self.device.type == "cuda" else 0)):
            raise _broken_protocol(f"{trials} timings expected, got {str(samples)[:80]}")
        return seen_ms, samples, tails

    def _expect_trial(self, kind: str, trial: int) -> None:
        if self.expect(kind).get("trial") != trial:
            raise _broken_protocol(f"timed call numbers out of order (expected {trial})")

    # -- shared buffers ---------------------------------------------------------------------------------------

    def share(self, group: str, values: list):
        """Write `values`' tensors into buffers of the candidate's process (allocated there when their layout
        is new); returns the form of `values` the candidate decodes."""
        form, tensors = encode_value(list(values), tensor=_numbered([])), tensor_leaves(values)
        specs = [{"dtype": dtype_name(t.dtype), "size": list(t.shape), "stride": list(t.stride()),
                  "offset": t.storage_offset(), "nbytes": t.untyped_storage().nbytes()} for t in tensors]
        if group not in self.mapped or self.mapped[group][0] != specs:
            self.mapped.pop(group, None)
            self.send("alloc", group=group, specs=specs)
            descriptions = self.expect("allocated").get("buffers")
            if type(descriptions) is not list or len(descriptions) != len(specs):
                raise _broken_protocol("a wrong number of buffers")
            raws = [open_exported(d, self.device, self.folder) for d in descriptions]
            views = [view(raw, t.dtype, t.shape, t.stride(), t.storage_offset()) for raw, t in zip(raws, tensors)]
            self.mapped[group] = (specs, raws, views)
        for raw, t in zip(self.mapped[group][1], tensors):
            raw.copy_(raw_bytes(t.to(self.device)))
        synchronize(self.device)
        return form

    # -- checks of one call's outputs --------------------------------------------------------------------------

    def check_outputs(self, reply: dict, exp: Expected, atol, rtol, what: str) -> tuple[float, float]:
        """Read the outputs the candidate's process handed over, check them, release them; (max abs, max rel)."""
        try:
            errs = _check_reply(reply, exp, self, atol, rtol, what)
        except (KeyError, TypeError, ValueError, IndexError, ProtocolError) as exc:
            raise _broken_protocol(f"outputs it could not read ({type(exc).__name__}: {exc})") from None
        finally:
            self.reading.clear()
            synchronize(self.device)
        self.send("release")
        return errs

    def open_output(self, form: dict) -> torch.Tensor:
        shape, dtype = [int(s) for s in form["shape"]], decode_value({"dtype": form["dtype"]})
        raw = open_exported(form["buffer"], self.device, self.folder)
        numel = 1
        for size in shape:
            numel *= size
        if any(size < 0 for size in shape) or numel * torch.empty(0, dtype=dtype).element_size() > raw.numel():
            raise ProtocolError("an output larger than its buffer")
        self.reading.append(raw)
        return view(raw, dtype, shape, contiguous_strides(shape), 0)

    def input_views(self) -> list:
        return self.mapped["inputs"][2] if "inputs" in self.mapped else []


def _check_reply(reply: dict, exp: Expected, link: CandidateLink, atol, rtol, what: str) -> tuple[float, float]:
    """Raise Verdict on the first failed check; return (max abs err, max rel err)."""
    forms, changed, aliases = reply["outputs"], reply["changed"], reply["aliases"]
    if changed:
        i, n, numel = (int(v) for v in changed[0])
        raise Verdict("cheating", f"output #{i} was still being written after forward returned {what} "
                                  f"({n} of {numel} elements changed after a device-wide synchronize): work is "
                                  f"hidden on another stream or thread")
    if len(forms) != len(exp.outputs):
        raise Verdict("wrong_shape", f"forward returned {len(forms)} outputs, the reference {len(exp.outputs)}")
    for i, (form, want) in enumerate(zip(forms, exp.outputs)):
        if isinstance(want, torch.Tensor):
            if "tensor" not in form:
                kind = form.get("unsupported") or type(decode_value(form["value"])).__name__
                raise Verdict("wrong_shape", f"output #{i} is a {kind}, expected a Tensor")
            got = form["tensor"]
            want_dtype = str(want.dtype).replace("torch.", "")
            if list(got["shape"]) != list(want.shape) or got["dtype"] != want_dtype:
                raise Verdict("wrong_shape", f"output #{i} has shape {tuple(got['shape'])} torch.{got['dtype']}, "
                                             f"expected {tuple(want.shape)} {want.dtype}")
    for i, j in aliases:
        if int(i) not in exp.reference_aliases:
            raise Verdict("cheating", f"output #{i} aliases input #{j} (shares its memory) {what}")
    if not exp.reference_mutates:
        for j, (now, before) in enumerate(zip(link.input_views(), tensor_leaves(exp.inputs))):
            if not checks.bitwise_equal(now, before):
                n = checks.count_differences(now, before.to(now.device))
                raise Verdict("cheating", f"forward modified input #{j} in place {what} ({n} of {now.numel()} "
                                          f"elements changed)")
    max_abs = max_rel = 0.0
    for i, (form, want) in enumerate(zip(forms, exp.outputs)):
        if not isinstance(want, torch.Tensor):
            got = decode_value(form["value"]) if "value" in form else form.get("unsupported")
            if got != want:
                raise Verdict("wrong_output", f"output #{i} is {got!r}, expected {want!r}")
            continue
        got = link.open_output(form["tensor"])
        tol_a = atol if atol is not None else checks.default_tolerance(want.dtype)
        tol_r = rtol if rtol is not None else checks.default_tolerance(want.dtype)
        result = checks.compare(got, want, tol_a, tol_r)
        max_abs, max_rel = max(max_abs, result.max_abs_err), max(max_rel, result.max_rel_err)
        if not result.ok:
            message = f"wrong values {what}: " + result.describe(f"output #{i}")
            scrubbed = checks.count_scrub_pattern(got)
            if scrubbed:
                message = (f"output #{i} holds {scrubbed} of {got.numel()} elements of memory the harness had "
                           f"overwritten (freed, or an output already returned: never written by this call - stale, "
                           f"cached or uninitialised) {what}; " + message)
            err = Verdict("wrong_output", message)
            err.max_abs_err, err.max_rel_err = max_abs, max_rel
            raise err
    return max_abs, max_rel


def _broken_protocol(what: str) -> Verdict:
    return Verdict("cheating", f"the candidate's process sent {what}: the evaluator's code there was interfered "
                               f"with")


def _numbered(items: list):
    """A tensor encoder for encode_value: each tensor leaf becomes its index, in traversal order."""
    def number(t):
        items.append(t)
        return len(items) - 1
    return number


def _floats(values, n: int) -> bool:
    return type(values) is list and len(values) == n and all(type(v) in (int, float) for v in values)
