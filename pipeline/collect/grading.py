"""Answer extraction and grading of model replies (pure functions, no I/O).

Extraction looks for the answer in decreasing order of explicitness: the `answer` field of a JSON object (the format
the ZeroEval prompts ask for), a tagged answer, a boxed answer, a labelled answer ("the answer is ..."), then a
last-resort fallback (last number; for multiple choice only a final line that is a bare letter). Each stage is
scanned from the end of the reply, because models often revise themselves.

Graders: `mcq_letter`, `integer`, `math_expression` (MATH-style equivalence) and `python_literal` (CRUXEval output
prediction: both sides compared as Python literals with `==`, the semantics of CRUXEval's own `assert f(x) == pred`,
when both parse with `ast.literal_eval`; else as whitespace-trimmed strings).

Degenerate answers: an answer whose value is nan, a complex or real infinity (`\\frac{1}{0}`, `\\infty`, `\\log(0)`,
`0\\cdot\\infty`) or of a magnitude beyond `MAX_MAGNITUDE` (`(9^{99})^{99}`), and a Python literal holding a
non-finite float (`1e999`), has no usable value. It is no answer: extraction gives None (no earlier candidate and no
fallback stand in for it), and it equals and agrees with nothing, itself included. Only an interval's or a tuple's
items may be +-infinity (`(-\\infty, 2]`). A relative tolerance cannot compare such values (inf - inf is nan, and
`nan > tol` is False; `tol * inf` is inf), and a reply cannot mean them. Where the bound sits: the largest value among
the bundled golds is 11,111,111,100 (~1.1e10, MATH-500), but replies to a bundled MATH task about f(10^{100}) reach
4*10^{100}, so a bound near a googol would drop meant values; the float comparison holds up to ~1.8e308 (beyond,
values overflow to inf), so 10^300 is the bound: the difference of two bounded values stays finite.

Each grader is one `GraderSpec` row of `GRADER_SPECS` (name -> how one candidate answer is parsed, what the whole
reply falls back to, how the answer is compared with the gold answer, and a description); `grade` and
`extract_answer` dispatch through it. `register_grader(spec)` adds one (docs/architecture.md, "How to add a grader").
"""
from __future__ import annotations

import ast
import cmath
import contextlib
import contextvars
import functools
import re
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from fractions import Fraction

import sympy

from pipeline.core.errors import RouterLiteError
from pipeline.core.tables import Table

# Bounds that keep sympy fast on pathological replies (huge towers, megabyte expressions).
_MAX_SYMPY_CHARS = 200
_MAX_EXPONENT = 100
_MAX_DIGITS = 30
_MAX_NUMBER_CHARS = 400
_SUBSCRIPT_DIGITS = str.maketrans("₀₁₂₃₄₅₆₇₈₉", "0123456789")
_REL_TOL = 1e-9
MAX_MAGNITUDE = 10 ** 300  # beyond it a value is degenerate (module docstring: why there)
_MAX_MAGNITUDE_F = float(MAX_MAGNITUDE)

# an "answer" key of a JSON (or Python-dict style, single-quoted) object
_JSON_KEY_RE = re.compile(r"""(["'])answer\1\s*:\s*""", re.I)
_JSON_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "'": "'", "n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}
_JSON_LITERALS = {"true": "True", "false": "False", "null": "None"}
_MAX_LITERAL_CHARS = 5000
_STRING_SPECIAL = {q: re.compile(r"[\\" + q + "]") for q in "\"'"}  # what ends a run of plain string characters
_TAG_OPEN_RE, _TAG_CLOSE_RE = re.compile(r"<answer>", re.I), re.compile(r"</answer>", re.I)
_NON_SPACE_RE = re.compile(r"\S+")
_FENCE_RE = re.compile(r"^```(?:python)?\s*|(?<!\s)\s*+```$|(?<=\s)```$")  # linear: see _TRAILING_UNIT_RE
# candidates tried per stage (the last ones: a stage is read last-first; JSON keys, tags, boxes, labels), and how far a
# non-string JSON value is scanned: together they bound extraction on any reply (thousands of labels, keys or boxes).
# The bundled recordings hold at most 2 keys, 0 tags, 60 boxes and 137 labels in one reply.
_MAX_CANDIDATES = (16, 16, 64, 256)
_MAX_UNWRAP = 8  # \text{\textbf{...}} levels unwrapped


class NeedsSympy(BaseException):  # noqa: N818 - a signal, not an error: no `except Exception` may swallow it
    """Raised where sympy would evaluate while `sympy_refused()` is active: the caller must grade in a process it can
    stop (pipeline/collect/bounded.py). Everything before that point is linear in the (capped) text."""


class _Degenerate(Exception):  # noqa: N818 - a signal: the candidate read is degenerate
    """Raised by `_integer` on a candidate whose value is degenerate (module docstring), where it would otherwise
    read a number out of it: the reply has no answer (`extract_answer_with` stops: no other candidate, no fallback)."""


_SYMPY_REFUSED = contextvars.ContextVar("sympy_refused", default=False)


@contextlib.contextmanager
def sympy_refused():
    """Within: any sympy evaluation raises `NeedsSympy` instead of running (the in-process fast path)."""
    token = _SYMPY_REFUSED.set(True)
    try:
        yield
    finally:
        _SYMPY_REFUSED.reset(token)
