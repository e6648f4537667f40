"""The process that runs a candidate's code and nothing of the judging: `python -m
fastnorm.harness.candidate_process READ_FD WRITE_FD`, started (candidate_start.py) and driven by the judge
(judge.py) through a pair of pipes (channel.py), the first message its config.

It never sees the reference's outputs: it receives inputs in memory it allocated itself (shared_tensors.py),
runs forward, copies each output into another such buffer for the judge to read, and reports facts the judge
cannot see from outside (an output still changing after return, an output sharing an input's memory). Timing
runs here too, with the clock timing.py bound before the candidate was imported, announcing each timed call to
the judge, which measures it again with its own clock and checks the output of calls it picks at random after
they returned. Before importing the candidate it snapshots every loaded module (tamper.py) and re-checks after
each step; any change is reported as cheating.

Only failures can be reported from here (the judge accepts no `ok` from this process).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

import torch

from fastnorm.harness import checks
from fastnorm.harness.channel import DTYPES, Channel, ProtocolError, decode_value, encode_value
from fastnorm.harness.loading import build_model, import_candidate, load_failure, log_size, resolve_device
from fastnorm.harness.messages import Verdict, clip, describe_exception, exception_message
from fastnorm.harness.shared_tensors import Exporter, contiguous_strides, view
from fastnorm.harness.tamper import ModuleSnapshot
from fastnorm.harness.timing import TrialHooks, call_between_events, synchronize, time_callable

THREAD_JOIN_S = 2.0  # how long to wait for threads a forward started before re-reading its output
_enumerate_threads = threading.enumerate
_monotonic = time.monotonic
_perf_counter = time.perf_counter


class CandidateSide:
    def __init__(self, cfg: dict, channel: Channel):
        self.cfg, self.channel = cfg, channel
        self.device = resolve_device(cfg["device"])
        self.exporter = Exporter(self.device, cfg["share_dir"])
        self.snapshot = None
        self.cls = self.model = None
        self.own_tensors = []       # the model's parameters and buffers: outputs sharing them are not overwritten
        self.groups = {}            # "init" / "inputs" -> tensors over the buffers the judge writes
        self.buffers = {}           # group -> the flat shared buffers (kept alive)
        self.freed_nbytes = []      # sizes of output copies released since the last forward

    # -- protocol ------------------------------------------------------------------------------------------

    def expect(self, kind: str) -> dict:
        message = self.channel.recv()
        if message is None:
            raise SystemExit(0)  # the judge is gone: nothing left to do
        if message["kind"] != kind:
            raise ProtocolError(f"expected {kind!r} from the judge, got {message['kind']!r}")
        return message

    def serve(self) -> None:
        handlers = {"calibrate": self.calibrate, "import": self.import_candidate, "alloc": self.alloc,
                    "build": self.build, "forward": self.forward, "time": self.time}
        self.channel.send("hello")
        while True:
            message = self.channel.recv()
            if message is None or message["kind"] == "quit":
                return
            handler = handlers.get(message["kind"])
            if handler is None:
                raise ProtocolError(f"unknown command {message['kind']!r}")
            handler(message)

    def check_tampering(self, after: str) -> None:
        changes = self.snapshot.changes() if self.snapshot is not None else []
        if changes:
            raise Verdict("cheating", f"the candidate {'; '.join(changes)} (noticed after {after}): code that "
                                      f"rebinds what the evaluator's process runs cannot be timed or trusted")

    # -- commands ------------------------------------------------------------------------------------------

    def calibrate(self, message: dict) -> None:
        """The timing loop around a null candidate, before any candidate code is loaded: what the loop itself
        costs on the judge's clock. The null call waits `wait_ms` (on the host, the same on both clocks) so that
        the judge has fallen asleep by the time the call ends, as it has during a real one.

        In the timing mode of the timed calls (message["include_host"]). Host timing: the device is idle when
        a call is announced (flush, synchronize, then the announcement), so the loop without the flush is the
        same loop. Device timing: the announcement goes out with the L2 flush and the ~1 ms cover spin still
        queued ahead of the start event; the judge's clock sees them, the events do not. So the null candidate
        runs behind the same flush and spin (flush_l2=True), and its excess (judge's time minus reported)
        holds them exactly as a real call's does: with the null call's host wait shorter than the cover, the
        end event fires right after the start event and the judge sees the cover; longer, the reported time
        grows by what the judge sees beyond the cover. Either way excess = cover + the loop's own cost, so the
        verdict (timing_verdict.clock_disagrees: excess - loop overhead) compares like with like."""
        wait_s = float(message["wait_ms"]) * 1e-3
        include_host = bool(message.get("include_host", True))
        stats = time_callable(lambda: _spin(wait_s), device=self.device, trials=int(message["trials"]), warmup=1,
                              flush_l2=self.device.type == "cuda" and not include_host, include_host=include_host,
                              hooks=AnnouncedTrials(self, []))
        self.channel.send("timed", samples_ms=list(stats.samples_ms), tails_ms=list(stats.tails_ms))

    def import_candidate(self, message: dict) -> None:
        self.snapshot = ModuleSnapshot()
        _, self.cls = import_candidate(self.cfg)
        self.check_tampering("importing the candidate")
        self.channel.send("imported")

    def alloc(self, message: dict) -> None:
        """Buffers for a group of tensors the judge will write (init arguments, forward's inputs)."""
        tensors, raws, descriptions = [], [], []
        for spec in message["specs"]:
            raw, description = self.exporter.empty(int(spec["nbytes"]))
            tensors.append(view(raw, DTYPES[spec["dtype"]], spec["size"], spec["stride"], int(spec["offset"])))
            raws.append(raw)
            descriptions.append(description)
        self.groups[message["group"]], self.buffers[message["group"]] = tensors, raws
        self.channel.send("allocated", buffers=descriptions)

    def values(self, form, group: str):
        return decode_value(form, tensor=lambda k: self.groups[group][int(k)])

    def build(self, message: dict) -> None:
        init = self.values(message["init"], "init")
        offset = log_size(self.cfg)
        try:
            self.model = build_model(self.cls, init, self.cfg["seed"], self.device)
        except BaseException as exc:  # a load_inline inside __init__ can fail to build: compile_error then
            raise load_failure(exc, self.cfg, offset, f"constructing {self.cfg['class_name']} raised ") from None
        self.check_tampering(f"constructing {self.cfg['class_name']}")
        if isinstance(self.model, torch.nn.Module):
            self.own_tensors = list(self.model.parameters()) + list(self.model.buffers())
        self.channel.send("built")

    def call(self, args: list):
        with torch.no_grad():
            return self.model(*args)

    def forward(self, message: dict) -> None:
        """One checked call: the output as the caller sees it right after return, handed to the judge."""
        label, args = message["label"], self.values(message["args"], "inputs")
        if self.cfg.get("scrub_freed_memory", True):  # the copies the judge read must not come back as outputs
            checks.scrub_freed_memory(self.device, self.freed_nbytes)
        self.freed_nbytes = []
        threads_before = set(_enumerate_threads())
        try:
            output = call_between_events(lambda: self.call(args), self.device)
        except BaseException as exc:
            raise Verdict("runtime_error", exception_message(exc, self.cfg["candidate"],
                                                             prefix=f"forward raised {label}: ")) from None
        self.hand_over(output, args, label, threads_before)
        self.overwrite_outputs(output, args)
        del output
        if self.device.type == "cuda":
            torch.cuda.empty_cache()  # the judge computes the next trial's reference on the same device

    def overwrite_outputs(self, output, args: list) -> None:
        """Once an output has been returned (and checked), fill it with SCRUB_BYTE: a later call cannot serve the
        same memory again as a fresh result (a cached output, or the block the allocator hands back). Outputs
        that share memory with an input or with the model's own tensors are left alone."""
        if not self.cfg.get("scrub_freed_memory", True):
            return
        keep = [a for a in args if isinstance(a, torch.Tensor)] + self.own_tensors
        for item in checks.flatten_outputs(output):
            if type(item) is torch.Tensor and not any(checks.storages_overlap(item, k) for k in keep):
                checks.overwrite(item)

    def time(self, message: dict) -> None:
        args = self.values(message["args"], "inputs")
        try:
            stats = time_callable(lambda: self.call(args), device=self.device, trials=int(message["trials"]),
                                  warmup=int(message["warmup"]), include_host=bool(message.get("include_host", True)),
                                  hooks=AnnouncedTrials(self, args))
        except (Verdict, ProtocolError, SystemExit):
            raise
        except BaseException as exc:
            raise Verdict("runtime_error", exception_message(exc, self.cfg["candidate"],
                                                             prefix="forward raised while timing: ")) from None
        self.check_tampering("timing")
        self.channel.send("timed", samples_ms=list(stats.samples_ms), tails_ms=list(stats.tails_ms))

    # -- handing outputs to the judge ------------------------------------------------------------------------

    def hand_over(self, output, args: list, label: str, threads_before: set) -> None:
        """Copy each output into a shared buffer now (before waiting for other streams or threads), then wait
        for everything and report which outputs changed meanwhile; the judge reads the copies, then releases."""
        forms, copies, tensors = [], [], []
        try:
            for i, item in enumerate(checks.flatten_outputs(output)):
                if isinstance(item, torch.Tensor):
                    if type(item) is not torch.Tensor:
                        raise Verdict(*subclass_verdict(i, item, label))
                    forms.append(self._copy_out(item, copies, tensors, i))
                else:
                    try:
                        forms.append({"value": encode_value(item)})
                    except ValueError:
                        forms.append({"unsupported": type(item).__qualname__})
            synchronize(self.device)  # device-wide; also surfaces asynchronous kernel faults
            _join_new_threads(threads_before)
            changed = [[i, checks.count_differences(t, copy.to(t.device)), t.numel()] for i, t, copy in tensors
                       if not checks.bitwise_equal(t, copy)]
        except Verdict:
            raise
        except Exception as exc:
            raise Verdict("runtime_error", f"after forward returned {label}: {clip(describe_exception(exc))}")
        aliases = [[i, j] for i, t, _ in tensors for j, a in enumerate(args)
                   if isinstance(a, torch.Tensor) and checks.storages_overlap(t, a)]
        self.check_tampering(f"forward {label}")
        self.channel.send("outputs", outputs=forms, changed=changed, aliases=aliases)
        self.expect("release")
        self.freed_nbytes += _scrub(copies)
        del copies[:], tensors[:]
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.ipc_collect()  # free the blocks the judge has let go of

    def _copy_out(self, t: torch.Tensor, copies: list, tensors: list, i: int) -> dict:
        form = {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}
        if form["dtype"] not in DTYPES:
            return {"tensor": form}  # the judge reports the dtype; nothing to compare
        raw, form["buffer"] = self.exporter.empty(t.numel() * t.element_size())
        copy = view(raw, t.dtype, t.shape, contiguous_strides(t.shape), 0)
        copy.copy_(t.detach())  # stream-ordered after forward's work on the current stream, not other streams
        copies.append(raw)
        tensors.append((i, t, copy))
        return {"tensor": form}


class AnnouncedTrials(TrialHooks):
    """Tells the judge when each timed call starts and ends, and hands it the output of the calls it asks for
    once they have returned (so no call can know whether it will be checked)."""

    def __init__(self, side: CandidateSide, args: list):
        self.side, self.args, self.threads = side, args, set()

    def before_call(self, trial: int) -> None:
        self.threads = set(_enumerate_threads())
        self.side.channel.send("s", trial=trial)

    def after_call(self, trial: int) -> None:
        self.side.channel.send("e", trial=trial)

    def after_trial(self, trial: int, output) -> None:
        if self.side.expect("go").get("check"):
            self.side.hand_over(output, self.args, f"in timed trial {trial} (checked at random)", self.threads)
        self.side.overwrite_outputs(output, self.args)

    def after_warmup(self, output) -> None:
        self.side.overwrite_outputs(output, self.args)


def subclass_verdict(i: int, t: torch.Tensor, label: str) -> tuple[str, str]:
    cls = type(t)
    base = (torch.Tensor, torch._C.TensorBase)
    if any("__torch_dispatch__" in vars(c) for c in cls.__mro__ if c not in base):
        return "cheating", (f"output #{i} {label} is a {cls.__qualname__}, a torch.Tensor subclass with its own "
                            f"__torch_dispatch__: its values would be computed when read, not by forward; outputs "
                            f"must be plain torch.Tensor")
    return "wrong_shape", (f"output #{i} {label} is a {cls.__qualname__} (a torch.Tensor subclass); outputs must be "
                           f"plain torch.Tensor, like the reference's")


def _spin(seconds: float) -> None:
    end = _perf_counter() + seconds
    while _perf_counter() < end:
        pass


def _scrub(buffers: list) -> list:
    """Overwrite the output copies the judge has read, so they cannot come back from the allocator as a later
    call's output; returns their sizes."""
    for buffer in buffers:
        buffer.fill_(checks.SCRUB_BYTE)
    return [buffer.numel() for buffer in buffers]


def _join_new_threads(before: set) -> None:
    deadline = _monotonic() + THREAD_JOIN_S
    for thread in set(_enumerate_threads()) - before:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - _monotonic()))


