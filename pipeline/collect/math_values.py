"""What a math answer is worth: HF's math-verify parses it (LaTeX or plain expression -> sympy) and decides whether
two values are equivalent; this module keeps the project's policy on top (pipeline/collect/grading.py calls it).

- Plain numbers never reach math-verify: `plain_number` reads them exactly (Fraction), in process, without sympy.
- Integers are read strictly (`strict_integer`): an optional sign (ASCII `-` / `+` or U+2212 `−`), then ASCII digits,
  either plain or grouped by thousands with commas (`1,600`: GSM8K golds and replies write money and counts that
  way, and a comma-separated list never groups by exactly three digits after a 1-3 digit head), then optionally a
  zero fraction (`18.00`: money; its value is the integer exactly). Nothing else is an integer, and no number is
  read out of a longer text (`2^{1000}`, `1e309`, `1/2`, `42i`, `0x2A`, `1_000_000`).
- A value without use (`unusable`): nan, complex infinity, +-infinity anywhere (an interval's endpoints excepted),
  a function at a pole (`\\csc(0)`, `\\Gamma(0)`, `(-1)!`, `\\log_{1}(5)`: their evaluated form is zoo), a
  function math-verify does not know (`\\zeta(1)`: no value at all), a magnitude beyond `MAX_MAGNITUDE`
  (`10^{10^{10}}`, `1e309`, `10^{300}+1`), inside sets, tuples, matrices and equations too. It is decided on the
  parsed value; text math-verify cannot parse (`\\tilde\\infty`, `\\infin`) has no value either. Such an answer
  agrees with nothing, itself included.
- math-verify's own timeouts use SIGALRM (whole seconds, main thread only, and a signal cannot stop C code such as
  an exact power); they are off here (`parsing_timeout=None`, `timeout_seconds=None`). What calls sympy runs in the
  project's bounded worker instead (pipeline/collect/bounded.py: a process killed past the budget), which bounds C
  code too and works from any thread. `needs_sympy()` tells the in-process fast path where to stop.
"""
from __future__ import annotations

import cmath
import functools
import logging
import re
from decimal import Decimal, InvalidOperation
from fractions import Fraction

MAX_MAGNITUDE = 10 ** 300  # beyond it a value is degenerate (grading.py's module docstring: why there)
_MAX_MAGNITUDE_F = float(MAX_MAGNITUDE)
MAX_CHARS = 1000  # longer LaTeX is not parsed: no value (math-verify's regexes and sympy stay fast)
_MAX_NUMBER_CHARS = 400
_EXACT_DIGITS = 320  # enough digits to compare a value near MAX_MAGNITUDE with it exactly
MINUS = "\u2212"

_SIGN = r"[-+\u2212]?"
_DIGITS = r"(?:\d{1,3}(?:,\d{3})+|\d+)"
_INTEGER_RE = re.compile(_SIGN + _DIGITS + r"(?:\.0+)?", re.ASCII)
_PLAIN_RE = re.compile(_SIGN + r"(?:" + _DIGITS + r"(?:\.\d*)?|\.\d+)(?:[eE][-+\u2212]?\d{1,6})?", re.ASCII)
_SCIENTIFIC_RE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?|\.\d+)[eE]([-+\u2212]?\d+)(?![\w.])", re.ASCII)
# number-only arithmetic (digits, + - * / ^, braces, \frac, \sqrt, \cdot, \times): its value may be an integer
_ARITHMETIC_RE = re.compile(r"(?:[\d\s+\-*/^(){}]|\\d?frac|\\sqrt|\\cdot|\\times|\\left|\\right)+", re.ASCII)


class Degenerate:
    """The value of an answer that has none (module docstring): agrees with nothing."""

    def __repr__(self) -> str:
        return "DEGENERATE"


DEGENERATE = Degenerate()


def _ascii_signs(s: str) -> str:
    return s.replace(MINUS, "-")


def plain_number(s: str) -> Fraction | Degenerate | None:
    """The exact value of a plain decimal number (`-12`, `1,600`, `3.50`, `.5`, `1e-3`), DEGENERATE beyond
    `MAX_MAGNITUDE` (`1e309`, 400 nines), None when `s` is not one."""
    s = s.strip()
    if len(s) > _MAX_NUMBER_CHARS or not _PLAIN_RE.fullmatch(s):
        return None
    try:
        d = Decimal(_ascii_signs(s).replace(",", ""))
    except InvalidOperation:
        return None
    if not d.is_finite() or abs(d) > MAX_MAGNITUDE:
        return DEGENERATE
    return Fraction(d)


