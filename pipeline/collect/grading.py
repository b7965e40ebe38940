"""Answer extraction and grading of model replies (pure functions, no I/O).

Extraction looks for the answer in decreasing order of explicitness: the `answer` field of a JSON object (the format
the ZeroEval prompts ask for), a tagged answer, a boxed answer, a labelled answer ("the answer is ..."), then a
last-resort fallback (last number; for multiple choice only a final line that is a bare letter). Each stage is
scanned from the end of the reply, because models often revise themselves.

Graders: `mcq_letter`, `integer` (read strictly: pipeline/collect/math_values.py), `math_expression` (values
parsed and compared by HF's math-verify, plain numbers exactly in process) and `python_literal` (CRUXEval output
prediction: both sides compared as Python literals with `==`, the semantics of CRUXEval's own `assert f(x) == pred`,
when both parse with `ast.literal_eval`; else as whitespace-trimmed strings).

Degenerate answers: a math answer whose parsed value is nan, a complex or real infinity (`\\frac{1}{0}`,
`\\infty`, `\\log(0)`, `\\csc(0)`, `(-1)!`, `\\pm\\infty`, a set or matrix holding one), a function math-verify
does not know (`\\zeta(1)`), or of a magnitude beyond `MAX_MAGNITUDE` (`(9^{99})^{99}`, `1e309`, `10^{300}+1`), a
math answer math-verify cannot parse at all (`\\tilde\\infty`), an integer answer that is not an integer by the
strict grammar, and a Python literal holding a non-finite float (`1e999`, `[nan]`, `float('inf')`), has no usable
value. Decided on the value, never on the text: it is no answer (extraction gives None; no earlier candidate and
no fallback stand in for it), and it equals and agrees with nothing, itself included. Only an interval's endpoints
may be +-infinity (`(-\\infty, 2]`). A relative tolerance cannot compare such values (inf - inf is nan, and
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
import re
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

from pipeline.collect import math_values
from pipeline.core.errors import RouterLiteError
from pipeline.core.tables import Table

# Bounds that keep sympy fast on pathological replies (huge towers, megabyte expressions).
_SUBSCRIPT_DIGITS = str.maketrans("₀₁₂₃₄₅₆₇₈₉", "0123456789")
MAX_MAGNITUDE = math_values.MAX_MAGNITUDE  # beyond it a value is degenerate (module docstring: why there)

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
    """Raised where math-verify (sympy) would run while `sympy_refused()` is active: the caller must grade in a
    process it can stop (pipeline/collect/bounded.py). Everything before that point is linear in the (capped) text."""


class _NotInteger(Exception):  # noqa: N818 - a signal: the candidate read is no integer
    """Raised by `_integer` on an explicit answer that is no usable integer (its docstring), where a number could
    otherwise be read out of it: the reply has no answer (`extract_answer_with` stops: no other candidate, no
    fallback)."""


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
# a number standing alone in prose: no letter, digit, point, `^`, `_`, `/` or `^{` / `_{` touches it, so no
# number is read out of `2^{1000}`, `1e309`, `1/2`, `42i`, `0x2A` or `1_000_000`
_NUMBER_RE = re.compile(r"(?:(?<![\w)])-)?(?<![\w.^_/])(?<!\^\{)(?<!_\{)\d+(?:\.\d+)?(?![\w^_/]|\.\d)")

_UNITS = (r"(?:square\s+|sq\s+|cubic\s+)?(?:cm|mm|km|meters?|metres?|centimeters?|inches|inch|feet|foot|ft|yards?|"
          r"miles?|units?|degrees?|dollars?|cents?|hours?|minutes?|seconds?|days?|weeks?|months?|years?|mph|"
          r"pounds?|lbs?|kg|grams?|liters?|people|students|ways)")
# what an integer answer may carry glued to its digits (48g, 156kgs, 6th, $25,000/year), read off after normalize_math
# (no spaces left); nothing else is: `42i`, `0x2A`, `2^{10}` are no integers (math_values.strict_integer)
_WORDED_INTEGER_RE = re.compile(r"([-+\u2212]?[\d,]+(?:\.0+)?)\s+[a-zA-Z][a-zA-Z\s'./-]*")  # 18 apples, 5 pounds/day
_CURRENCY_RE = re.compile(r"\\?\$|[€£¥₹]|\\(?:euro|pounds)\b")
_INTEGER_SUFFIX_RE = re.compile(r"(?<=\d)(?:kgs?|g|mg|ml|lbs|st|nd|rd|th|[FC])?"
                                r"(?:/(?:year|yr|month|week|day|hour|hr|minute|min|person|item|unit|kg|lb|pound)s?)?$")
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


def _integer(candidate: str) -> str | None:
    """An explicit answer read as an integer: by the strict grammar (math_values.strict_integer, a unit glued to the
    digits dropped: `48g`), an integer followed by words (`18 apples`), or number-only arithmetic whose exact value
    math-verify finds to be an integer (`\\frac{36}{2}`, `2^{10}`). Anything else (`1/2`, `42i`, `2^{1000}`,
    `(1, 2)`, `\\{1, \\csc(0)\\}`, `2:00 pm`) is the reply's answer and no integer: the reply has none, and no
    stray number elsewhere (the `0` of `\\csc(0)`) stands in for it. Prose (`_math` gives None) is no candidate."""
    text = _math(candidate)
    if text is None or not any(ch.isalnum() for ch in text):  # prose, or a template's placeholder (`___`)
        return None
    text = _CURRENCY_RE.sub("", text).strip()
    worded = _WORDED_INTEGER_RE.fullmatch(text)
    norm = _integer_text(worded.group(1) if worded else text)
    number = math_values.strict_integer(norm)
    if isinstance(number, int):
        return str(number)
    if number is None and isinstance(math_values.plain_number(norm), Fraction):  # 106.12: a number, wrong, kept
        return _canonical_decimal(norm)
    if number is None and norm and math_values.is_arithmetic(norm) and math_values.plain_number(norm) is None:
        _needs_sympy(norm)
        value = math_values.parsed_or_none(norm)
        exact = None if value is None or value is math_values.DEGENERATE else math_values.exact_integer(value)
        if exact is not None:
            return str(exact)
    raise _NotInteger(candidate)


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
    """The last number standing alone in the reply (`_NUMBER_RE`), thousands separators and U+2212 read."""
    clean = text.replace("**", "").replace("\\$", "").replace("$", "").replace("{,}", "")
    clean = clean.replace(math_values.MINUS, "-")
    clean = re.sub(r"(?<=\d),(?=\d{3}\b)", "", clean)  # thousands separators
    numbers = _NUMBER_RE.findall(clean)
    if not numbers:
        return None
    return _canonical_decimal(numbers[-1])


def _canonical_decimal(s: str) -> str | None:
    """A plain number's canonical text ('018' -> '18', '1000.0' -> '1000', '3.50' -> '3.5'); None beyond
    `MAX_MAGNITUDE` or for a runaway digit string."""
    number = math_values.plain_number(s)
    if not isinstance(number, Fraction):
        return None
    if number.denominator == 1:
        return str(number.numerator)
    return format(Decimal(s.replace(",", "").replace(math_values.MINUS, "-")).normalize(), "f")


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
    except _NotInteger:
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
    s = s.replace(math_values.MINUS, "-")  # U+2212 is a minus sign
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


# ------------------------------------------------------------------------------------------ values (math-verify)
def _needs_sympy(latex: str) -> None:
    if _SYMPY_REFUSED.get():
        raise NeedsSympy(latex)


def _clean(s: str) -> str:
    """The answer without dollar signs, a trailing unit (`5 dollars`, `12\\text{ cm}^2`: math-verify would read
    the letters as a product of symbols) and outer spaces."""
    s = _TEXT_UNIT_RE.sub("", s.replace("\\$", "").replace("$", "")).strip()
    return _TRAILING_UNIT_RE.sub("", s).strip()


def _math_value(answer: str):
    """The value of a math answer (pipeline/collect/math_values.py): a plain number in process, else math-verify's
    (`NeedsSympy` under `sympy_refused()`)."""
    number = math_values.plain_number(_clean(answer))
    if number is not None:
        return number
    _needs_sympy(answer)
    return math_values.parsed(_clean(answer))


def math_degenerate(answer: str) -> bool:
    """Whether a MATH-style answer has no usable value (module docstring, "Degenerate answers")."""
    return _math_value(answer) is math_values.DEGENERATE


def math_equal(pred: str, gold: str) -> bool:
    """Equivalence of two MATH-style LaTeX answers: two plain numbers exactly in process, else math-verify on their
    parsed values; an answer without a usable value equals nothing."""
    p, g = _math_value(pred), _math_value(gold)
    if p is math_values.DEGENERATE or g is math_values.DEGENERATE:
        return False
    if isinstance(p, Fraction) and isinstance(g, Fraction):
        if p == g:
            return True
        if p.denominator == g.denominator == 1:  # two integers: exact is math-verify's verdict too
            return False
    _needs_sympy(pred)
    return math_values.verify(math_values.to_sympy(g, _clean(gold)), math_values.to_sympy(p, _clean(pred)))


def _integer_value(answer: str) -> int | None:
    """The integer an answer is, by the strict grammar (math_values.strict_integer) after normalisation (units,
    `\\text{}`, `x =`); None otherwise (a degenerate one too)."""
    n = math_values.strict_integer(_integer_text(answer))
    return n if isinstance(n, int) else None


def _integer_text(answer: str) -> str:
    """An integer answer's text, normalised (normalize_math) and without a unit glued to its digits."""
    return _INTEGER_SUFFIX_RE.sub("", normalize_math(answer), count=1)