def main(argv: list[str]) -> None:
    channel = Channel(int(argv[0]), int(argv[1]))
    try:
        cfg = _configure(channel)
        CandidateSide(cfg, channel).serve()
    except SystemExit:
        pass
    except Verdict as v:
        _report(channel, v.verdict, v.message)
    except ProtocolError as exc:
        _report(channel, "runtime_error", f"the candidate's process lost the evaluator's protocol: {exc}")
    except BaseException as exc:
        traceback.print_exc()
        _report(channel, "runtime_error", clip(f"evaluator error in the candidate's process: "
                                               f"{describe_exception(exc)}"))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter/CUDA teardown: a poisoned context can crash or hang there


def _configure(channel: Channel) -> dict:
    """The config the judge sends first (candidate_start.configure_candidate_process), this process started
    before the judge had its job: its folder, its log (stdout and stderr, for tracebacks) and the folder its
    load_inline builds go to."""
    message = channel.recv()
    if message is None:
        raise SystemExit(0)  # a spare judge discarded unused
    if message["kind"] != "config":
        raise ProtocolError(f"expected 'config' from the judge, got {message['kind']!r}")
    with open(message["path"]) as f:
        cfg = json.load(f)
    os.chdir(cfg["home"])
    log = os.open(cfg["log_path"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    if cfg.get("torch_extensions_dir"):
        os.environ["TORCH_EXTENSIONS_DIR"] = cfg["torch_extensions_dir"]
    return cfg


def _report(channel: Channel, verdict: str, message: str) -> None:
    try:
        channel.send("verdict", verdict=verdict, message=message)
    except OSError:
        pass


if __name__ == "__main__":
    main(sys.argv[1:])