def strict_integer(s: str) -> int | Degenerate | None:
    """The integer `s` is by the strict grammar (module docstring), DEGENERATE beyond `MAX_MAGNITUDE`, else None."""
    s = s.strip()
    if len(s) > _MAX_NUMBER_CHARS or not _INTEGER_RE.fullmatch(s):
        return None
    value = plain_number(s)
    return value if value is DEGENERATE else int(value)


def is_arithmetic(s: str) -> bool:
    """Whether `s` is number-only arithmetic, the one form besides the strict grammar whose integer value an
    integer answer may be (`\\frac{36}{2}`, `2^{10}`)."""
    return bool(_ARITHMETIC_RE.fullmatch(s)) and any(ch.isdigit() for ch in s)


# ---------------------------------------------------------------------------------------------- math-verify
@functools.cache
def _mv():
    """math-verify, imported on first use (sympy and antlr cost a second), its timeout warnings off: the timeouts
    are off on purpose (module docstring)."""
    import math_verify
    from math_verify import grader as mv_grader
    from math_verify import parser as mv_parser

    mv_grader.TIMEOUT_WARNING_SHOWN = mv_parser.TIMEOUT_WARNING_SHOWN = True
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)  # "Error during comparison" on odd text: a False verdict
    return math_verify


_DIGIT_GROUP_RE = re.compile(r"(?<=\d)\s*\\[!,]\s*(?=\d{3}(?!\d))")
_SUBSCRIPT_RE = re.compile(r"[₀-₉]+")
_SUBSCRIPT_DIGITS = str.maketrans("₀₁₂₃₄₅₆₇₈₉", "0123456789")
_ROOT_SIGN_RE = re.compile(r"√\s*(\d+(?:\.\d+)?|[a-zA-Z]|\(([^()]*)\))")
_PLAIN_FUNC_RE = re.compile(r"(?<![\\a-zA-Z])(sqrt|log|ln|sin|cos|tan|exp|pi)(?![a-zA-Z])")
_PLAIN_SQRT_RE = re.compile(r"\\sqrt\s*\(([^()]*)\)")
_INFINITY_WORD_RE = re.compile(r"(?<![\\a-zA-Z])(?:infinity|infty|inf)(?![a-zA-Z])", re.I)
_NAN_WORD_RE = re.compile(r"(?<![\\a-zA-Z])nan(?![a-zA-Z])", re.I)
_PLAIN_SYMBOLS = {"π": "\\pi ", "∞": "\\infty ", "·": "\\cdot ", "×": "\\times "}


def _prepared(latex: str) -> str:
    """What math-verify is given: the answer between `$`s, and what its LaTeX grammar would misread written as
    LaTeX: U+2212 as `-`, `1e309` as `1\\times10^{309}` (LaTeX reads `e` as Euler's number), a base's subscript
    digits (`1112₃` -> `1112_{3}`), plain-text maths (`6√2`, `2 * sqrt(5)`, `log(3)`, `π`) and the words
    `infinity` / `inf` (as `\\infty`) and `NaN` (as `\\frac{0}{0}`, its value), which it would read as products of
    letters."""
    s = _ascii_signs(latex).replace("\\$", "").replace("$", "").strip()
    s = _DIGIT_GROUP_RE.sub("", s)  # 1\!000, 1\,000: one number
    s = _SCIENTIFIC_RE.sub(lambda m: f"{m.group(1)}\\times10^{{{m.group(2)}}}", s)
    s = _SUBSCRIPT_RE.sub(lambda m: "_{" + m.group(0).translate(_SUBSCRIPT_DIGITS) + "}", s)
    for symbol, macro in _PLAIN_SYMBOLS.items():
        s = s.replace(symbol, macro)
    s = _ROOT_SIGN_RE.sub(lambda m: "\\sqrt{" + (m.group(2) if m.group(2) is not None else m.group(1)) + "}", s)
    s = _PLAIN_FUNC_RE.sub(r"\\\1", s)
    s = _PLAIN_SQRT_RE.sub(r"\\sqrt{\1}", s)
    s = _INFINITY_WORD_RE.sub(r"\\infty ", s)
    s = _NAN_WORD_RE.sub(r"\\frac{0}{0}", s)
    return f"${s}$"