_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*")
# "the answer is (X)", "Answer: X", "Final answer: X", "**Answer:** X", "**Answer**: X"
# possessive quantifiers (`*+`, `++`) keep every pattern below linear on long whitespace/star runs: the runs they
# take cannot be followed by more of the same, so giving back characters never finds another match
_LABEL_RE = re.compile(r"\banswer(?:\s++(?:is|would\s++be|should\s++be)|\s*+\**+\s*+:)[\s*]*+:?[\s*]*+", re.I)
_LETTER_RE = re.compile(r"((?:option|choice)\s+)?([(\[])?([A-J])([)\]])?(?![\w'])", re.I)
_BARE_LETTER_LINE_RE = re.compile(r"^(?:(?:option|choice|answer)\s*+:?\s*+)?[(\[]?([A-J])[)\]]?\.?$")
_NUMBER_RE = re.compile(r"(?:(?<![\w)])-)?\d+(?:\.\d+)?")
_PLAIN_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)")

_UNITS = (r"(?:square\s+|sq\s+|cubic\s+)?(?:cm|mm|km|meters?|metres?|centimeters?|inches|inch|feet|foot|ft|yards?|"
          r"miles?|units?|degrees?|dollars?|cents?|hours?|minutes?|seconds?|days?|weeks?|months?|years?|mph|"
          r"pounds?|lbs?|kg|grams?|liters?|people|students|ways)")
_TEXT_UNIT_RE = re.compile(r"\\(?:text|mbox|mathrm)\{\s*(?:" + _UNITS + r"|m|g|in)\s*\}(?:\^\{?[23]\}?)?")
# a unit at the end, after a digit, a brace or whitespace: a match starts after a digit/brace or at the first or
# second character of a whitespace run (never deeper inside it: the same match, found once, keeps the scan linear)
_TRAILING_UNIT_RE = re.compile(r"(?:(?<=[\d}])|(?<=\s)(?<!\s\s))\s*+" + _UNITS + r"(?:\^\{?[23]\}?)?\s*+$", re.I)
_TEXT_WRAP_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|operatorname)\{([^{}]*)\}")
_VAR_PREFIX_RE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*(?:=|\\in)\s*(?=\S)")
# spacing macros; a LaTeX line break \\ is matched first so that "\\ 2" is not read as "\" + "\ "
_SPACING_RE = re.compile(r"\\\\|\\[!,;: ]")
_DROP_TOKENS = ("\\displaystyle", "\\left", "\\right", "\\bigl", "\\bigr", "\\Bigl", "\\Bigr", "\\$", "$", "\\%",
                "%", "^{\\circ}", "^\\circ", "\\circ", "°")

_FUNCS = {"sqrt": sympy.sqrt, "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan, "log": sympy.log,
          "exp": sympy.exp}
_NON_FINITE_WORDS = {"inf": sympy.oo, "infty": sympy.oo, "infinity": sympy.oo, "nan": sympy.nan}  # in any case
_CONSTS = {"pi": sympy.pi, "oo": sympy.oo, **_NON_FINITE_WORDS}
_ENDPOINTS = {"\\infty": 1, "+\\infty": 1, "-\\infty": -1}  # +-infinity as an interval's or a tuple's item
_LATEX_WORDS = {"pi": "pi", "infty": "oo", "cdot": "*", "times": "*", "div": "/", "sin": "sin", "cos": "cos",
                "tan": "tan", "ln": "log", "log": "log", "exp": "exp"}
_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
           ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b}


def is_empty(text) -> bool:
    return text is None or not str(text).strip()


def grader_spec(grader: str) -> GraderSpec:
    """The table row of `grader`; an unknown name -> one error listing the known graders."""
    return GRADER_SPECS.lookup(grader)


