"""Keep the top-level declarations of C++ / CUDA sources that their entry points can reach.

The sources are cut into top-level declarations (inside namespaces too): functions, structs, enums,
variables, `using` lines. Each declares some names and mentions others. Starting from the entry points
and from what is always kept (preprocessor directives, macro invocations such as
FASTNORM_FORWARD_INSTANCE(...), operators, static_asserts), a declaration is kept when a kept one
mentions a name it declares. Every #define stays (the headers included after it may read it:
CPU_CAPABILITY_AVX2 selects at::vec's AVX2 vectors, which no scan of these sources can see) but our own
FASTNORM_* macros, which only these sources read: they are kept like declarations. Names are matched as plain identifiers across
all translation units, so the rule can only keep too much (a member that shares a name with a free
function), never too little for code that compiled before: what a kept declaration uses is kept.
A namespace left without declarations goes too, and so does a conditional the build leaves open
(`#ifdef FASTNORM_CLUSTERS`) when nothing inside it is kept; when something is, so are the names its
directives test.
"""
import re
from dataclasses import dataclass, field
from typing import List, Optional

from fastnorm.kernels.source_text import mask_literals

_IDENT = re.compile(r"[A-Za-z_]\w*")
_MACRO_LINE = re.compile(r"[A-Z_][A-Z0-9_]*\s*(\(.*\))?\s*$")  # FASTNORM_SIMD_BEGIN, X(a, b) alone on a line
_NAMESPACE = re.compile(r"namespace(\s+[A-Za-z_][\w:]*)?\s*\{")
# Words that take parentheses before a function's name (`__launch_bounds__(256) kernel(...)`).
_ATTRIBUTES = {"__launch_bounds__", "__attribute__", "alignas", "__align__", "__declspec", "decltype"}
_QUALIFIERS = {"static", "inline", "constexpr", "extern", "typename", "__host__", "__device__", "__global__",
               "__forceinline__", "C10_ALWAYS_INLINE", "const", "volatile", "friend", "template"}


@dataclass
class Declaration:
    text: str
    names: set
    mentions: set
    always: bool = False
    within: list = field(default_factory=list)  # the open conditionals around it, outermost first


@dataclass
class Namespace:
    head: str  # "namespace fastnorm {"
    items: list = field(default_factory=list)
    tail: str = "}"


@dataclass
class Conditional:
    directives: list  # "#if ...", then each "#elif ..." / "#else", then "#endif"
    branches: list    # the items of each branch
    mentions: set     # names its directives test


def keep_reachable(units: List[str], entry_points) -> List[str]:
    """Each of `units` (translation units whose includes are inlined) cut down to the declarations that
    the `entry_points` (function names) and the always-kept ones reach, in their order."""
    parsed = [_parse(unit, mask_literals(unit), 0, len(unit)) for unit in units]
    declarations = [d for items in parsed for d in _walk(items, [])]
    by_name = {}
    for d in declarations:
        for name in d.names:
            by_name.setdefault(name, []).append(d)
    kept, pending, seen, opened = set(), set(entry_points), set(), set()

    def keep(d):
        kept.add(id(d))
        pending.update(d.mentions - seen)
        for conditional in d.within:
            if id(conditional) not in opened:
                opened.add(id(conditional))
                pending.update(conditional.mentions - seen)

    for d in declarations:
        if d.always:
            keep(d)
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        for d in by_name.get(name, ()):
            if id(d) not in kept:
                keep(d)
    return ["\n".join(_emit(items, kept)) + "\n" for items in parsed]


def _walk(items, within):
    for item in items:
        if isinstance(item, Namespace):
            yield from _walk(item.items, within)
        elif isinstance(item, Conditional):
            for branch in item.branches:
                yield from _walk(branch, within + [item])
        else:
            item.within = within
            yield item


def _emit(items, kept) -> list:
    lines = []
    for item in items:
        if isinstance(item, Namespace):
            inner = _emit(item.items, kept)
            if inner:
                lines += [item.head] + inner + [item.tail]
        elif isinstance(item, Conditional):
            branches = [_emit(branch, kept) for branch in item.branches]
            if any(branches):
                for directive, branch in zip(item.directives, branches):
                    lines += [directive] + branch
                lines.append(item.directives[-1])
        elif id(item) in kept:
            lines.append(item.text)
    return lines


# ----------------------------------------------------------------------------------------------
# Cutting a unit into declarations


def _line_start(text: str, i: int) -> int:
    return text.rfind("\n", 0, i) + 1


def _line_end(text: str, i: int) -> int:
    """End of the (backslash-continued) line holding text[i]."""
    while True:
        end = text.find("\n", i)
        if end < 0:
            return len(text)
        last = end - 1
        while last >= i and text[last] in " \t":
            last -= 1
        if last < i or text[last] != "\\":
            return end
        i = end + 1