@functools.lru_cache(maxsize=4096)
def parsed_or_none(latex: str):
    """math-verify's value of one answer (a sympy object); DEGENERATE when it is `unusable`; None when math-verify
    cannot parse it (or it is longer than `MAX_CHARS`). Cached: an extracted answer is compared again right after.
    Needs sympy (the worker)."""
    if len(latex) > MAX_CHARS:
        return None
    mv = _mv()
    got = mv.parse(_prepared(latex), extraction_config=[mv.LatexExtractionConfig()], fallback_mode="no_fallback",
                   parsing_timeout=None)
    if not got or isinstance(got[0], str):
        return None
    return DEGENERATE if unusable(got[0]) else got[0]


def parsed(latex: str):
    """`parsed_or_none`, where an answer without a value is DEGENERATE too (it agrees with nothing)."""
    v = parsed_or_none(latex)
    return DEGENERATE if v is None else v


def exact_integer(v) -> int | None:
    """The integer a usable parsed value is exactly (`\\frac{36}{2}`, `2^{10}`), else None."""
    import sympy

    if not isinstance(v, sympy.Expr) or v.free_symbols:
        return None
    try:
        v = v.doit()  # bounded: a usable value is at most MAX_MAGNITUDE
    except Exception:  # noqa: BLE001 - no exact value
        return None
    return int(v) if isinstance(v, sympy.Integer) else None


def value(latex: str):
    """The value of a math answer: a Fraction for a plain number (no sympy), DEGENERATE, or math-verify's sympy
    value (`parsed`)."""
    number = plain_number(latex)
    return number if number is not None else parsed(latex)


def _point(symbols) -> dict:
    return {s: 0.37 + 0.13 * i for i, s in enumerate(sorted(symbols, key=str))}


def _expr_unusable(e) -> bool:
    import sympy
    from sympy.core.function import AppliedUndef

    bad = (sympy.nan, sympy.zoo, sympy.oo, -sympy.oo)
    if e.has(*bad) or e.atoms(AppliedUndef):
        return True
    e = e.xreplace({u: u.args[0] for u in e.atoms(sympy.UnevaluatedExpr)})  # 10\% is 10*UnevaluatedExpr(1/100)
    try:  # magnitude first, by evalf (mpmath: 10^{10^{10}} costs nothing), never by exact evaluation
        point = _point(e.free_symbols)
        v = complex(e.evalf(30, subs=point))
        if not cmath.isfinite(v) or abs(v) > _MAX_MAGNITUDE_F:
            return True
        if abs(v) > _MAX_MAGNITUDE_F / 10:  # near the bound, 30 digits cannot tell 10^{300}+1 from 10^{300}
            return bool(sympy.Abs(e.evalf(_EXACT_DIGITS, subs=point)) > sympy.Integer(MAX_MAGNITUDE))
        return e.doit().has(*bad)  # bounded now: a function at a pole evaluates to zoo (\sec(\pi/2) evalf: 1e34)
    except Exception:  # noqa: BLE001 - no number comes out (a pole evalf refuses, overflow): no value
        return True


def unusable(v) -> bool:
    """Whether a parsed value has no use (module docstring): recursively through sets, intervals, tuples,
    matrices, equations and logic; only an interval's endpoints may be +-infinity."""
    import sympy
    from sympy.matrices import MatrixBase

    if isinstance(v, sympy.Interval):
        return any(x not in (sympy.oo, -sympy.oo) and unusable(x) for x in (v.start, v.end))
    if isinstance(v, MatrixBase):
        return any(unusable(x) for x in v)
    if isinstance(v, sympy.Expr) and not isinstance(v, sympy.Tuple):
        return _expr_unusable(v)
    if isinstance(v, sympy.Basic):
        return any(unusable(a) for a in v.args if isinstance(a, (sympy.Basic, MatrixBase)))
    return True  # anything else math-verify might hand back has no value we can compare


def to_sympy(v, text: str):
    """A value for math-verify's `verify`: a plain number as math-verify would parse its text (so `3.50` stays a
    Float and math-verify's float rounding applies), a parsed value as it is."""
    return parsed(text) if isinstance(v, Fraction) else v


def verify(gold, pred) -> bool:
    """math-verify's equivalence of two usable values (gold first: it is asymmetric)."""
    return bool(_mv().verify(gold, pred, timeout_seconds=None))
