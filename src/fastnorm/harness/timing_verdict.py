"""Timings that cannot be honest: a clock that disagrees with the judge's, work hidden from the events, or
faster than moving the bytes at all.

Pure arithmetic on the numbers the workers report (no torch), applied by the parent.
"""
from __future__ import annotations

# A device that stays busy after the end event (median over the timed trials) for this much longer than it did
# after the reference's calls - an idle device answers a synchronize in ~0.01 ms - ran work the events did not
# see ...
HIDDEN_TAIL_MIN_MS = 0.05
HIDDEN_TAIL_FRACTION = 0.25   # ... when the hidden part is also a sizeable fraction of what the events measured

# The judge times every timed call again with its own clock, outside the candidate's process, from the
# announcement that the call starts to the one that it ended: the median over the calls of how much longer it
# saw each call take than the candidate's process reported, less what the loop costs around a null candidate
# (measured the same way before the candidate was loaded), is time the reported numbers do not account for.
# Beyond these margins (plus twice the spread of the loop's cost, for a loaded machine) the clock, or what it
# recorded, was tampered with.
# With device timing ("device" in the timing's mode) the judge sees every call take the cover (L2 flush + ~1 ms
# spin, queued ahead of the start event) longer than the events; the null candidate is timed behind the same
# cover, so the loop's cost holds it and excess - overhead stays near 0 for honest code, whatever the call does
# on the host. It is checked from below too: a cover much shorter than calibrated means the loop itself was
# changed (a shortened spin would otherwise let ~1 ms of cut time through the check above).
CLOCK_SLACK_MS = 0.1
CLOCK_SLACK_FRACTION = 0.25

# Below this fraction of the floor (minimal bytes / measured copy bandwidth) a time is impossible. Not 1.0:
# output writes still sitting in L2 when the end event fires let a perfect kernel edge past a full copy.
FLOOR_MARGIN = 0.75


def judge_timing(timing: dict, min_bytes: int, copy_bw: float, floor_check: bool = True,
                 baseline_tail_ms: float = 0.0) -> str | None:
    """A one-line reason to call this timing cheating, or None. baseline_tail_ms: the reference's tail."""
    median = timing["median_ms"]
    reason = clock_disagrees(timing)
    if reason:
        return reason
    tail = timing.get("device_tail_ms") or 0.0
    hidden = tail - baseline_tail_ms
    if hidden > HIDDEN_TAIL_MIN_MS and hidden > HIDDEN_TAIL_FRACTION * median:
        return (f"the device stayed busy {tail:.3g} ms after forward's end event (median over {timing['trials']} "
                f"trials; {baseline_tail_ms:.2g} ms after the reference's; events measured {median:.3g} ms): work "
                f"is hidden on another stream")
    floor_ms = min_bytes / copy_bw * 1e3 if copy_bw else 0.0
    if floor_check and floor_ms > 0 and median < FLOOR_MARGIN * floor_ms:
        return (f"median {median:.4g} ms is below the physical floor {floor_ms:.4g} ms ({min_bytes / 1e6:.4g} MB of "
                f"inputs + outputs at the measured copy bandwidth {copy_bw / 1e9:.4g} GB/s): it cannot have done "
                f"the work each call (cached or skipped results?); --no-floor-check if the model legitimately "
                f"reads only part of its inputs")
    return None


def clock_disagrees(timing: dict) -> str | None:
    excess = timing.get("external_excess_ms")
    if excess is None:
        return None
    overhead = timing.get("loop_overhead_ms") or 0.0
    median = timing["median_ms"]
    spread = 2 * (timing.get("loop_overhead_spread_ms") or 0.0)
    allowed = CLOCK_SLACK_MS + CLOCK_SLACK_FRACTION * median + spread
    if str(timing.get("mode", "")).startswith("device") and overhead - excess > CLOCK_SLACK_MS + spread:
        return (f"the judge saw each timed call take {overhead - excess:.3g} ms less, beyond what the candidate's "
                f"process reported, than the loop's own cost around a null candidate ({overhead:.3g} ms, the cover "
                f"queued ahead of every call with device timing): the timing loop was tampered with")
    if excess - overhead <= allowed:
        return None
    return (f"the candidate's clock disagrees with the judge's: by the judge's clock (outside the candidate's "
            f"process) each timed call took {excess - overhead:.3g} ms more than the candidate's process reported "
            f"(median over the calls; reported median {median:.4g} ms, the judge's "
            f"{timing.get('external_median_ms', float('nan')):.4g} ms, less the loop's own {overhead:.3g} ms measured "
            f"with a null candidate): the clock, or what it recorded, was tampered with")
