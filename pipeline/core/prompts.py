"""The exact prompt text a task is sent with.

The replay pool is keyed by a hash of this text, so it is the single place that formats prompts: change it and the
replay recordings must be rebuilt (`python data/build/build_replay.py`).
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

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


# --- What a router embeds: the text a user sends, never a benchmark's answer-format scaffolding ---------------------
# Agents are sent a benchmark's exact prompt (its answer-format instruction included, so rewards are measured as the
# benchmark defines them); a router learns from, and serve embeds, the question as a person types it. Both go through
# `user_text`, so a user who pastes a known template lands on the very text training saw.
_ZEROEVAL_RE = re.compile(r"^\s*## Question:\s*(?P<q>.*?)\s*## Instruction\s*\n\s*Please answer this question by first "
                          r"reasoning and then providing your answer\..*$", re.S)
_SUFFIXES = (MCQ_INSTRUCTION, MATH_INSTRUCTION)


def user_text(text: str) -> str:
    """One user turn as a router sees it: a known benchmark template (ZeroEval's "## Question: ... ## Instruction"
    wrapper, this project's own MCQ / math instructions) removed, surrounding whitespace trimmed; a text that is
    nothing but a template stays as it is. Idempotent."""
    whole = text.strip()
    m = _ZEROEVAL_RE.match(text)
    text = (m.group("q") if m else text).strip()
    for suffix in _SUFFIXES:
        if text.endswith(suffix):
            text = text[: -len(suffix)].rstrip()
    return text or whole


def routed_text(user_turns: Sequence[str]) -> str:
    """What a router embeds for a conversation, given its user turns in order: training calls it with one turn (the
    task's user text), serve with the request's user turns."""
    if not user_turns:
        raise ValueError("a conversation without a user turn has nothing to route on")
    return user_text(user_turns[-1])


def task_texts(tasks) -> list[str]:
    """What a router embeds for each row of a task table: `routed_text` of its `user_text` where the table has one
    (the question as a person types it), else of its `prompt` (a user's own tasks file; known templates stripped)."""
    col = "user_text" if "user_text" in tasks.columns else "prompt"
    return [routed_text([str(t)]) for t in tasks[col].tolist()]
