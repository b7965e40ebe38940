"""The task pool: a balanced, seeded sample of normalised tasks with a train/validation/test split.

Two ways to balance (config `task_pool.balance`):
- `domain_difficulty` (the seed's pool): equal thirds across domains; inside a domain, equal thirds across
  difficulties, each cell spread evenly over the domain's sources. A short cell hands its shortfall to the other
  difficulties of its domain, so a domain with few sources (reasoning without rlpr: ARC-Challenge alone) still
  fills its third.
- `category`: a stratified sample over one column (MMLU-Pro's 14 categories for the demo profile), proportional
  to the category sizes.
Both are pure functions of (tasks, config, seed): the same inputs give the identical pool.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
import pandas as pd
from pydantic import Field

from pipeline.core.config import Int, Number, check_fields, one_of
from pipeline.core.errors import RouterLiteError
from pipeline.tasks.sources import DIFFICULTIES, DOMAINS

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class TaskPoolConfig:
    """The task pool (`task_pool:` of a profile; pycma style: option = default, meaning).

    size = 1110
        Tasks in the pool (the seed's 1,110). Must not exceed the eligible source tasks.
    seed = 42
        Seed of the sample and of the split: the same tasks + the same config give the identical pool.
    balance = "domain_difficulty"
        "domain_difficulty" (equal thirds over domains, then over difficulties; needs every domain) or
        "category" (a sample stratified over ``stratify_column``, proportional to its value counts).
    stratify_column = "category"
        The task column ``balance: category`` stratifies over (and the split is stratified by).
    split = {train: 0.58, validation: 0.20, test: 0.22}
        Fractions of the in-distribution tasks per split; keys train, validation, test, summing to 1.
    ood_categories = ()
        Values of ``ood_column`` kept out of training entirely (split "test", ood=True). In a profile also
        written ``ood: {column: C, values: [...]}`` (`pipeline.core.config.OodSpec`).
    ood_column = "category"
        The task column ``ood_categories`` are values of.
    """

    size: Annotated[Int, Field(gt=0)] = 1110
    seed: Int = 42
    balance: Literal["domain_difficulty", "category"] = "domain_difficulty"
    stratify_column: str = "category"  # for balance="category"
    split: dict[Annotated[str, one_of(SPLITS, key=True)], Number] = \
        field(default_factory=lambda: {"train": 0.58, "validation": 0.20, "test": 0.22})
    # values of `ood_column` kept out of training entirely (split "test", ood=True)
    ood_categories: tuple[str, ...] = ()
    ood_column: str = "category"

    def __post_init__(self):
        check_fields(self, "task_pool")
        if set(self.split) != set(SPLITS) or abs(sum(self.split.values()) - 1) > 1e-6:
            raise RouterLiteError(f"task_pool.split must give {SPLITS} fractions summing to 1, got {self.split}")


def _even_counts(total: int, caps: list[int]) -> list[int]:
    """Split `total` as evenly as possible over bins with capacities `caps` (water filling)."""
    counts = [0] * len(caps)
    left = min(total, sum(caps))
    while left > 0:
        open_bins = [i for i, c in enumerate(caps) if counts[i] < c]
        share = max(1, left // len(open_bins))
        for i in open_bins:
            take = min(share, caps[i] - counts[i], left)
            counts[i] += take
            left -= take
            if left == 0:
                break
    return counts


def _largest_remainder(total: int, weights: list[float]) -> list[int]:
    raw = np.asarray(weights, dtype=float) / sum(weights) * total
    counts = np.floor(raw).astype(int)
    for i in np.argsort(-(raw - counts), kind="stable")[: total - counts.sum()]:
        counts[i] += 1
    return counts.tolist()


def _sample(df: pd.DataFrame, n: int, rng: np.random.Generator) -> pd.DataFrame:
    return df.sample(n=n, random_state=rng) if n < len(df) else df


def balance_domain_difficulty(tasks: pd.DataFrame, cfg: TaskPoolConfig, rng: np.random.Generator) -> pd.DataFrame:
    domains = [d for d in DOMAINS if (tasks["domain"] == d).any()]
    missing = set(DOMAINS) - set(domains)
    if missing:
        raise RouterLiteError(f"task pool needs every domain; no tasks for {sorted(missing)} — check `sources`")
    picked = []
    for domain, n_domain in zip(domains, _largest_remainder(cfg.size, [1] * len(domains))):
        dom = tasks[tasks["domain"] == domain]
        caps = [int((dom["difficulty"] == d).sum()) for d in DIFFICULTIES]
        if sum(caps) < n_domain:
            raise RouterLiteError(f"domain {domain!r} has {sum(caps)} tasks, the pool needs {n_domain}")
        for difficulty, n_cell in zip(DIFFICULTIES, _even_counts(n_domain, caps)):
            cell = dom[dom["difficulty"] == difficulty]
            groups = [g for _, g in cell.groupby("source", sort=True)]
            for g, n in zip(groups, _even_counts(n_cell, [len(g) for g in groups])):
                picked.append(_sample(g, n, rng))
    return pd.concat(picked)


def balance_category(tasks: pd.DataFrame, cfg: TaskPoolConfig, rng: np.random.Generator) -> pd.DataFrame:
    col = cfg.stratify_column
    if col not in tasks or tasks[col].eq("").all():
        raise RouterLiteError(f"task_pool.stratify_column {col!r} is missing or empty in the source tasks")
    if len(tasks) < cfg.size:
        raise RouterLiteError(f"task pool size {cfg.size} exceeds the {len(tasks)} eligible tasks")
    groups = [g for _, g in tasks.groupby(col, sort=True)]
    counts = _largest_remainder(cfg.size, [len(g) for g in groups])
    return pd.concat([_sample(g, n, rng) for g, n in zip(groups, counts)])


def assign_splits(pool: pd.DataFrame, fractions: dict, by: list[str], rng: np.random.Generator) -> pd.Series:
    """Stratified split: inside each stratum, shuffle then cut by fractions (largest remainder rounding)."""
    split = pd.Series("", index=pool.index, dtype=object)
    for _, g in pool.groupby(by, sort=True):
        order = rng.permutation(g.index.to_numpy())
        counts = _largest_remainder(len(order), [fractions[s] for s in SPLITS])
        start = 0
        for name, n in zip(SPLITS, counts):
            split.loc[order[start:start + n]] = name
            start += n
    return split


def _prompt_key(prompts: pd.Series) -> pd.Series:
    """What makes two prompts the same question: the text with whitespace runs collapsed."""
    return prompts.astype(str).str.split().str.join(" ")


def drop_duplicate_prompts(tasks: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """(tasks with one row per prompt, number dropped): a source may hold one question under several ids; the
    first task_id (sorted) is kept, so the copies can never land in different splits (a train/test leak)."""
    tasks = tasks.sort_values("task_id")
    keep = ~_prompt_key(tasks["prompt"]).duplicated()
    return tasks[keep], int((~keep).sum())


def cross_split_duplicates(pool: pd.DataFrame) -> pd.DataFrame:
    """Rows of `pool` whose prompt also appears in another split (the blocking check of the task pool)."""
    key = _prompt_key(pool["prompt"])
    n_splits = pool.groupby(key)["split"].transform("nunique")
    return pool[n_splits > 1]


def build_task_pool(tasks: pd.DataFrame, cfg: TaskPoolConfig) -> pd.DataFrame:
    """Balanced, split, deterministic task pool (columns: the task contract + `split`, `ood`); one task per prompt
    (`drop_duplicate_prompts`)."""
    dup = tasks["task_id"][tasks["task_id"].duplicated()]
    if not dup.empty:
        raise RouterLiteError(f"duplicate task_id in source tasks: {dup.iloc[0]!r}")
    # sorting first makes the sample independent of the order the source partitions arrived in
    tasks = drop_duplicate_prompts(tasks)[0].reset_index(drop=True)
    rng = np.random.default_rng(cfg.seed)
    balance = balance_domain_difficulty if cfg.balance == "domain_difficulty" else balance_category
    pool = balance(tasks, cfg, rng).sort_values("task_id").reset_index(drop=True)
    if cfg.ood_categories and cfg.ood_column not in pool:
        raise RouterLiteError(f"task_pool.ood column {cfg.ood_column!r} is not a task column")
    pool["ood"] = pool[cfg.ood_column].astype(str).isin(cfg.ood_categories) if cfg.ood_categories else False
    strata = ["domain", "difficulty"] if cfg.balance == "domain_difficulty" else [cfg.stratify_column]
    inside = pool[~pool["ood"]]
    pool["split"] = "test"  # out-of-distribution tasks are only ever evaluated
    pool.loc[inside.index, "split"] = assign_splits(inside, cfg.split, strata, rng)
    return pool


def pool_counts(pool: pd.DataFrame) -> dict[str, dict[str, int]]:
    """Counts per source, domain, difficulty and split, for metadata and the `make run` printout."""
    return {col: {str(k): int(v) for k, v in pool[col].value_counts().sort_index().items()}
            for col in ("source", "domain", "difficulty", "split")}
