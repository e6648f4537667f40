"""Timings that cannot be honest: work hidden from the events, or faster than moving the bytes at all.

Pure arithmetic on the numbers the workers report (no torch), applied by the parent.
"""
from __future__ import annotations

# A device that stays busy after the end event (median over the timed trials) for this much longer than it did
# after the reference's calls - an idle device answers a synchronize in ~0.01 ms - ran work the events did not
# see ...
HIDDEN_TAIL_MIN_MS = 0.05
HIDDEN_TAIL_FRACTION = 0.25   # ... when the hidden part is also a sizeable fraction of what the events measured

# Below this fraction of the floor (minimal bytes / measured copy bandwidth) a time is impossible. Not 1.0:
# output writes still sitting in L2 when the end event fires let a perfect kernel edge past a full copy.
FLOOR_MARGIN = 0.75


def judge_timing(timing: dict, min_bytes: int, copy_bw: float, floor_check: bool = True,
                 baseline_tail_ms: float = 0.0) -> str | None:
    """A one-line reason to call this timing cheating, or None. baseline_tail_ms: the reference's tail."""
    median = timing["median_ms"]
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