# ---------------------------------------------------------------------------------------------- candidates
def _brace_group(s: str, i: int) -> tuple[str, int] | None:
    """Content of the balanced {...} starting at s[i] and the index after it (None when unbalanced)."""
    depth = 0
    for j in range(i, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return s[i + 1:j], j + 1
    return None


def _brace_pairs(s: str) -> dict[int, int]:
    """Index of each `{` -> index of the `}` that balances it (one linear pass; unbalanced ones are absent), the
    answer `_brace_group` gives for every `{` at once."""
    pairs, stack = {}, []
    for j, ch in enumerate(s):
        if ch == "{":
            stack.append(j)
        elif ch == "}" and stack:
            pairs[stack.pop()] = j
    return pairs


def _boxed_contents(text: str) -> list[str]:
    """Contents of every \\boxed{...} / \\fbox{...} in order; nested braces are matched, not regex-guessed."""
    found, pairs = [], None
    for m in _BOXED_RE.finditer(text):
        i = m.end()
        if text[i:i + 1] == "{":
            pairs = _brace_pairs(text) if pairs is None else pairs
            if i in pairs:
                found.append(text[i + 1:pairs[i]])
        elif i < len(text):  # "\boxed 5": the argument is the next token
            found.append(_NON_SPACE_RE.match(text, i).group(0).rstrip("$."))
    return found


def _tagged(text: str) -> list[str]:
    """Contents of every <answer>...</answer> in order (non-overlapping, the nearest closing tag), in linear time."""
    closes = [m.start() for m in _TAG_CLOSE_RE.finditer(text)]
    found, pos, c = [], 0, 0
    for m in _TAG_OPEN_RE.finditer(text):
        if m.start() < pos:
            continue
        while c < len(closes) and closes[c] < m.end():
            c += 1
        if c == len(closes):
            break
        found.append(text[m.end():closes[c]])
        pos = closes[c] + len("</answer>")
    return found


def _label_candidates(text: str) -> list[str]:
    """Rest of the line after each answer label, in order."""
    found = []
    for m in _LABEL_RE.finditer(text):
        end = text.find("\n", m.end(), m.end() + 200)
        found.append(text[m.end():end if end >= 0 else m.end() + 200])
    return found


def _json_string(text: str, i: int, quote: str) -> str | None:
    """The string literal opening at text[i] (a quote), unescaped tolerantly: a backslash before a letter that starts
    a LaTeX command (\\frac, \\times, \\nu: an escape letter followed by another letter) is kept as written, since
    models often forget to double it; None when the string never closes."""
    out, j = [], i + 1
    special = _STRING_SPECIAL[quote]
    while j < len(text):
        m = special.search(text, j)  # plain characters are copied a run at a time
        if m is None:
            return None
        out.append(text[j:m.start()])
        j = m.start()
        ch = text[j]
        if ch == quote:
            return "".join(out)
        if ch == "\\" and j + 1 < len(text):
            nxt = text[j + 1]
            if nxt == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[j + 2:j + 6]):
                out.append(chr(int(text[j + 2:j + 6], 16)))
                j += 6
                continue
            latex = nxt.isalpha() and text[j + 2:j + 3].isalpha()
            out.append("\\" + nxt if latex or nxt not in _JSON_ESCAPES else _JSON_ESCAPES[nxt])
            j += 2
            continue
        out.append(ch)
        j += 1
    return None


def _json_raw(text: str, i: int) -> str | None:
    """A non-string JSON value at text[i] (number, list, object, true/false/null), up to the `,`, `}` or line end
    that closes it at bracket depth 0; JSON true/false/null read as Python's True/False/None."""
    depth, j, quote = 0, i, None
    stop = min(len(text), i + _MAX_LITERAL_CHARS)
    while j < stop:
        ch = text[j]
        if quote:
            if ch == "\\":
                j += 1
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif depth == 0 and ch in ",\n":
            break
        j += 1
    if j == stop < len(text):  # a value longer than any literal is compared: no answer (and a bounded scan)
        return None
    raw = text[i:j].strip()
    return _JSON_LITERALS.get(raw, raw) or None


def _json_answers(text: str) -> list[str]:
    """The value of every `"answer":` key in the reply, in order: fenced or bare JSON, trailing text allowed, LaTeX
    backslashes tolerated; a single-quoted value is read only after a single-quoted key (a Python-style dict)."""
    found = []
    for m in list(_JSON_KEY_RE.finditer(text))[-_MAX_CANDIDATES[0]:]:
        i = m.end()
        if i >= len(text):
            continue
        quote = text[i] if text[i] in "\"'" else None
        if quote == "'" and m.group(1) != "'":
            quote = None
        value = _json_string(text, i, quote) if quote else _json_raw(text, i)
        if value == "" and quote:
            value = quote * 2  # "answer": "" is the empty string (a CRUXEval output); no other grader accepts it
        if value:
            found.append(value)  # unstripped: a CRUXEval string output may begin or end with spaces
    return found


def _candidates(text: str) -> list[list[str]]:
    """Stages in priority order; each lists its candidates last-first (the last occurrence wins)."""
    tagged = [t.strip() for t in _tagged(text)[-_MAX_CANDIDATES[1]:]]
    tagged = [(_boxed_contents(t) or [t])[-1] for t in tagged]  # a boxed answer inside the tag is the answer
    stages = [_json_answers(text), tagged, _boxed_contents(text), _label_candidates(text)]
    return [stage[-cap:][::-1] for stage, cap in zip(stages, _MAX_CANDIDATES)]


def _strip_markup(s: str) -> str:
    s = _TEXT_WRAP_RE.sub(r"\1", s)
    return s.replace("**", "").replace("$", "").replace("\\(", "").replace("\\)", "").strip()


# ------------------------------------------------------------------------------------------ per-grader parsing
def _letter(candidate: str) -> str | None:
    c = _strip_markup(candidate).lstrip(":").strip()
    m = _LETTER_RE.match(c)
    if not m:
        return None
    prefix, opened, letter, closed = m.groups()
    # a lowercase letter is usually the article "a" ("the answer is a function..."): only accept it marked up
    if letter.islower() and not (prefix or (opened and closed) or m.end() == len(c.rstrip("."))):
        return None
    return letter.upper()


def _bare_letter_line(text: str) -> str | None:
    """The final line when it is nothing but a letter ("C", "(C)", "**C.**"): the only unlabelled letter we trust."""
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    m = _BARE_LETTER_LINE_RE.match(_strip_markup(lines[-1])) if lines else None
    return m.group(1) if m else None


