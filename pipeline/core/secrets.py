"""Masking a secret (the provider key) in text that will be logged, recorded or returned.

An echo of the key is not always the exact key: a provider may lower- or upper-case it, a message may be cut in the
middle of it. So every run of 8 or more characters of the text that also occurs in the key (compared without case:
a prefix, a suffix, any truncation) is masked, as is the whole key in any case. Short keys (under 8 characters) are
masked only whole. Keys are ASCII: ASCII case folding keeps text positions unchanged.
"""
from __future__ import annotations

import string

MIN_RUN = 8
_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)


def _spans(text: str, secret: str) -> list[tuple[int, int]]:
    low, key = text.translate(_FOLD), secret.translate(_FOLD)
    if len(key) < MIN_RUN:
        spans, i = [], low.find(key)
        while key and i >= 0:
            spans.append((i, i + len(key)))
            i = low.find(key, i + len(key))
        return spans
    grams = {key[i:i + MIN_RUN] for i in range(len(key) - MIN_RUN + 1)}
    spans, i = [], 0
    while i <= len(low) - MIN_RUN:
        if low[i:i + MIN_RUN] in grams:
            j = i + MIN_RUN
            while j < len(low) and low[i:j + 1] in key:  # extend while the run still occurs in the key
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    return spans


def mask(text: str, secrets, placeholder: str = "***") -> str:
    """`text` with every occurrence of each secret (see module doc) replaced by `placeholder`."""
    text = str(text)
    for s in secrets:
        if not s or len(s) < 4:
            continue
        spans = _spans(text, str(s))
        for a, b in reversed(spans):
            text = text[:a] + placeholder + text[b:]
    return text
