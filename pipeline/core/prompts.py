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


# The conversation rule. A follow-up ("and now in Python?") says little on its own: it is routed with the question it
# follows. Only user turns count: a system prompt is the application's constant (as a template is) and the assistant
# turns are agents' outputs (long, shaped by whichever agent answered, absent from every training row); what a user
# asks is what the router learned from. The backbone keeps the first ROUTED_WINDOW word pieces and cuts the rest, so
# the latest turn goes last but whole, and earlier turns are prepended only as far as they fit before it.
ROUTED_WINDOW = 256  # word pieces all-MiniLM-L6-v2 keeps (pipeline/embed/backbone.py, max_seq_length)
_SPECIAL_PIECES = 2  # [CLS] and [SEP] take two of them
_PIECE_RUN = re.compile(r"[A-Za-z]+|[0-9]+|[^\sA-Za-z0-9]")
TURN_SEPARATOR = "\n\n"


def word_pieces(text: str, cap: int | None = None) -> int:
    """An upper estimate of the WordPiece tokens of `text` (no tokenizer: serve parses a request on its event loop):
    a run of ASCII letters counts one piece per 3 letters, a run of digits one per 2, any other character one. Checked
    against the bundled MiniLM tokenizer on the 31,935 bundled source questions (tests/test_conversation.py): over
    its count for 99.8 % of them, under it by at most 1.4 x (DNA codons: three letters, two pieces), 1.5 x over on
    average. With `cap`, counting stops once the count is over it (a 1 MB turn costs what a window of it does)."""
    if cap is None:
        return sum(-(-len(w) // (2 if w[0].isdigit() else 3)) for w in _PIECE_RUN.findall(text))
    n = 0
    for m in _PIECE_RUN.finditer(text):
        w = m.group()
        n += -(-len(w) // (2 if w[0].isdigit() else 3))
        if n > cap:
            break
    return n


_TAIL_CHARS_PER_PIECE = 32  # how much of a turn's end `_tail` reads per piece of room (text_guard's CHARS_PER_TOKEN)


def _tail(text: str, room: int) -> str:
    """The last whole words of `text` whose `word_pieces` fit in `room` (joined by single spaces), read from its last
    `room * _TAIL_CHARS_PER_PIECE` characters at most."""
    end = text[-max(1, room) * _TAIL_CHARS_PER_PIECE:]
    found = end.split()
    if len(end) < len(text) and found and not end[0].isspace():
        found = found[1:]  # cut inside a word: not a whole one
    words: list[str] = []
    for w in reversed(found):
        room -= word_pieces(w)
        if room < 0:
            break
        words.append(w)
    return " ".join(reversed(words))


def routed_text(user_turns: Sequence[str], window: int = ROUTED_WINDOW) -> str:
    """What a router embeds for a conversation, given its user turns in order (training calls it with one turn, the
    task's user text; serve with a request's user turns). One turn: exactly `user_text(turn)`. More: the latest turn
    whole and last; before it the earlier turns, newest first, while the estimated word pieces of the whole
    (`word_pieces`) stay within `window`: each whole, and the first that does not fit by its last words that do (a
    question's ask is usually at its end), which ends it. Each turn goes through `user_text`; turns left empty are
    skipped; turns are joined by a blank line."""
    if not user_turns:
        raise ValueError("a conversation without a user turn has nothing to route on")
    latest = user_text(user_turns[-1])
    if len(user_turns) == 1:
        return latest
    room = int(window) - _SPECIAL_PIECES
    room -= word_pieces(latest, cap=room)
    kept = [latest]
    for turn in reversed(user_turns[:-1]):
        if room <= 0:
            break
        text = user_text(turn)
        if not text:
            continue
        n = word_pieces(text, cap=room)
        if n > room:
            text = _tail(text, room)
            if text:
                kept.append(text)
            break
        kept.append(text)
        room -= n  # a blank line between turns is no piece
    return TURN_SEPARATOR.join(reversed(kept))


def task_texts(tasks) -> list[str]:
    """What a router embeds for each row of a task table: `routed_text` of its `user_text` where the table has one
    (the question as a person types it), else of its `prompt` (a user's own tasks file; known templates stripped)."""
    col = "user_text" if "user_text" in tasks.columns else "prompt"
    return [routed_text([str(t)]) for t in tasks[col].tolist()]
