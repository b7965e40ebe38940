"""Lineage stage 4: what each registered router serves on the held-out test rows (pipeline/route/served.py), decided
by the very code `router-lite serve` decides with: the user text embedded as serve embeds it, the OOD guard, the
prompt shortcuts, a cascade's answer-format guess and its prompt-only fallback. Every held-out figure of the reports
is read off this table; `tests/test_served_decisions.py` runs serve's handler on the same rows and compares."""
import numpy as np
import pandas as pd
from dagster import AssetExecutionContext, MetadataValue, Output, asset

from assets.metadata import md_table
from assets.router import entry_dir
from pipeline.collect.answers import agreement_maker, answers_matrix
from pipeline.core.prompts import task_texts
from pipeline.embed.backbone import EmbeddingCache
from pipeline.report import arena, phrasing
from pipeline.route import registry
from pipeline.route.cascade import GUARD_ACTIONS, GUARD_BEST_SINGLE
from pipeline.route.fit import reward_arrays, reward_embeddings, training_split
from pipeline.route.fitted import FittedRouter
from pipeline.route.formats import format_guess
from pipeline.route.served import served_figures, served_outcomes, served_table, with_guard_action
from pipeline.route.targets import REPORT_TARGETS, parse_target
from resources.backbone import BackboneResource
from resources.profile import ProfileResource
from resources.storage import StorageResource


def served_routers(storage: StorageResource, registered_head: dict, registered_cascade: dict) -> dict:
    """{router name as the reports name it: registered router}: the prompt router and each cascade variant."""
    out = {"head": registry.load(entry_dir(storage, registered_head))}
    for variant, v in (registered_cascade.get("variants") or {"cascade": registered_cascade}).items():
        out[f"cascade:{variant}"] = registry.load(entry_dir(storage, v))
    return out


def served_figures_of(rewards: pd.DataFrame, task_pool: pd.DataFrame, best: int, decisions: pd.DataFrame) -> dict:
    """{router: {target: figures}} of what each router serves on the held-out rows (`served_decisions`), against
    the best single agent `best` on the same rows: the one reading the reports share."""
    arrays = reward_arrays(rewards, training_split(rewards, task_pool), "test")
    te = arrays.masks["held_out"]
    return served_table(decisions, arrays.R_eff[te][:, best], arrays.C[te][:, best], arrays.agents,
                        rewards["task_id"][te].tolist())


def report_targets(serve_target: str) -> list[str]:
    """The report's targets and the profile's serving target, each once, in that order."""
    return list(dict.fromkeys([*REPORT_TARGETS, parse_target(serve_target).name]))


@asset(group_name="report", io_manager_key="io_manager",
       description="The decision `router-lite serve` takes on every held-out test row, per registered router (the "
                   "prompt router, each cascade variant) and report target: the view that decided (prompt-only or "
                   "the guessed answer format), the agent asked alone or -1 (the cascade's stages), the OOD guard, "
                   "the agent whose reply is returned, calls, and its recorded reward and cost. Every held-out "
                   "figure of the reports is read off this table.")
def served_decisions(context: AssetExecutionContext, reward_matrix: pd.DataFrame, task_pool: pd.DataFrame,
                     prompt_embeddings: pd.DataFrame, agent_answers: pd.DataFrame, registered_head: dict,
                     registered_cascade: dict, profile: ProfileResource,
                     storage: StorageResource) -> Output[pd.DataFrame]:
    rewards = reward_matrix
    arrays = reward_arrays(rewards, training_split(rewards, task_pool), "test")
    te, agents = arrays.masks["held_out"], arrays.agents
    X = reward_embeddings(prompt_embeddings, rewards)[te]
    answers = [a for a, keep in zip(answers_matrix(agent_answers, rewards["task_id"], agents), te) if keep]
    ids = rewards["task_id"][te].tolist()
    formats = format_guess(task_pool, prompt_embeddings)
    agreement_for = agreement_maker()
    frames = []
    for name, reg in served_routers(storage, registered_head, registered_cascade).items():
        for target in report_targets(profile.get().serve.target):
            rows = served_outcomes(reg, X, target, arrays.R_eff[te], arrays.C[te], answers, formats, agreement_for)
            frames.append(rows.frame(ids, name, target))
    df = pd.concat(frames, ignore_index=True)
    summary = (df.groupby(["router", "target"], sort=False)
               .agg(quality=("reward", "mean"), cost_per_1k=("cost_usd", lambda c: 1000 * c.mean()),
                    guard_rate=("ood", "mean"), prompt_only=("view", lambda v: float(np.mean(v == "prompt-only"))),
                    calls=("calls", "mean")).reset_index())
    context.log.info("served on held-out test rows:\n" + summary.to_markdown(index=False, floatfmt=".4f"))
    return Output(df, metadata={"rows": len(df), "n_test": int(te.sum()),
                                "summary": md_table(summary, floatfmt=".4f")})