def _integer_equal(pred: str, gold: str) -> bool:
    p = _integer_value(pred)
    return p is not None and p == _integer_value(gold)


def _number_degenerate(answer: str) -> bool:
    """A plain number beyond `MAX_MAGNITUDE` (what the integer grader's fallback may read: 400 nines)."""
    return math_values.plain_number(_clean(answer)) is math_values.DEGENERATE


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


_NON_FINITE_NAMES = {"nan": float("nan"), "inf": float("inf"), "infinity": float("inf")}  # any case
_NON_FINITE_MODULES = {"math", "numpy", "np", "torch", "cmath"}


def _printed_value(node: ast.AST):
    """The value of a literal as Python prints one, non-finite floats included: `nan` / `inf` names (`[nan]` is how
    a list holding nan prints), `float('nan')`, `math.inf`; containers, signs and complex sums of them. Raises
    ValueError on anything else (a call of another function, a variable)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name) and node.id.lower() in _NON_FINITE_NAMES:
        return _NON_FINITE_NAMES[node.id.lower()]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in _NON_FINITE_MODULES \
            and node.attr.lower() in _NON_FINITE_NAMES:
        return _NON_FINITE_NAMES[node.attr.lower()]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("float", "complex") \
            and len(node.args) == 1 and not node.keywords and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        return (float if node.func.id == "float" else complex)(node.args[0].value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _printed_value(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):  # 1+2j, inf-nanj
        a, b = _printed_value(node.left), _printed_value(node.right)
        return a + b if isinstance(node.op, ast.Add) else a - b
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_printed_value(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        return [_printed_value(e) for e in (*node.keys, *node.values) if e is not None]
    raise ValueError(f"not a printed literal: {type(node).__name__}")


def _non_finite_printed(text: str) -> bool:
    """Whether `text`, read as Python prints values, holds a non-finite float (`[nan]`, `float('inf')`)."""
    if len(text) > _MAX_LITERAL_CHARS:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            return _non_finite(_printed_value(ast.parse(text, mode="eval").body))
    except Exception:  # noqa: BLE001 - not a literal (SyntaxError, ValueError, RecursionError): no such value
        return False


def literal_degenerate(answer: str) -> bool:
    """A CRUXEval answer without a usable value, decided on its value as Python prints it: a bare inf / nan, a
    literal holding a non-finite float (`1e999`, `[nan]`, `float('nan')`, `{'a': inf}`). Python compares some of
    them (`1e999 == 1e400`: both overflow to inf) and nan equals nothing under CRUXEval's `==`; they cannot be what
    a reply means."""
    return _literal_degenerate(answer.strip(), _py_literal(answer.strip()))


def _literal_degenerate(text: str, value) -> bool:
    return bool(_NON_FINITE_WORD_RE.fullmatch(text)) or _non_finite(value) or \
        (value is _NO_VALUE and _non_finite_printed(text))


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
    # which makes the grader's own comparison symmetric (gold-side conveniences apply to either answer); the integer
    # grader's: both integers by the strict grammar and equal (two agents answering 2.5 to an integer task agree on
    # no integer)
    same: Callable[[str, str], bool] | None = None
    # does an answer have no usable value (module docstring, "Degenerate answers")? It then agrees with nothing,
    # itself included. None: every answer has one
    degenerate: Callable[[str], bool] | None = None

    def agree(self, a: str | None, b: str | None) -> bool:
        """Symmetric equivalence of two extracted answers; a missing or degenerate answer agrees with nothing,
        itself included (decided on its value: identical text is no shortcut past it)."""
        if a is None or b is None or is_empty(a) or is_empty(b):
            return False
        a, b = str(a), str(b)
        if self.degenerate is not None and (self.degenerate(a) or self.degenerate(b)):
            return False
        if self.same is not None:  # the grader's own symmetric test decides, identical text included
            return bool(self.same(a, b))
        if a == b:
            return True
        return bool(self.equal(a, b) or self.equal(b, a))


def _no_letter(answer: str) -> bool:
    """The letter grader's "no usable value": no letter A-J reads out of it."""
    return _letter(answer) is None