def _directive_end(mask: str, i: int, end: int) -> int:
    """End of the directive at i; for #if / #ifdef / #ifndef, of its whole conditional."""
    word = re.match(r"#\s*(\w+)", mask[i:]).group(1)
    stop = _line_end(mask, i)
    if word not in ("if", "ifdef", "ifndef"):
        return stop
    depth = 1
    while depth and stop < end:
        i = stop + 1
        stop = _line_end(mask, i)
        word = re.match(r"\s*#\s*(\w+)", mask[i:stop])
        if word and word.group(1) in ("if", "ifdef", "ifndef"):
            depth += 1
        elif word and word.group(1) == "endif":
            depth -= 1
    return stop


def _matching_brace(mask: str, i: int) -> int:
    """Index of the } that closes the { at mask[i] (directive lines skipped)."""
    depth = 0
    while i < len(mask):
        c = mask[i]
        if c == "#" and mask[_line_start(mask, i):i].strip() == "":
            i = _line_end(mask, i)
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise ValueError("unbalanced braces")


def _declaration_end(mask: str, i: int, end: int) -> int:
    """End of the declaration that starts at i: its `;` at depth 0, or the } closing its body (with a
    `;` right after it, as a struct's)."""
    depth = 0
    while i < end:
        c = mask[i]
        if c == "#" and mask[_line_start(mask, i):i].strip() == "":
            i = _line_end(mask, i)
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
            if depth == 0 and c == "}":
                after = re.match(r"\s*;", mask[i + 1:end])
                return i + 1 + (after.end() if after else 0)
        elif c == ";" and depth == 0:
            return i + 1
        i += 1
    raise ValueError(f"declaration without an end: {mask[i - 200:i]!r}")


def _parse(text: str, mask: str, start: int, end: int) -> list:
    items, i = [], start
    while True:
        while i < end and mask[i].isspace():
            i += 1
        if i >= end:
            return items
        begin = _line_start(mask, i)
        if mask[begin:i].strip():  # another declaration ended on this line: start right here
            begin = i
        line = mask[i:_line_end(mask, i)]
        if mask[i] == "#":
            stop = _directive_end(mask, i, end)
            if re.match(r"#\s*if", mask[i:]):
                items.append(_conditional(text, mask, begin, stop))
            else:
                items.append(_directive(text[begin:stop], mask[i:stop]))
        elif _NAMESPACE.match(mask, i) and "=" not in mask[i:mask.index("{", i)]:
            brace = mask.index("{", i)
            close = _matching_brace(mask, brace)
            head = text[begin:brace + 1]
            items.append(Namespace(head, _parse(text, mask, brace + 1, close)))
            stop = _line_end(mask, close)
            items[-1].tail = text[_line_start(mask, close):stop].strip() or "}"
        elif _MACRO_LINE.fullmatch(line.strip()) and not line.rstrip().endswith((";", "{", ",")):
            stop = _line_end(mask, i)
            items.append(Declaration(text[begin:stop], set(), set(_IDENT.findall(mask[i:stop])), always=True))
        else:
            stop = _declaration_end(mask, i, end)
            items.append(_declaration(text[begin:stop], mask[i:stop]))
        i = stop


def _conditional(text: str, mask: str, begin: int, stop: int):
    """The conditional text[begin:stop] (#if ... #endif) with its branches parsed."""
    directives, bounds, depth, i = [], [], 0, begin
    while i < stop:
        end = _line_end(mask, i)
        word = re.match(r"\s*#\s*(\w+)", mask[i:end])
        word = word.group(1) if word else ""
        if word in ("if", "ifdef", "ifndef"):
            depth += 1
        if depth == 1 and word in ("if", "ifdef", "ifndef", "elif", "else", "endif"):
            directives.append(text[i:end].strip())
            bounds.append((i, end))
        if word == "endif":
            depth -= 1
        i = end + 1
    mentions = set(_IDENT.findall(" ".join(mask[a:b] for a, b in bounds))) - {"if", "ifdef", "ifndef", "elif",
                                                                               "else", "endif", "defined"}
    try:
        branches = [_parse(text, mask, bounds[k][1], bounds[k + 1][0]) for k in range(len(bounds) - 1)]
    except ValueError:  # not a sequence of whole declarations: kept as it is
        return Declaration(text[begin:stop], set(), set(_IDENT.findall(mask[begin:stop])), always=True)
    return Conditional(directives, branches, mentions)


_OWN_DEFINE = re.compile(r"#\s*define\s+(FASTNORM_\w+)")


def _directive(text: str, mask: str) -> Declaration:
    """Directives stay, but our own macros (FASTNORM_*): only these sources read them, so each is kept like a
    declaration, when a kept one mentions it (FASTNORM_RESIDUAL_NOT_FUSED goes where no residual call is)."""
    mentions = set(_IDENT.findall(mask))
    own = _OWN_DEFINE.match(mask)
    if own:
        return Declaration(text, {own.group(1)}, mentions - {own.group(1), "define"})
    return Declaration(text, set(), mentions, always=True)


