"""The exact prompt text a task is sent with.

The replay pool is keyed by a hash of this text, so it is the single place that formats prompts: change it and the
replay recordings must be rebuilt (`python data/build/build_replay.py`).
"""
from __future__ import annotations

import hashlib

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

MCQ_INSTRUCTION = (
    "Think step by step, then finish with \"The answer is (X)\" where X is the letter of the correct option."
)
MATH_INSTRUCTION = "Think step by step, then put the final answer in \\boxed{}."


def mcq_prompt(question: str, options: list[str]) -> str:
    """Question, lettered options (A., B., ...), instruction."""
    if not options:
        raise ValueError(f"multiple-choice question without options: {question[:80]!r}")
    if len(options) > len(LETTERS):
        raise ValueError(f"too many options ({len(options)}) for question {question[:80]!r}")
    lines = [question.strip(), "", "Options:"]
    lines += [f"{LETTERS[i]}. {str(opt).strip()}" for i, opt in enumerate(options)]
    lines += ["", MCQ_INSTRUCTION]
    return "\n".join(lines)


def math_prompt(problem: str) -> str:
    return f"{problem.strip()}\n\n{MATH_INSTRUCTION}"


def prompt_hash(prompt: str) -> str:
    """Stable key of a prompt (sha256 of its UTF-8 text, 16 hex chars)."""
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]
