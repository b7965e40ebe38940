"""Collection quality rules and the quarantine: an agent that breaks a rule on a source is left out of every
downstream asset (reward matrix, answers, routers, reports), with its reason; the other agents go on.

The rule today: the empty-reply rate of one agent on one collection partition (source × repetition) must stay below
the profile's `collection.empty_rate_max` (default 0.05). The `graded_calls` check `empty_rate_below_5pct` reports
the quarantined agents (a warning; it fails, blocking the lineage, only when it would quarantine every agent of the
partition), and `reward_matrix`, `agent_answers` and the pool report take the same verdict from `quarantined`.
"""
from __future__ import annotations

import pandas as pd

from pipeline.core.errors import RouterLiteError

RULE_SETTING = "collection.empty_rate_max"


def source_of(task_ids: pd.Series) -> pd.Series:
    """The source of each task id (`<source>/<id>`)."""
    return task_ids.astype(str).str.split("/", n=1).str[0]


def empty_rates(calls: pd.DataFrame) -> pd.Series:
    """Per agent: the share of its calls whose status is `empty`."""
    return calls.groupby("agent")["status"].apply(lambda s: float((s == "empty").mean()))


def quarantined(calls: pd.DataFrame, empty_rate_max: float) -> dict[str, str]:
    """agent -> reason, for every agent whose empty-reply rate on some (source, repetition) of `calls` reaches
    `empty_rate_max`; one clause per partition it broke the rule on, in source then repetition order."""
    if calls.empty:
        return {}
    parts = calls.assign(source=source_of(calls["task_id"]), empty=calls["status"].eq("empty"))
    g = parts.groupby(["agent", "source", "repetition"], sort=True)["empty"].agg(["mean", "sum", "size"])
    out: dict[str, list[str]] = {}
    for (agent, source, rep), row in g.iterrows():
        if row["mean"] >= empty_rate_max:
            out.setdefault(str(agent), []).append(
                f"empty replies {row['mean']:.1%} >= {empty_rate_max:.0%} ({RULE_SETTING}) on {source} repetition "
                f"{int(rep)} ({int(row['sum'])} of {int(row['size'])} calls)")
    return {a: "; ".join(reasons) for a, reasons in out.items()}


def kept_agents(agents: list[str], quarantine: dict[str, str], where: str) -> list[str]:
    """`agents` without the quarantined ones; none left: one error naming each agent's reason and the setting."""
    kept = [a for a in agents if a not in quarantine]
    if not kept:
        raise RouterLiteError(f"{where}: every agent is quarantined by the collection quality rules ("
                              + "; ".join(f"{a}: {quarantine[a]}" for a in agents)
                              + f"); raise {RULE_SETTING} in the profile, or fix the agents")
    return kept


def quarantine_markdown(quarantine: dict[str, str]) -> str:
    """The quarantine as a Markdown list (empty string when nobody is quarantined)."""
    if not quarantine:
        return ""
    return ("Quarantined agents (broke a collection quality rule; left out of the reward matrix, the routers and "
            "this report):\n\n" + "\n".join(f"- {a}: {why}" for a, why in quarantine.items()) + "\n")