def _canonical_number(s: str) -> str | None:
    """'018' -> '18', '1000.0' -> '1000', '3.50' -> '3.5'; None when s is not a plain number or is beyond
    `MAX_MAGNITUDE`."""
    if len(s) > _MAX_NUMBER_CHARS or not _PLAIN_NUMBER_RE.fullmatch(s):  # a runaway digit string is no answer
        return None
    try:
        d = Decimal(s)
    except InvalidOperation:
        return None
    if abs(d) > MAX_MAGNITUDE:
        return None
    if d == d.to_integral_value():
        return str(int(d))
    return format(d.normalize(), "f")


def _integer(candidate: str) -> str | None:
    candidate = _math(candidate) or ""
    norm = normalize_math(candidate)
    number = _canonical_number(norm)
    if number is not None:
        return number
    if norm and _degenerate_norm(norm):  # no number is read out of it ("\\frac{1}{0}" is not 1)
        raise _Degenerate(candidate)
    exact = _rational_value(norm)  # "\frac{36}{2}" -> 18, without sympy
    if exact is not None:
        value = exact.numerator if exact.denominator == 1 else None
    else:
        value = _sympy_value(norm)
        value = value if value is not None and value.is_Integer else None
    if value is not None:
        return str(value)
    m = _NUMBER_RE.search(_strip_markup(candidate).replace(",", ""))  # "18 apples (since ...)"
    return _canonical_number(m.group(0)) if m else None


def _math(candidate: str) -> str | None:
    """A labelled math answer: the first $...$ / \\(...\\) span if it opens the line, else up to the sentence end."""
    c = candidate.strip().strip("*").strip()
    m = re.match(r"\$\$?(.+?)(?<!\\)\$|\\[(\[](.+?)\\[)\]]", c)  # "\$" inside is a dollar sign
    if m:
        c = m.group(1) or m.group(2)
    else:
        c = re.split(r"(?<!\d)\.(?:\s|$)|\.\s", c, maxsplit=1)[0]
    c = c.strip().rstrip(".").strip()
    if "\\" not in c and len(re.findall(r"[a-zA-Z]{2,}", c)) > 3:  # prose ("Answer: Let's think step by step")
        return None
    return c or None


def _last_number(text: str) -> str | None:
    clean = text.replace("**", "").replace("\\$", "").replace("$", "").replace("{,}", "")
    clean = re.sub(r"(?<=\d),(?=\d{3}\b)", "", clean)  # thousands separators
    numbers = _NUMBER_RE.findall(clean)
    return _canonical_number(numbers[-1]) if numbers else None


_ASSERT_PREFIX_RE = re.compile(r"^(?:assert\s+)?f\(.*\)\s*==\s*", re.S)


def _literal_text(candidate: str) -> str | None:
    """A predicted CRUXEval output as written: code fences/backticks and an `assert f(...) ==` prefix removed; outer
    spaces are kept otherwise (a string output may begin or end with spaces, and the JSON field is itself a string)."""
    c = candidate.strip()
    c = _FENCE_RE.sub("", c).strip().strip("`").strip()
    c = _ASSERT_PREFIX_RE.sub("", c, count=1).strip()
    if c == candidate.strip():
        return candidate if candidate else None
    return c or None


def extract_answer(text: str, grader: str) -> str | None:
    """The answer in `text` as the grader wants it (letter A-J, integer string, raw LaTeX), or None."""
    return extract_answer_with(grader_spec(grader), text)


def extract_answer_with(spec: GraderSpec, text: str) -> str | None:
    """`extract_answer` with the grader's table row in hand (pipeline/collect/bounded.py sends it to a worker)."""
    if is_empty(text):
        return None
    try:
        for stage in _candidates(text):
            for candidate in stage:
                answer = spec.parse(candidate)
                if answer:
                    return _usable(spec, answer)
    except _Degenerate:
        return None
    answer = spec.fallback(text) if spec.fallback is not None else None
    return _usable(spec, answer) if answer else answer


def _usable(spec: GraderSpec, answer: str) -> str | None:
    """The answer, or None when it is degenerate: the reply's answer (read last-first) has no usable value, so the
    reply has none (no earlier candidate, no fallback stands in for it)."""
    return None if spec.degenerate is not None and spec.degenerate(answer) else answer


# ------------------------------------------------------------------------------------------ normalisation
def normalize_math(s: str) -> str:
    """MATH-style canonical string: no spacing/sizing macros, units, degrees, %, \\text wrappers, 'x =' prefix."""
    s = re.sub(r"[₀-₉]+", lambda m: "_" + m.group(0).translate(_SUBSCRIPT_DIGITS), s)  # 1112₃ -> 1112_3 (a base)
    s = _SPACING_RE.sub(lambda m: m.group(0) if m.group(0) == "\\\\" else " ", s.strip())
    for token in _DROP_TOKENS:
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _TEXT_UNIT_RE.sub("", s)
    for _ in range(_MAX_UNWRAP):  # one nesting level a pass; a bound keeps a tower of \text{ linear
        if (unwrapped := _TEXT_WRAP_RE.sub(r"\1", s)) == s:
            break
        s = unwrapped
    s = _TRAILING_UNIT_RE.sub("", s.strip()).strip().rstrip(".").strip()
    s = _VAR_PREFIX_RE.sub("", s)
    s = re.sub(r"\s+", "", s)
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)  # \frac12
    s = re.sub(r"\\sqrt(\d+)", r"\\sqrt{\1}", s)  # \sqrt2
    s = s.replace("{,}", "")
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):  # 1,000 (not a list: groups of exactly 3)
        s = s.replace(",", "")
    s = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", s)  # .5 -> 0.5
    return re.sub(r"^(-?\d+)\.0+$", r"\1", s)  # 18.0 -> 18


