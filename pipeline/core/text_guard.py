"""Bounds on text before it reaches a tokenizer, and on request JSON before it reaches the router.

- `bad_text(s)`: why `s` cannot be embedded (a lone UTF-16 surrogate, or an undecodable byte that Python carried
  over from argv with surrogateescape), or None. Tokenizers raise on such text, and in a batch one bad prompt would
  fail every prompt embedded with it.
- `cut_for_tokens(s, max_tokens)`: `s` cut by characters to a bound derived from the backbone's `max_seq_length`
  (`CHARS_PER_TOKEN` characters per token), at the last whitespace before the bound, so a 1 MB prompt costs no more
  tokenizer time and memory than a long normal one. The backbone keeps only the first `max_tokens` tokens anyway;
  a prompt whose first `max_tokens * CHARS_PER_TOKEN` characters hold fewer than `max_tokens` tokens (long
  whitespace runs, words over 100 characters) is embedded from that prefix.
- `json_problem(obj, max_depth)`: the first place in a parsed JSON value nested deeper than `max_depth` or holding
  a string with `bad_text`, as `(path, reason)`, or None. Iterative: deep values cannot overflow the stack.
"""
from __future__ import annotations

import re
from typing import Any

# English text averages ~4-5 characters per WordPiece/BPE token; 32 leaves a wide margin for long words and
# whitespace while bounding the tokenizer's input (256 tokens -> 8,192 characters)
CHARS_PER_TOKEN = 32
_CUT_SLACK = 256  # how far back from the bound a whitespace is looked for


def bad_text(s: str) -> str | None:
    """Why `s` is not valid Unicode text for a tokenizer, naming the character position; None when it is."""
    if s.isascii():
        return None
    try:
        s.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        ch = ord(s[e.start])
        if 0xDC80 <= ch <= 0xDCFF:  # surrogateescape: a raw byte that was not UTF-8 (argv, file names)
            return f"byte 0x{ch - 0xDC00:02X} at character {e.start} is not UTF-8"
        return f"lone UTF-16 surrogate U+{ch:04X} at character {e.start}"


def cut_for_tokens(s: str, max_tokens: int) -> str:
    """`s` cut to at most `max_tokens * CHARS_PER_TOKEN` characters (at a whitespace when one is near the bound)."""
    limit = max(1, int(max_tokens)) * CHARS_PER_TOKEN
    if len(s) <= limit:
        return s
    head = s[:limit]
    cut = max(head.rfind(" ", limit - _CUT_SLACK), head.rfind("\n", limit - _CUT_SLACK))
    return head[:cut] if cut > 0 else head


def json_problem(obj: Any, max_depth: int) -> tuple[str, str] | None:
    """(path, reason) of the first value nested deeper than `max_depth` or string that is not valid text."""
    stack: list[tuple[Any, str, int]] = [(obj, "", 1)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, str):
            reason = bad_text(v)
            if reason:
                return path or "(body)", reason
            continue
        if not isinstance(v, (dict, list)):
            continue
        if depth > max_depth:
            return path or "(body)", f"JSON nested deeper than {max_depth} levels"
        if isinstance(v, dict):
            for k, x in v.items():
                reason = bad_text(k)
                if reason:
                    return f"{path}.{k!r}" if path else repr(k), f"key: {reason}"
                stack.append((x, f"{path}.{k}" if path else k, depth + 1))
        else:
            stack.extend((x, f"{path}[{i}]", depth + 1) for i, x in enumerate(v))
    return None


_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_JSON_BRACKET = re.compile(r"[\[\]{}]")


def json_text_depth(text: str) -> int:
    """How deep the arrays and objects of JSON `text` nest, counted on the text (strings skipped) before it is
    parsed: a file nested 100,000 deep would make `json.loads` (or whatever walks the result) raise RecursionError."""
    depth = top = 0
    for m in _JSON_BRACKET.finditer(_JSON_STRING.sub("", text)):
        depth += 1 if m.group() in "[{" else -1
        top = max(top, depth)
    return top
