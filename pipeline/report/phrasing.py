"""How users phrase a question, and what the served router is worth for each phrasing.

The same held-out questions are sent the ways a user might: (a) pasted with the benchmark's template (the prompt the
agents were sent), (b) typed bare (the task's user text), (c) bare under RouterArena's perturbations
(pipeline/report/arena.py) and wrapped in a sentence of a user's own (`WRAPPERS`). Each phrasing is routed by the
served decision (pipeline/route/served.py) and scored on the rewards and costs recorded for that question: the agents'
replies do not depend on how the router saw the question, only the decision does. Open-ended instructions (no gold
answer) are routed too, to count how often the OOD guard sends them to the best single agent.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pipeline.core.paths import data_dir
from pipeline.core.prompts import routed_text
from pipeline.report import arena
from pipeline.route.served import ServedRows, auto_view, head_view, served_figures

# conversational wrappers of our own, none of them seen in training (the training text is the bare question)
WRAPPERS = {
    "ask": "Can you help me with this? {q}",
    "explain": "{q}\n\nPlease explain your answer briefly.",
    "stuck": "I'm working through some practice problems and got stuck on this one:\n\n{q}\n\nThanks a lot!",
}
TEMPLATED, BARE = "templated", "bare"
OPEN_ENDED_FILE = "alpaca_eval/records.parquet"  # the `alpaca_eval` source's bundle (data/alpaca_eval/SOURCE.md)


def phrasings(bare: list[str], prompts: list[str]) -> dict[str, list[str]]:
    """{phrasing: the text a user sends, per held-out question}: the benchmark's prompt, the bare question, each
    perturbation of it and each wrapper around it."""
    out = {TEMPLATED: list(prompts), BARE: list(bare)}
    out.update({f"perturbed: {k}": [arena.perturb(q, k) for q in bare] for k in arena.PERTURBATIONS})
    out.update({f"wrapped: {k}": [w.format(q=q) for q in bare] for k, w in WRAPPERS.items()})
    return out


def open_ended_instructions() -> list[str]:
    """The bundled open-ended instructions (AlpacaEval's 805, in upstream order; data/alpaca_eval/SOURCE.md)."""
    import pandas as pd

    rows = pd.read_parquet(data_dir() / OPEN_ENDED_FILE, columns=["instruction_id", "instruction"])
    return rows.drop_duplicates("instruction_id").sort_values("instruction_id")["instruction"].tolist()


def decision_key(rows: ServedRows) -> np.ndarray:
    """What was decided per row, as one comparable tuple: the view, the agent asked alone (or the stages), the agent
    whose reply is returned."""
    return np.array([f"{v}|{p}|{a}" for v, p, a in zip(rows.view, rows.pick, rows.outcome.answered_by)], dtype=object)


def phrasing_figures(served: dict[str, ServedRows], R_best: np.ndarray, C_best: np.ndarray,
                     agents: list[str]) -> dict:
    """{phrasing: served figures + `robustness` (share of questions decided as on the bare question)} of one
    router at one target, from what it served on each phrasing (`served`, with BARE among them)."""
    base = decision_key(served[BARE])
    return {name: {**served_figures(rows, R_best, C_best, agents),
                   "robustness": float(np.mean(decision_key(rows) == base))}
            for name, rows in served.items()}


def guard_rate(registered, formats, target: str, X: np.ndarray) -> dict:
    """How a router at `target` decides on prompts `X` without a gold answer: the OOD guard's firing rate and, for
    a cascade, the share whose answer format is guessed (a cascade runs its stages on those) and the share routed
    prompt-only."""
    if getattr(registered, "needs_grader", False) and formats is not None:
        _, fired, guessed = auto_view(registered, formats, target).route(X)
        return {"guard_rate": float(np.mean(fired)), "format_guessed": float(np.mean(guessed >= 0)),
                "prompt_only": float(np.mean(guessed < 0))}
    _, fired = head_view(registered, target)[0].route(X)
    return {"guard_rate": float(np.mean(fired)), "format_guessed": 0.0, "prompt_only": 1.0}


def embed_phrasings(texts: dict[str, list[str]], encode: Callable[[list[str]], np.ndarray]) -> dict[str, np.ndarray]:
    """Each phrasing's texts embedded as serve embeds a request (`routed_text` of its one user turn)."""
    return {name: encode([routed_text([t]) for t in ts]) for name, ts in texts.items()}


def phrasing_markdown(ph: dict, label: str = "") -> str:
    """The report's section: per phrasing, the router's served quality and cost against the best single agent,
    the guard's rate and the decisions unchanged from the bare question."""
    import pandas as pd

    rows = []
    for name, f in ph["phrasings"].items():
        qci, cci = f["quality_ratio_ci"], f["cost_ratio_ci"]
        rows.append({"phrasing": name, "quality / best single [95 % CI]":
                     f"{f['quality_ratio']:.1%} [{qci[0]:.1%}, {qci[1]:.1%}]",
                     "cost / best single [95 % CI]": f"{f['cost_ratio']:.0%} [{cci[0]:.0%}, {cci[1]:.0%}]",
                     "OOD guard": f"{f['guard_rate']:.1%}", "prompt-only": f"{f['prompt_only']:.1%}",
                     "same decision as bare": f"{f['robustness']:.1%}"})
    oe = ph.get("open_ended")
    tail = "" if not oe else (f"\n\nOpen-ended instructions (n={oe['n']}, no gold answer): OOD guard fires on "
                              f"{oe['guard_rate']:.1%}; answer format guessed for {oe['format_guessed']:.1%} (a "
                              f"cascade runs its stages on those), prompt-only {oe['prompt_only']:.1%}.")
    return (f"{label}held-out test n={ph['n']}, target {ph['target']}; each question's recorded rewards and costs, "
            f"decided on the text as phrased.\n\n" + pd.DataFrame(rows).to_markdown(index=False) + tail + "\n")

