"""Cheat that leaves no trace for identity checks: from inside its first timed call (found by walking up the
stack to the evaluator's timing loop) it swaps the clock the loop bound at import - the module globals of
fastnorm.harness.timing - for one that runs three times slow, and puts the original back before the loop ends.
Must be cheating: the judge measures every timed call again with its own clock, in another process."""
import sys

import torch.nn as nn


def _timing_loop():
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_name not in ("_time_host", "_time_cuda"):
        frame = frame.f_back
    return frame


class ModelNew(nn.Module):
    def __init__(self, normalized_shape):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape)
        self.saved = None

    def forward(self, x):
        loop = _timing_loop()
        if loop is not None and "trial" in loop.f_locals:
            self._tamper(sys.modules["fastnorm.harness.timing"], loop.f_locals["trial"], loop.f_locals["trials"])
        return self.ln(x)

    def _tamper(self, timing, trial, trials):
        if trial == 0 and self.saved is None:
            self.saved = (timing._perf_counter, timing._event_elapsed_ms)
            real_clock, real_elapsed = self.saved
            anchor = real_clock()
            timing._perf_counter = lambda: anchor + (real_clock() - anchor) / 3
            calls = [0]

            def elapsed(start, end):  # events are read after the loop: restore after the last one
                calls[0] += 1
                if calls[0] == trials:
                    timing._event_elapsed_ms = real_elapsed
                return real_elapsed(start, end) / 3

            timing._event_elapsed_ms = elapsed
        if trial == trials - 1 and self.saved is not None:
            timing._perf_counter = self.saved[0]