def _letter_equal(pred: str, gold: str) -> bool:
    return pred == (_letter(gold) or gold.strip().upper())


GRADER_SPECS: Table[GraderSpec] = Table("grader", {g.name: g for g in [
    GraderSpec("mcq_letter", _letter, _letter_equal, "multiple choice: one letter A-J",
               fallback=_bare_letter_line, degenerate=_no_letter),  # never guess from a stray letter
    GraderSpec("integer", _integer, _integer_equal, "an integer (GSM8K, AIME), read strictly: equal as integers",
               fallback=_last_number, same=_integer_equal, degenerate=_number_degenerate),
    GraderSpec("math_expression", _math, math_equal, "MATH-style LaTeX: equal as values (math-verify)",
               fallback=_last_number, degenerate=math_degenerate),
    GraderSpec("python_literal", _literal_text, literal_equal,  # never guessed from the reasoning
               "CRUXEval output: equal as Python literals, else as trimmed strings", degenerate=literal_degenerate),
    # open-ended replies: no answer to extract, so two replies never agree (a cascade cannot accept on agreement);
    # the collection grades them with a judge agent against a reference reply (pipeline/collect/judge.py)
    GraderSpec("judge", lambda _text: None, lambda _a, _b: False,
               "open-ended: a judge agent's probability that the reply is at least as good as a reference reply",
               same=lambda _a, _b: False),  # identical text included: nothing was extracted to agree on
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
