"""C++ / CUDA source text helpers: comments out, blank lines out, repeated includes out, alignment spaces
out, literals masked for scanning."""
import re


def _literal_end(text: str, start: int) -> int:
    """Index just past the string or character literal that opens at text[start]."""
    quote, i = text[start], start + 1
    while i < len(text) and text[i] != quote:
        i += 2 if text[i] == "\\" else 1
    return i + 1


def _opens_literal(text: str, i: int) -> bool:
    """A string or character literal opens at text[i] (not a digit separator such as 1'000)."""
    c = text[i]
    return c in "\"'" and not (c == "'" and i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_"))


def strip_comments(text: str) -> str:
    """`text` without // and /* */ comments (literals left alone), trailing spaces and blank lines."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if _opens_literal(text, i):
            end = _literal_end(text, i)
            out.append(text[i:end])
            i = end
        elif text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            out.append(" ")
        else:
            out.append(c)
            i += 1
    lines = (line.rstrip() for line in "".join(out).split("\n"))
    return "\n".join(line for line in lines if line) + "\n"


def squeeze_spaces(text: str) -> str:
    """`text` with every run of spaces after a line's first character cut to one (the alignment of macro
    line continuations and of columns) and its indentation a tab a level (two spaces); literals left
    alone. Single-file solutions carry their kernels as text, and the lean solver keeps them under 40 KB."""
    out, i, n, line_start = [], 0, len(text), True
    while i < n:
        c = text[i]
        if _opens_literal(text, i):
            end = min(_literal_end(text, i), n)
            out.append(text[i:end])
            i, line_start = end, False
        elif c == " ":
            j = i
            while j < n and text[j] == " ":
                j += 1
            out.append("\t" * ((j - i) // 2) + " " * ((j - i) % 2) if line_start else " ")
            i = j
        else:
            out.append(c)
            i, line_start = i + 1, c == "\n"
    return "".join(out)


def mask_literals(text: str) -> str:
    """`text` with the inside of every string and character literal replaced by spaces (same length),
    so that braces, semicolons and names in messages do not count as code."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if _opens_literal(text, i):
            end = min(_literal_end(text, i), n)
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:end - 1]) + text[end - 1:end])
            i = end
        else:
            out.append(c)
            i += 1
    return "".join(out)


def drop_repeated_includes(text: str) -> str:
    """`text` without the second and later copies of an `#include <...>` line (headers inlined one after
    another repeat <vector>, <stdint.h>, ...). Only includes outside every conditional count."""
    out, seen, depth = [], set(), 0
    for line in text.split("\n"):
        directive = re.match(r"\s*#\s*(\w+)", line)
        word = directive.group(1) if directive else ""
        if word in ("if", "ifdef", "ifndef"):
            depth += 1
        elif word == "endif":
            depth -= 1
        elif word == "include" and depth == 0 and "<" in line:
            if line.strip() in seen:
                continue
            seen.add(line.strip())
        out.append(line)
    return "\n".join(out)