def _ood_rows(rewards, task_pool, agent_answers, prompt_embeddings, agents) -> dict:
    """{"out of distribution": (X, U, C, answers)} of the task pool's out-of-distribution rows (never trained on), or
    {} when it has none."""
    split = training_split(rewards, task_pool)
    m = (split == "ood").to_numpy()
    if not m.any():
        return {}
    arrays = reward_arrays(rewards, split, "ood")
    answers = [a for a, keep in zip(answers_matrix(agent_answers, rewards["task_id"], agents), m) if keep]
    return {"out of distribution": (reward_embeddings(prompt_embeddings, rewards)[m], arrays.R_eff[m], arrays.C[m],
                                    answers)}


@asset(group_name="report", io_manager_key="io_manager",
       description="How users phrase a question: every served router at the serving target on the held-out "
                   "questions sent (a) with the benchmark's template, (b) bare, (c) bare under RouterArena's "
                   "perturbations and wrapped in a user's own sentence: quality and cost against the best single "
                   "agent (paired 95 % CIs), the OOD guard's rate, decisions unchanged from the bare question; and "
                   "the guard's rate on open-ended instructions (AlpacaEval's 805, no gold answer).")
def phrasings(context: AssetExecutionContext, reward_matrix: pd.DataFrame, task_pool: pd.DataFrame,
              prompt_embeddings: pd.DataFrame, agent_answers: pd.DataFrame, router_head: FittedRouter,
              registered_head: dict, registered_cascade: dict, profile: ProfileResource, backbone: BackboneResource,
              storage: StorageResource) -> Output[dict]:
    rewards = reward_matrix
    arrays = reward_arrays(rewards, training_split(rewards, task_pool), "test")
    te, agents, best = arrays.masks["held_out"], arrays.agents, int(router_head["best_single"])
    t = rewards[["task_id"]].merge(task_pool, on="task_id", how="left")[te]
    answers = [a for a, keep in zip(answers_matrix(agent_answers, rewards["task_id"], agents), te) if keep]
    formats = format_guess(task_pool, prompt_embeddings)
    agreement_for = agreement_maker()
    bb = backbone.get_backbone()
    cache = EmbeddingCache(storage.path("embeddings"))
    encode = lambda texts: cache.get_or_compute(texts, bb)  # noqa: E731 - a rerun embeds nothing
    X = phrasing.embed_phrasings(phrasing.phrasings(task_texts(t), t["prompt"].tolist()), encode)
    X_open = encode(phrasing.open_ended_instructions())
    target = parse_target(profile.get().serve.target).name
    U, C = arrays.R_eff[te], arrays.C[te]
    out = {"target": target, "n": int(te.sum()), "wrappers": dict(phrasing.WRAPPERS),
           "perturbations": dict(arena.PERTURBATIONS), "routers": {}}
    ood = _ood_rows(rewards, task_pool, agent_answers, prompt_embeddings, agents)
    for name, reg in served_routers(storage, registered_head, registered_cascade).items():
        served = {p: served_outcomes(reg, x, target, U, C, answers, formats, agreement_for) for p, x in X.items()}
        out["routers"][name] = {"phrasings": phrasing.phrasing_figures(served, U[:, best], C[:, best], agents),
                                "open_ended": {"n": len(X_open), **phrasing.guard_rate(reg, formats, target, X_open)}}
        if getattr(reg, "needs_grader", False):  # what each guard action serves (the shipped one chosen on validation)
            sets = {"test, bare": (X[phrasing.BARE], U, C, answers),
                    **{f"test, {p}": (X[p], U, C, answers) for p in X if p.startswith("wrapped")}, **ood}
            out["routers"][name]["guard_actions"] = {
                "shipped": reg.router.path.get("guard_action", GUARD_BEST_SINGLE),
                "evidence": reg.router.path.get("guard_evidence"),
                "by_action": {a: {s: served_figures(served_outcomes(with_guard_action(reg, a), x, target, u, c, ans,
                                                                    formats, agreement_for), u[:, best], c[:, best],
                                                    agents)
                                  for s, (x, u, c, ans) in sets.items()} for a in GUARD_ACTIONS}}
    md = "\n".join(f"#### {name}\n\n" + phrasing.phrasing_markdown({**out, **r}) for name, r in out["routers"].items())
    context.log.info("\n" + md)
    return Output(out, metadata={"n_test": out["n"], "table": MetadataValue.md(md)})
