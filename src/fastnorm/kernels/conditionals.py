"""Resolve the preprocessor conditionals on symbols whose value a build fixes (what `unifdef` does).

A single-file solution decides FASTNORM_CUDA, FASTNORM_INLINE and the FASTNORM_WANT_* selection
(kernel_set.h) before it writes the kernels down, so `#ifdef FASTNORM_WANT_SPLIT` blocks it does not
want are dropped from the text, and the directives of those it keeps vanish. Conditionals on other
symbols (`__CUDA_ARCH__`, `__AVX2__`) stay as they are, with the known ones inside them resolved. A
condition mixing known and other symbols in a way that leaves its value open is an error: the
compiler would read the dropped symbols as undefined.
"""
import re

_DIRECTIVE = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|elif|else|endif)\b(.*)$")
_TOKEN = re.compile(r"\s*(defined\s*\(\s*\w+\s*\)|defined\s+\w+|&&|\|\||!(?!=)|\(|\)|[^\s()&|!]+|.)")


class ConditionalError(ValueError):
    """A conditional this resolver cannot decide although it names a symbol it knows."""


def resolve(text: str, known: dict) -> str:
    """`text` with every conditional on `known` symbols ({name: defined?}) decided."""
    out = []
    # One frame per open conditional: (kept verbatim?, this branch emitted?, some branch taken?, line)
    stack = []
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        match = _DIRECTIVE.match(line)
        emitting = all(frame[1] for frame in stack)
        if not match:
            if emitting:
                out.append(line)
            continue
        kind, rest = match.group(1), _strip_comment(match.group(2))
        if kind in ("if", "ifdef", "ifndef"):
            condition = {"ifdef": f"defined({rest})", "ifndef": f"!defined({rest})"}.get(kind, rest)
            value = _evaluate(condition, known, number)
            if value is None:
                stack.append([True, True, False, number])
                if emitting:
                    out.append(line)
            else:
                stack.append([False, value, value, number])
        elif kind in ("elif", "else"):
            if not stack:
                raise ConditionalError(f"line {number}: #{kind} without #if")
            frame = stack[-1]
            if frame[0]:  # a verbatim conditional keeps all its branches
                if kind == "elif" and _evaluate(rest, known, number) is not None:
                    raise ConditionalError(f"line {number}: #elif on a known symbol after an undecided #if")
                if all(f[1] for f in stack[:-1]):
                    out.append(line)
                continue
            value = True if kind == "else" else _evaluate(rest, known, number)
            if value is None:
                raise ConditionalError(f"line {number}: #elif {rest} cannot be decided after a decided #if")
            frame[1] = value and not frame[2]
            frame[2] = frame[2] or value
        else:  # endif
            if not stack:
                raise ConditionalError(f"line {number}: #endif without #if")
            frame = stack.pop()
            if frame[0] and all(f[1] for f in stack):
                out.append(line)
    if stack:
        raise ConditionalError(f"line {stack[-1][3]}: #if without #endif")
    return "\n".join(out)


def _strip_comment(text: str) -> str:
    return re.sub(r"//.*$|/\*.*?\*/", "", text).strip()


def _evaluate(condition: str, known: dict, number: int):
    """True / False when the condition's value follows from `known`, None when it does not."""
    tokens = [t for t in _TOKEN.findall(condition) if t.strip()]
    position = 0

    def peek():
        return tokens[position] if position < len(tokens) else None

    def take():
        nonlocal position
        position += 1
        return tokens[position - 1]

    # Three-valued logic: an atom that is not defined(KNOWN) is None (open), and an expression that
    # cannot be parsed as && / || / ! of atoms is open as a whole.
    def atom():
        token = take()
        if token == "!":
            value = atom()
            return None if value is None else not value
        if token == "(":
            value = disjunction()
            if take() != ")":
                raise SyntaxError
            return value
        name = re.fullmatch(r"defined\s*\(?\s*(\w+)\s*\)?", token)
        if name and name.group(1) in known:
            return bool(known[name.group(1)])
        if token in known:
            raise ConditionalError(f"line {number}: {token} is tested by value; test it with defined()")
        # Any other token sequence up to the next && / || / ) is one open atom (`__CUDA_ARCH__ >= 900`).
        while peek() not in (None, "&&", "||", ")"):
            take()
        return None

    def conjunction():
        value = atom()
        while peek() == "&&":
            take()
            other = atom()
            value = False if value is False or other is False else None if value is None or other is None else True
        return value

    def disjunction():
        value = conjunction()
        while peek() == "||":
            take()
            other = conjunction()
            value = True if value is True or other is True else None if value is None or other is None else False
        return value

    mentions = any(re.search(rf"\b{re.escape(name)}\b", condition) for name in known)
    try:
        value = disjunction()
        if position != len(tokens):
            raise SyntaxError
    except (SyntaxError, IndexError):
        value = None
    if value is None and mentions:
        raise ConditionalError(f"line {number}: `{condition}` names a symbol the build fixes, but its value "
                               "stays open")
    return value