def _split_top(s: str, sep: str = ",") -> list[str]:
    """Split on `sep` outside (), [], {}."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(s):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and s.startswith(sep, i):
            parts.append(s[start:i])
            start = i + len(sep)
    return parts + [s[start:]]


# ------------------------------------------------------------------------------------------ LaTeX -> sympy
def _latex_group(s: str, i: int) -> tuple[str, int]:
    """The argument of a macro at s[i]: a balanced {...}, a \\command or one character."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i >= len(s):
        raise ValueError("missing macro argument")
    if s[i] == "{":
        group = _brace_group(s, i)
        if group is None:
            raise ValueError("unbalanced braces")
        return group
    m = re.match(r"\\[a-zA-Z]+", s[i:])
    return (m.group(0), i + m.end()) if m else (s[i], i + 1)


def _latex_to_py(s: str) -> str:
    """Small LaTeX -> Python-expression converter (fractions, roots, pi, powers, a few functions).

    sympy's own parse_latex needs antlr4 4.11 exactly and the environment ships 4.13, so it cannot be used.
    """
    out, i = [], 0
    while i < len(s):
        if s[i] != "\\":
            out.append({"{": "(", "}": ")", "^": "**", "∞": " oo "}.get(s[i], s[i]))
            i += 1
            continue
        m = re.match(r"\\([a-zA-Z]+)", s[i:])
        if not m:
            raise ValueError(f"unsupported LaTeX near {s[i:i + 10]!r}")
        name, i = m.group(1), i + m.end()
        if name == "frac":
            num, i = _latex_group(s, i)
            den, i = _latex_group(s, i)
            out.append(f"(({_latex_to_py(num)})/({_latex_to_py(den)}))")
        elif name == "sqrt":
            index = None
            if s[i:i + 1] == "[":
                j = s.index("]", i)
                index, i = s[i + 1:j], j + 1
            arg, i = _latex_group(s, i)
            arg = _latex_to_py(arg)
            out.append(f"(({arg})**(1/({_latex_to_py(index)})))" if index else f"sqrt({arg})")
        elif name in _LATEX_WORDS:
            out.append(f" {_LATEX_WORDS[name]} ")
        else:
            raise ValueError(f"unsupported LaTeX command \\{name}")
    return "".join(out)


_PY_TOKEN_RE = re.compile(r"\s*(?:(\d+\.?\d*|\.\d+)|([a-zA-Z]+)|(\*\*|[-+*/()]))")


def _py_tokens(py: str) -> list[tuple[str, str]]:
    """(kind, text) tokens; multi-letter names that are not functions/constants become single-letter symbols."""
    tokens, pos = [], 0
    while pos < len(py.rstrip()):
        m = _PY_TOKEN_RE.match(py, pos)
        if not m:
            raise ValueError(f"unsupported characters in {py!r}")
        number, name, op = m.groups()
        if number:
            tokens.append(("num", number))
        elif name in _FUNCS:
            tokens.append(("func", name))
        elif name:
            name = name.lower() if name.lower() in _NON_FINITE_WORDS else name
            tokens += [("name", name)] if name in _CONSTS else [("name", ch) for ch in name]
        else:
            tokens.append(("op", op))
        pos = m.end()
    return tokens


def _explicit_products(py: str) -> str:
    """Insert the '*' that maths leaves implicit ("2x", "3sqrt(2)", ")(", "xy")."""
    out, prev = [], None
    for kind, text in _py_tokens(py):
        left = prev is not None and (prev[0] in ("num", "name") or prev[1] == ")")
        if left and (kind in ("num", "name", "func") or text == "("):
            out.append("*")
        out.append(text)
        prev = (kind, text)
    return " ".join(out)


def _has_pow(node: ast.AST) -> bool:
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) for n in ast.walk(node))


def _build(node: ast.AST, pow_depth: int = 0):
    """sympy expression from a whitelisted AST (no eval of model text).

    Exact powers are what can blow up (10^{10^{10}}), so exponents hold no power and small constants only, and
    powers nest at most two deep in a base: the largest value stays around 10^300000, computed in milliseconds.
    """
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        if isinstance(node.op, ast.Pow):
            if pow_depth >= 2 or _has_pow(node.right) or any(
                    isinstance(n, ast.Constant) and abs(n.value) > _MAX_EXPONENT for n in ast.walk(node.right)):
                raise ValueError("exponent too large to evaluate safely")
            return _build(node.left, pow_depth + 1) ** _build(node.right, pow_depth + 1)
        return _BINOPS[type(node.op)](_build(node.left, pow_depth), _build(node.right, pow_depth))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _build(node.operand, pow_depth)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        text = str(node.value)
        if len(text) > _MAX_DIGITS:
            raise ValueError("number too long")
        return sympy.Rational(text)  # exact: 0.5 == 1/2
    if isinstance(node, ast.Name):
        return _CONSTS[node.id] if node.id in _CONSTS else sympy.Symbol(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS \
            and len(node.args) == 1 and not node.keywords:
        return _FUNCS[node.func.id](_build(node.args[0], pow_depth))
    raise ValueError(f"unsupported expression node {type(node).__name__}")


def _to_sympy(latex: str):
    if len(latex) > _MAX_SYMPY_CHARS:
        raise ValueError("expression too long")
    py = _explicit_products(_latex_to_py(latex))
    tree = ast.parse(py, mode="eval").body
    if _SYMPY_REFUSED.get():
        raise NeedsSympy(latex)
    return _build(tree)


def _sympy_value(latex: str):
    try:
        return _to_sympy(latex)
    except Exception:  # sympy/ast raise many exception types on odd input; unparseable just means "no value"
        return None


_RATIONAL_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Div,
                   ast.USub, ast.UAdd)