def _declaration(text: str, mask: str) -> Declaration:
    mentions = set(_IDENT.findall(mask))
    names = _declared_names(mask)
    if names is None:
        return Declaration(text, set(), mentions, always=True)
    return Declaration(text, names, mentions - names)


def _skip_template_heads(mask: str) -> str:
    """The declaration after its `template <...>` heads. As C++ reads them: `>=`, `<=` and `<<` in a default
    argument are operators, and so is anything in parentheses; the first other `>` at the list's depth ends it."""
    while True:
        head = re.match(r"\s*template\s*<", mask)
        if not head:
            return mask
        depth, parens, i = 1, 0, head.end()
        while i < len(mask) and depth:
            c = mask[i]
            if c in "([{":
                parens += 1
            elif c in ")]}":
                parens -= 1
            elif parens == 0 and mask.startswith((">=", "<=", "<<"), i):
                i += 1
            elif parens == 0:
                depth += {"<": 1, ">": -1}.get(c, 0)
            i += 1
        mask = mask[i:]


def _declared_names(mask: str) -> Optional[set]:
    """Names the declaration introduces; None when it is to be kept whatever it declares."""
    body = _skip_template_heads(mask)
    words = _IDENT.findall(body)
    if not words or words[0] in ("static_assert", "asm") or re.search(r"\boperator\b", body.split("{")[0]):
        return None
    lead = [w for w in words if w not in _QUALIFIERS]
    if words[0] == "using":
        if len(words) > 1 and words[1] == "namespace":
            return None
        alias = re.match(r"\s*using\s+(\w+)\s*=", body)
        return {alias.group(1)} if alias else {words[-1]}
    if words[0] == "typedef":
        return {words[-1]}
    if lead and lead[0] in ("struct", "class", "union", "enum"):
        head = body.split("{")[0]
        while re.search(r"\([^()]*\)", head):  # attributes' arguments out: alignas(sizeof(T) * VEC)
            head = re.sub(r"\([^()]*\)", " ", head)
        name = re.search(rf"\b{lead[0]}\s+(?:(?:class|struct|alignas|__align__)\s+)*([A-Za-z_]\w*)", head)
        names = {name.group(1)} if name else set()
        if lead[0] == "enum" and "{" in body:
            names |= set(_IDENT.findall(body[body.index("{"):]))
        return names or None
    return _function_or_variable_names(body)


def _function_or_variable_names(body: str) -> Optional[set]:
    depth, i = 0, 0
    while i < len(body):
        c = body[i]
        if c in "{;=" and depth == 0:
            break
        if c == "(" and depth == 0:
            name = _name_before(body, i)
            if name in _ATTRIBUTES:
                i = _close_paren(body, i)
                continue
            return {name} if name else None
        depth += 1 if c in "([" else -1 if c in ")]" else 0
        i += 1
    # A variable (or several): the last name of each declarator before its initializer.
    head = body[:_statement_end(body)]
    names = set()
    for part in _split_top_level(head):
        declarator = re.split(r"[=\[{]", part, maxsplit=1)[0]
        found = _IDENT.findall(declarator)
        if found:
            names.add(found[-1])
    return names or None


def _top_level(text: str, char: str):
    """Indices of `char` outside any (), [] or {} in text."""
    depth = 0
    for i, c in enumerate(text):
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == char and depth == 0:
            yield i


def _statement_end(body: str) -> int:
    return next(_top_level(body, ";"), len(body))


def _split_top_level(text: str) -> list:
    cuts = [-1, *_top_level(text, ","), len(text)]
    return [text[a + 1:b] for a, b in zip(cuts, cuts[1:])]


def _close_paren(text: str, i: int) -> int:
    depth = 0
    for j in range(i, len(text)):
        depth += {"(": 1, ")": -1}.get(text[j], 0)
        if depth == 0:
            return j + 1
    return len(text)


def _name_before(text: str, i: int) -> Optional[str]:
    """The identifier before text[i] (a `(`), past explicit template arguments (`dtype_of<float>(`)."""
    j = i - 1
    while j >= 0 and text[j].isspace():
        j -= 1
    if j >= 0 and text[j] == ">":
        depth = 0
        while j >= 0:
            depth += {">": 1, "<": -1}.get(text[j], 0)
            j -= 1
            if depth == 0:
                break
        while j >= 0 and text[j].isspace():
            j -= 1
    end = j + 1
    while j >= 0 and (text[j].isalnum() or text[j] == "_"):
        j -= 1
    name = text[j + 1:end]
    return name if _IDENT.fullmatch(name or "") else None
