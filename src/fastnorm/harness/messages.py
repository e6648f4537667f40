"""One-line, actionable messages from compiler logs, exceptions, signals and crash logs.

Pure text processing (no torch), so the parent process and the unit tests can use it cheaply.
"""
from __future__ import annotations

import os
import re
import signal
import traceback

MAX_MESSAGE_CHARS = 400

# A compiler/linker diagnostic: gcc "f.cpp:2:22: error: ...", nvcc "f.cu(57): error: ...",
# driver "c++: error: ...", "cc1plus: fatal error: ...", "ptxas fatal   : ...", ld "undefined reference to".
_ERROR_LINE = re.compile(r"(?:\berror\b\s*(?:[A-Z]+\d+\s*)?:|\bfatal\b\s*:|undefined reference to|cannot find -l)",
                         re.IGNORECASE)
# Lines that contain the word "error" but only summarise an earlier one.
_NOT_A_DIAGNOSTIC = re.compile(
    r"(error detected in the compilation|errors? generated|ninja: build stopped|Error building extension"
    r"|^FAILED:|collect2: error: ld returned|subcommand failed|-Werror|error_prefix)", re.IGNORECASE)
_PATH_PREFIX = re.compile(r"(?:^|(?<=\s))(?:/[^\s/:()]+)+/(?=[^\s/:()]+[:(])")


class Verdict(Exception):
    """Ends the evaluation of a candidate with a verdict other than ok."""

    def __init__(self, verdict: str, message: str):
        super().__init__(message)
        self.verdict, self.message = verdict, clip(message)


def first_compiler_error(text: str) -> str | None:
    """The first real error line of a ninja / gcc / nvcc / ld log, with directory prefixes trimmed."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or _NOT_A_DIAGNOSTIC.search(line) or not _ERROR_LINE.search(line):
            continue
        return _PATH_PREFIX.sub("", line)
    return None


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def describe_exception(exc: BaseException) -> str:
    """`TypeError: load_inline() got an unexpected keyword argument 'x'` - type and first line only."""
    name = type(exc).__name__
    head = first_line(str(exc))
    return f"{name}: {head}" if head else name


def location_in_file(exc: BaseException, path: str) -> str | None:
    """`file.py:108 `layer_norm = load_inline(`` - the innermost traceback frame inside `path`, if any."""
    target = os.path.realpath(path)
    hits = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.realpath(f.filename) == target]
    if not hits:
        return None
    frame = hits[-1]
    code = (frame.line or "").strip()
    where = f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return f"{where} `{code}`" if code else where


def exception_message(exc: BaseException, path: str | None = None, prefix: str = "") -> str:
    text = describe_exception(exc)
    where = location_in_file(exc, path) if path else None
    if where:
        text += f" (at {where})"
    return clip(prefix + text)


def signal_description(returncode: int) -> str:
    """`SIGSEGV (Segmentation fault)` for a negative subprocess return code."""
    try:
        sig = signal.Signals(-returncode)
    except ValueError:
        return f"signal {-returncode}"
    desc = signal.strsignal(sig) if hasattr(signal, "strsignal") else None
    return f"{sig.name} ({desc})" if desc else sig.name


_FAULTHANDLER_FRAME = re.compile(r'File "([^"]+)", line (\d+) in (\S+)')


def crash_location(log_text: str, path: str) -> str | None:
    """Innermost frame in `path` from a faulthandler dump (`Fatal Python error: Segmentation fault`)."""
    start = log_text.rfind("Fatal Python error")
    if start < 0:
        return None
    target = os.path.realpath(path)
    for match in _FAULTHANDLER_FRAME.finditer(log_text, start):  # faulthandler lists innermost frame first
        if os.path.realpath(match.group(1)) == target:
            return f"{os.path.basename(match.group(1))}:{match.group(2)} in {match.group(3)}"
    return None


def process_death(returncode: int | None, log_tail: str, path: str, stage: str, who: str = "the worker") -> str:
    """How a process that never reported ended: the signal (and the line of `path` it died at) or exit code."""
    if returncode is not None and returncode < 0:
        where = crash_location(log_tail, path)
        hint = " (out of host memory, or killed by another process?)" if returncode == -9 else ""
        return clip(f"{who} was killed by {signal_description(returncode)}{hint} during {stage}"
                    + (f" at {where}" if where else ""))
    last = last_error_line(log_tail)
    return clip(f"{who} exited with code {returncode} during {stage}" + (f": {last}" if last else ""))


def last_error_line(log_text: str) -> str | None:
    """The last line that looks like a Python exception, e.g. for a worker that died with exit code 1."""
    for line in reversed(log_text.splitlines()):
        line = line.strip()
        if re.match(r"^[\w.]+(Error|Exception|Exit)\b.*", line):
            return line
    return None