def _rational_value(latex: str) -> Fraction | None:
    """The exact value of a number-only expression (numbers, + - * /, signs: what `_build` makes a sympy Rational
    of), as a Fraction, in process and in bounded time; None when sympy must decide (anything else, a constant
    `_build` refuses, a division by zero)."""
    try:
        if len(latex) > _MAX_SYMPY_CHARS:
            return None
        tree = ast.parse(_explicit_products(_latex_to_py(latex)), mode="eval")
        if not all(isinstance(n, _RATIONAL_NODES) for n in ast.walk(tree)):
            return None

        def ev(node) -> Fraction:
            if isinstance(node, ast.Constant):
                text = str(node.value)
                if not isinstance(node.value, (int, float)) or isinstance(node.value, bool) or len(text) > _MAX_DIGITS:
                    raise ValueError(text)
                return Fraction(text)
            if isinstance(node, ast.UnaryOp):
                return -ev(node.operand) if isinstance(node.op, ast.USub) else ev(node.operand)
            return _BINOPS[type(node.op)](ev(node.left), ev(node.right))

        return ev(tree.body)
    except Exception:  # noqa: BLE001 - undecided here: sympy's path says what it says
        return None


def _rational_equal(a: str, b: str) -> bool | None:
    """`_sympy_equal` for two number-only expressions, exactly as sympy decides it (equal values, else floats within
    the relative tolerance; a value beyond `MAX_MAGNITUDE` equals nothing), without sympy; None when it does not
    apply."""
    fa, fb = _rational_value(a), _rational_value(b)
    if fa is None or fb is None:
        return None
    if abs(fa) > MAX_MAGNITUDE or abs(fb) > MAX_MAGNITUDE:
        return False
    if fa == fb:
        return True
    va, vb = float(fa), float(fb)  # both within MAX_MAGNITUDE: finite
    return abs(va - vb) <= _REL_TOL * max(1.0, abs(vb))


def _numeric(expr, subs: dict) -> complex:
    return complex(expr.evalf(30, subs=subs))


def _points(symbols) -> list[dict]:
    """Where a symbolic answer is evaluated: a few arbitrary points (bounded, unlike simplify()/expand())."""
    symbols = sorted(symbols, key=str)
    return [{s: 0.37 + 0.61 * k + 0.13 * j for j, s in enumerate(symbols)} for k in range(3 if symbols else 1)]


def _bounded(v: complex) -> bool:
    """A usable value: finite, of magnitude at most `MAX_MAGNITUDE` (a tolerance compares nothing else)."""
    return cmath.isfinite(v) and abs(v) <= _MAX_MAGNITUDE_F


_NON_FINITE = (sympy.nan, sympy.zoo, sympy.oo, -sympy.oo)


def _degenerate_value(expr) -> bool:
    """nan / zoo / +-oo anywhere in a sympy value, or its value (at the first point, for a symbolic one) unusable."""
    try:
        return expr.has(*_NON_FINITE) or not _bounded(_numeric(expr, _points(expr.free_symbols)[0]))
    except Exception:  # noqa: BLE001 - no finite number comes out (overflow, Python's digit limit): degenerate
        return True


@functools.lru_cache(maxsize=4096)
def _value_degenerate(s: str) -> bool:
    """Whether one normalised item (no list, union or brackets around it) has a degenerate value: a plain number by
    its digits, a number-only expression exactly, else by sympy. An item without a value (LaTeX the converter does
    not read, longer than `_MAX_SYMPY_CHARS`) is not degenerate: it is compared as text. Cached: identical answers
    are checked again by the comparisons that follow an extraction (NeedsSympy is raised, never cached)."""
    if _PLAIN_NUMBER_RE.fullmatch(s):
        return _canonical_number(s) is None
    exact = _rational_value(s)
    if exact is not None:
        return abs(exact) > MAX_MAGNITUDE
    value = _sympy_value(s)
    return value is not None and _degenerate_value(value)


def _degenerate_norm(s: str) -> bool:
    """`math_degenerate` of a normalised answer, split as `math_equal` splits it: any degenerate part (an interval's
    or a tuple's +-infinity items excepted) makes the whole answer degenerate."""
    union = _split_top(s, "\\cup")
    if len(union) > 1:
        return any(map(_degenerate_norm, union))
    if _bracketed(s):
        return any(item not in _ENDPOINTS and _degenerate_norm(item) for item in _split_top(s[1:-1]))
    items = _split_top(s)
    if len(items) > 1:
        return any(map(_degenerate_norm, items))
    return _value_degenerate(s)


@functools.lru_cache(maxsize=4096)
def math_degenerate(answer: str) -> bool:
    """Whether a MATH-style answer has no usable value (module docstring, "Degenerate answers")."""
    if _PLAIN_NUMBER_RE.fullmatch(answer):  # most answers: no normalisation needed
        return _canonical_number(answer) is None
    return _degenerate_norm(normalize_math(answer))


def _sympy_equal(a: str, b: str) -> bool:
    exact = _rational_equal(a, b)  # plain numbers (most answers) need no sympy, nor a grading worker
    if exact is not None:
        return exact
    if _value_degenerate(a) or _value_degenerate(b):
        return False
    ea, eb = _sympy_value(a), _sympy_value(b)
    if ea is None or eb is None:
        return False
    try:
        if ea == eb:
            return True
        for subs in _points((ea - eb).free_symbols):  # compare values, at a few points for symbolic answers
            va, vb = _numeric(ea, subs), _numeric(eb, subs)
            if not (_bounded(va) and _bounded(vb)) or abs(va - vb) > _REL_TOL * max(1.0, abs(vb)):
                return False
        return True
    except Exception:  # noqa: BLE001 - an evaluation that fails: not provably equal
        return False


# ------------------------------------------------------------------------------------------ comparison
def _bracketed(s: str) -> bool:
    return len(s) >= 2 and s[0] in "([" and s[-1] in ")]" and len(_split_top(s[1:-1])) > 1


def math_equal(pred: str, gold: str) -> bool:
    """Equivalence of two MATH-style LaTeX answers: canonical strings, then element-wise, then sympy."""
    p, g = normalize_math(pred), normalize_math(gold)
    if p == g:
        return not _degenerate_norm(p)
    if len(p) > _MAX_SYMPY_CHARS or len(g) > _MAX_SYMPY_CHARS:
        return False
    p_union, g_union = _split_top(p, "\\cup"), _split_top(g, "\\cup")
    if len(p_union) > 1 or len(g_union) > 1:
        return len(p_union) == len(g_union) and all(map(math_equal, p_union, g_union))
    if _bracketed(p) or _bracketed(g):  # tuples and intervals: same brackets, equal elements in order
        if not (_bracketed(p) and _bracketed(g)) or (p[0], p[-1]) != (g[0], g[-1]):
            return False
        p_items, g_items = _split_top(p[1:-1]), _split_top(g[1:-1])
        return len(p_items) == len(g_items) and all(map(_item_equal, p_items, g_items))
    p_items, g_items = _split_top(p), _split_top(g)
    if len(p_items) > 1 or len(g_items) > 1:  # a bare list of solutions: order does not matter
        return len(p_items) == len(g_items) and _match_unordered(p_items, g_items)
    return _sympy_equal(p, g)


def _item_equal(p: str, g: str) -> bool:
    """An interval's or a tuple's items: +-infinity here is an endpoint, equal to the same infinity only."""
    if p in _ENDPOINTS or g in _ENDPOINTS:
        return _ENDPOINTS.get(p) == _ENDPOINTS.get(g)
    return math_equal(p, g)


def _match_unordered(pred_items: list[str], gold_items: list[str]) -> bool:
    remaining = list(gold_items)
    for item in pred_items:
        hit = next((i for i, g in enumerate(remaining) if math_equal(item, g)), None)
        if hit is None:
            return False
        remaining.pop(hit)
    return True


def _integer_equal(pred: str, gold: str) -> bool:
    p, g = _canonical_number(normalize_math(pred)), _canonical_number(normalize_math(gold))
    return p is not None and p == g


_NO_VALUE = object()


def _py_literal(s: str):
    if len(s) > _MAX_LITERAL_CHARS:
        return _NO_VALUE
    try:
        with warnings.catch_warnings():  # "8.50x" makes the parser warn before it fails
            warnings.simplefilter("ignore", SyntaxWarning)
            return ast.literal_eval(s)
    except Exception:  # SyntaxError, ValueError, MemoryError, RecursionError on odd text: not a literal
        return _NO_VALUE


_NON_FINITE_WORD_RE = re.compile(r"[+-]?(?:inf|infinity|nan)", re.I)  # how Python and JSON print them


def _non_finite(value) -> bool:
    """Whether a literal holds a float or complex that is not finite (1e999, -1e999j), at any depth."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (float, complex)) and not cmath.isfinite(v):
            return True
        if isinstance(v, dict):
            stack += [*v.keys(), *v.values()]
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack += v
    return False


def literal_degenerate(answer: str) -> bool:
    """A CRUXEval answer without a usable value: a bare inf / nan, or a literal holding a non-finite float. Python
    compares them (`1e999 == 1e400`: both overflow to inf); they cannot be what a reply means."""
    return _literal_degenerate(answer.strip(), _py_literal(answer.strip()))


def _literal_degenerate(text: str, value) -> bool:
    return bool(_NON_FINITE_WORD_RE.fullmatch(text)) or _non_finite(value)


def literal_equal(pred: str, gold: str) -> bool:
    """CRUXEval outputs: equal as Python literals (`==`) when both parse, else equal as trimmed strings.

    A gold string also matches its bare text, as value or as source between the quotes ('a\\nb' vs a\\nb): the JSON
    `answer` field is itself a string, so `"answer": "abc"` gives the string abc without Python's quotes; and a
    prediction wrapped in one pair of quotes that Python cannot parse ('it's') is compared by what they enclose."""
    p, g = _py_literal(pred.strip()), _py_literal(gold.strip())
    if _literal_degenerate(pred.strip(), p) or _literal_degenerate(gold.strip(), g):
        return False
    if p is not _NO_VALUE and g is not _NO_VALUE:
        try:
            if p == g:
                return True
        except Exception:  # comparisons of exotic literals: fall back to the text
            pass
    if isinstance(g, str):
        quoted = gold.strip()
        forms = {g, quoted[1:-1]} if quoted[:1] in "'\"" else {g}
        s = pred.strip()
        bare = {pred, s[1:-1]} if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"" else {pred}
        if forms & bare:
            return True
    return pred.strip() == gold.strip()


def grade(text: str | None, gold: str, grader: str) -> tuple[str | None, bool]:
    """(extracted answer, correct). An empty reply or one without an extractable answer is never correct."""
    spec = grader_spec(grader)
    extracted = extract_answer(text, grader)
    if extracted is None:
        return None, False
    return extracted, bool(spec.equal(extracted, str(gold)))


# ------------------------------------------------------------------------------------------------ the table
@dataclass(frozen=True)
class GraderSpec:
    """One grader. `parse` reads one explicit candidate (the JSON `answer` field, an <answer> tag, a boxed or a
    labelled answer, tried in that order, last occurrence first) and returns the answer or None; `fallback` reads
    the whole reply when no candidate parses (None: no guessing); `equal(extracted, gold)` is the verdict."""

    name: str
    parse: Callable[[str], str | None]
    equal: Callable[[str, str], bool]
    description: str
    fallback: Callable[[str], str | None] | None = None
    # do two agents' extracted answers say the same thing? (a cascade's agreement test). None: `equal` both ways,
    # which makes the grader's own comparison symmetric (gold-side conveniences apply to either answer)
    same: Callable[[str, str], bool] | None = None
    # does an answer have no usable value (module docstring, "Degenerate answers")? It then agrees with nothing,
    # itself included. None: every answer has one
    degenerate: Callable[[str], bool] | None = None

    def agree(self, a: str | None, b: str | None) -> bool:
        """Symmetric equivalence of two extracted answers; a missing or degenerate answer agrees with nothing."""
        if a is None or b is None or is_empty(a) or is_empty(b):
            return False
        a, b = str(a), str(b)
        if a == b:
            return self.degenerate is None or not self.degenerate(a)
        if self.same is not None:
            return bool(self.same(a, b))
        return bool(self.equal(a, b) or self.equal(b, a))


def _letter_equal(pred: str, gold: str) -> bool:
    return pred == (_letter(gold) or gold.strip().upper())


GRADER_SPECS: Table[GraderSpec] = Table("grader", {g.name: g for g in [
    GraderSpec("mcq_letter", _letter, _letter_equal, "multiple choice: one letter A-J",
               fallback=_bare_letter_line),  # never guess from a stray letter in the reasoning
    GraderSpec("integer", _integer, _integer_equal, "an integer (GSM8K, AIME): equal as canonical numbers",
               fallback=_last_number, degenerate=math_degenerate),
    GraderSpec("math_expression", _math, math_equal, "MATH-style LaTeX: canonical strings, then sympy equivalence",
               fallback=_last_number, degenerate=math_degenerate),
    GraderSpec("python_literal", _literal_text, literal_equal,  # never guessed from the reasoning
               "CRUXEval output: equal as Python literals, else as trimmed strings", degenerate=literal_degenerate),
    # open-ended replies: no answer to extract, so two replies never agree (a cascade cannot accept on agreement);
    # the collection grades them with a judge agent against a reference reply (pipeline/collect/judge.py)
    GraderSpec("judge", lambda _text: None, lambda _a, _b: False,
               "open-ended: a judge agent's probability that the reply is at least as good as a reference reply"),
]})
GRADERS = GRADER_SPECS.keys()  # a live view: a registered grader is known everywhere that checks names


def answers_agree(a: str | None, b: str | None, grader: str) -> bool:
    """Whether two extracted answers are equivalent under `grader` (symmetric; None never agrees)."""
    return grader_spec(grader).agree(a, b)


def register_grader(spec: GraderSpec, replace: bool = False) -> GraderSpec:
    """Add a grader to the table (tasks may then name it in their `grader` column); a name already taken -> error
    unless `replace`."""
    if not isinstance(spec, GraderSpec) or not spec.name or not isinstance(spec.name, str):
        raise RouterLiteError(f"register_grader needs a GraderSpec with a name, got {spec!r}")
    return GRADER_SPECS.register(spec.name, spec, replace=replace)


def graders_restored() -> AbstractContextManager[Table[GraderSpec]]:
    """The grader table as it was on entry, restored on exit (tests that register toy graders)."""
    return GRADER_SPECS.restored()
