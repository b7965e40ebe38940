"""Suites: where a router's evidence comes from, and the builders that turn it into a `Profile`.

A suite is declared in `config/suites.yaml` with a kind:
- `profile`: per-query quality and cost for K models with a train/test split (`Profile`). Builders:
  `routerbench` (bundled data), `mmlu-pro-outputs` / `zeroeval-outputs` (the active profile's reward matrix + a
  price per question: the `mmlu_pro` / `demo` profile), `own` (any reward matrix in our contract).
- `preference`: pairwise human preferences; declared only (see `build_preference` for the reduction we will use).
- `raw`: task sources that become a profile through collection (task pool → graded calls → reward matrix → `own`).

Runtime data is read from the data dir: `$ROUTER_LITE_DATA` if set, else `<repo>/data`.
"""
from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from pipeline.core.errors import RouterLiteError
from pipeline.core.paths import data_dir

KINDS = ("profile", "preference", "raw")
SPLITS = ("train", "validation", "test")
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "config" / "suites.yaml"
ROUTERBENCH_FILE = Path("routerbench") / "routerbench.parquet"
_ROUTERBENCH_META_COLUMNS = {"sample_id", "eval_name", "split", "source_file", "source_row", "prompt", "prompt_hash"}


# ------------------------------------------------------------------------------------------------ Profile
@dataclass(eq=False)
class Profile:
    """Per-query quality and cost of K models.

    `quality[i, j]`, `cost[i, j]` (float, (n, K)) are model j's quality and cost (USD) on query i; `split[i]` is
    "train" or "test" ("validation" too when the source has one). `meta` holds provenance and counts; per-query
    extras live in `meta["per_query"]` (name → list of length n) and follow `select`.
    """

    name: str
    models: list[str]
    query_ids: list[str]
    query_text: list[str]
    quality: np.ndarray
    cost: np.ndarray
    split: np.ndarray
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.models = [str(m) for m in self.models]
        self.query_ids = [str(q) for q in self.query_ids]
        self.query_text = [str(t) for t in self.query_text]
        self.quality = np.asarray(self.quality, dtype=np.float64)
        self.cost = np.asarray(self.cost, dtype=np.float64)
        self.split = np.asarray(self.split, dtype=object)
        n, k = len(self.query_ids), len(self.models)
        for label, arr in (("quality", self.quality), ("cost", self.cost)):
            if arr.shape != (n, k):
                raise RouterLiteError(f"profile {self.name!r}: {label} has shape {arr.shape}, expected ({n}, {k})")
            if not np.all(np.isfinite(arr)):
                raise RouterLiteError(f"profile {self.name!r}: {label} holds NaN or infinite values")
        if len(self.query_text) != n or self.split.shape != (n,):
            raise RouterLiteError(f"profile {self.name!r}: query_text/split lengths differ from {n} query ids")
        bad = sorted(set(self.split.tolist()) - set(SPLITS))
        if bad:
            raise RouterLiteError(f"profile {self.name!r}: unknown split values {bad} (allowed: {list(SPLITS)})")
        if len(set(self.query_ids)) != n:
            dup = pd.Series(self.query_ids)
            raise RouterLiteError(f"profile {self.name!r}: duplicate query ids "
                                  f"{sorted(set(dup[dup.duplicated()]))[:5]}")
        if len(set(self.models)) != k:
            raise RouterLiteError(f"profile {self.name!r}: duplicate model names in {self.models}")
        for key, values in self.meta.get("per_query", {}).items():
            if len(values) != n:
                raise RouterLiteError(f"profile {self.name!r}: meta per_query[{key!r}] has {len(values)} values, "
                                      f"not {n}")

    @property
    def n(self) -> int:
        return len(self.query_ids)

    @property
    def k(self) -> int:
        return len(self.models)

    def select(self, split: str) -> Profile:
        """The queries of one split (a new Profile)."""
        if split not in SPLITS:
            raise RouterLiteError(f"unknown split {split!r} (allowed: {list(SPLITS)})")
        mask = self.split == split
        idx = np.flatnonzero(mask)
        meta = dict(self.meta)
        meta["per_query"] = {k: [v[i] for i in idx] for k, v in self.meta.get("per_query", {}).items()}
        meta["selected_split"] = split
        return replace(
            self,
            query_ids=[self.query_ids[i] for i in idx],
            query_text=[self.query_text[i] for i in idx],
            quality=self.quality[mask],
            cost=self.cost[mask],
            split=self.split[mask],
            meta=meta,
        )


# ------------------------------------------------------------------------------------------------ registry
@dataclass(frozen=True)
class SuiteSpec:
    name: str
    kind: str
    builder: str | None
    description: str
    options: dict[str, Any]


def load_suites(path: str | Path | None = None) -> dict[str, SuiteSpec]:
    """Read the suites registry (default `config/suites.yaml`)."""
    path = Path(path) if path is not None else DEFAULT_CONFIG
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise RouterLiteError(f"suites config not found: {path}") from None
    except yaml.YAMLError as exc:
        raise RouterLiteError(f"suites config {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("suites"), dict):
        raise RouterLiteError(f"suites config {path}: expected a top-level mapping 'suites:'")
    out: dict[str, SuiteSpec] = {}
    for name, body in raw["suites"].items():
        if not isinstance(body, dict):
            raise RouterLiteError(f"suites config {path}: suite {name!r} must be a mapping")
        kind = body.get("kind")
        if kind not in KINDS:
            raise RouterLiteError(f"suites config {path}: suite {name!r} has kind {kind!r}, "
                                  f"expected one of {list(KINDS)}")
        builder = body.get("builder")
        if kind == "profile" and builder not in PROFILE_BUILDERS:
            raise RouterLiteError(
                f"suites config {path}: suite {name!r} has builder {builder!r}, "
                f"expected one of {sorted(PROFILE_BUILDERS)}"
            )
        options = {k: v for k, v in body.items() if k not in ("kind", "builder", "description")}
        out[str(name)] = SuiteSpec(str(name), kind, builder, str(body.get("description", "")).strip(), options)
    return out


def get_suite(name: str, suites: Mapping[str, SuiteSpec] | None = None) -> SuiteSpec:
    suites = load_suites() if suites is None else suites
    if name not in suites:
        raise RouterLiteError(f"unknown suite {name!r}; known suites: {', '.join(sorted(suites))}")
    return suites[name]


def build_suite(name: str, *, config_path: str | Path | None = None, **inputs: Any) -> Profile:
    """Build a profile suite by name. `inputs` go to its builder (e.g. `rewards=`, `prices=`, `tasks=`)."""
    spec = get_suite(name, load_suites(config_path))
    if spec.kind == "preference":
        return build_preference(spec)
    if spec.kind == "raw":
        raise RouterLiteError(
            f"suite {name!r} is a raw suite (task sources, no answers yet): collect it first "
            f"({spec.options.get('asset', 'task_pool')} -> graded_calls -> reward_matrix), then build the 'own' "
            "suite from the reward matrix"
        )
    builder = PROFILE_BUILDERS[spec.builder]
    if spec.builder == "routerbench":
        rel = spec.options.get("data")
        inputs.setdefault("path", data_dir() / rel if rel else None)
    profile = builder(**inputs)
    profile.name = name
    profile.meta["suite"] = name
    return profile


def build_preference(spec: SuiteSpec) -> Profile:
    """Preference suites are declared, not converted.

    The reduction we will use once data exists (Bradley–Terry): each model m gets a strength β_m with
    P(a beats b) = σ(β_a − β_b); β is fitted by maximum likelihood (logistic regression on the ±1 indicator
    columns of each battle, ties counted as half a win each, β centred to mean 0, an L2 prior for models with few
    battles). For a routing profile, battles are grouped by prompt cluster (or embedding neighbourhood) and the
    per-cluster strengths σ(β_m − mean β) become the quality of model m on the queries of that cluster; cost comes
    from prices per call. Until then, building such a suite is an error.
    """
    raise RouterLiteError(
        f"suite {spec.name!r} is a preference suite (pairwise human preferences): not converted until data exists; "
        "use a profile suite (e.g. 'routerbench' or 'own')"
    )


# ------------------------------------------------------------------------------------------------ routerbench
_SHOT_END = re.compile(r"Answer:[ \t]*\n[A-Z][ \t]*\n\n")
_INSTRUCTION = re.compile(r"\s*Print only a single choice\b.*\Z", re.S)
_TRAILING_ANSWER = re.compile(r"\s*Answer:\s*\Z")
_LEADS = ("Please answer with the letter of the correct answer.",)


def _unwrap_prompt(prompt: str) -> str:
    """The source stores prompts as a Python-list repr (`['...']`); return the (last) string."""
    s = prompt.strip()
    if len(s) >= 4 and s[0] == "[" and s[-1] == "]" and s[1] in "'\"":
        try:
            value = ast.literal_eval(s)
        except (ValueError, SyntaxError):
            return prompt
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return value[-1]
    return prompt


def final_query(prompt_str: str, eval_name: str) -> str:
    """The query a router should see: the last question of a few-shot prompt, without the shared prefix.

    RouterBench's ARC-Challenge and Winogrande prompts are 5-shot: blocks `question / options / instruction /
    Answer:\\nX\\n\\n`, then the real question. We keep the text after the last answered block, drop the answer
    instruction (`Print only a single choice ...` and the trailing `Answer:`) and Winogrande's lead line
    (`Please answer with the letter of the correct answer.`). MBPP prompts are the bare task; any eval uses the
    same rule, so a prompt without a few-shot block is returned stripped. Accepts the list-repr form too.
    """
    if not isinstance(prompt_str, str):
        raise RouterLiteError(f"final_query: prompt of {eval_name!r} must be a string, got {type(prompt_str).__name__}")
    text = _unwrap_prompt(prompt_str)
    query = _SHOT_END.split(text)[-1]
    query = _INSTRUCTION.sub("", query)
    query = _TRAILING_ANSWER.sub("", query).strip()
    for lead in _LEADS:
        if query.startswith(lead):
            query = query[len(lead):].strip()
    return query


def build_routerbench(path: str | Path | None = None) -> Profile:
    """The bundled RouterBench subset (`data/routerbench/routerbench.parquet`) as a profile.

    quality = each model's 0/1 score, cost = `<model>|total_cost` (USD per call). Rows where any model's score is
    missing are dropped (`meta["dropped_missing"]`, per split in `meta["dropped_missing_by_split"]`). The split is
    RouterDC's train/test files. `query_text` = `final_query(prompt, eval_name)`; `meta["per_query"]` holds
    `eval_name` and `prompt_hash`.
    """
    path = Path(path) if path is not None else data_dir() / ROUTERBENCH_FILE
    if not path.exists():
        raise RouterLiteError(
            f"RouterBench data not found: {path} (set ROUTER_LITE_DATA or run data/build/build_routerbench.py)"
        )
    df = pd.read_parquet(path)
    missing_cols = _ROUTERBENCH_META_COLUMNS - set(df.columns)
    if missing_cols:
        raise RouterLiteError(f"{path}: missing columns {sorted(missing_cols)}")
    models = sorted(c for c in df.columns if "|" not in c and c not in _ROUTERBENCH_META_COLUMNS)
    cost_cols = [f"{m}|total_cost" for m in models]
    absent = [c for c in cost_cols if c not in df.columns]
    if not models or absent:
        raise RouterLiteError(f"{path}: no model columns, or cost columns missing: {absent}")
    bad_split = sorted(set(df["split"]) - {"train", "test"})
    if bad_split:
        raise RouterLiteError(f"{path}: unknown split values {bad_split}")
    missing = df[models].isna().any(axis=1) | df[cost_cols].isna().any(axis=1)
    dropped = df[missing]
    kept = df[~missing].reset_index(drop=True)
    quality = kept[models].to_numpy(dtype=np.float64)
    cost = kept[cost_cols].to_numpy(dtype=np.float64)
    meta = {
        "source": "RouterBench (withmartian/routerbench) via RouterDC re-split; see data/routerbench/NOTICE.md",
        "path": str(path),
        "quality": "0/1 correctness (RouterBench score column)",
        "cost_unit": "USD per call (RouterBench <model>|total_cost)",
        "rows_raw": int(len(df)),
        "dropped_missing": int(len(dropped)),
        "dropped_missing_by_split": {str(k): int(v) for k, v in dropped["split"].value_counts().sort_index().items()},
        "dropped_missing_ids": dropped["sample_id"].astype(str).tolist(),
        "rows_by_split": {str(k): int(v) for k, v in kept["split"].value_counts().sort_index().items()},
        "rows_by_eval_split": {
            f"{e}/{s}": int(v) for (e, s), v in kept.groupby(["eval_name", "split"]).size().sort_index().items()
        },
        "per_query": {"eval_name": kept["eval_name"].astype(str).tolist(), "prompt_hash": kept["prompt_hash"].tolist()},
    }
    texts = [final_query(p, e) for p, e in zip(kept["prompt"], kept["eval_name"])]
    by_split = pd.DataFrame({"text": texts, "split": kept["split"].to_numpy()})
    shared = (set(by_split.loc[by_split["split"] == "train", "text"])
              & set(by_split.loc[by_split["split"] == "test", "text"]))
    meta["query_text_in_both_splits"] = len(shared)  # the source split's own overlap (2 MBPP tasks), kept as is
    return Profile(
        name="routerbench",
        models=models,
        query_ids=kept["sample_id"].astype(str).tolist(),
        query_text=texts,
        quality=quality,
        cost=cost,
        split=kept["split"].to_numpy(dtype=object),
        meta=meta,
    )


# ------------------------------------------------------------------------------------------------ reward matrices
def _hash_split(task_id: str, test_fraction: float) -> str:
    u = int(hashlib.sha256(task_id.encode("utf-8")).hexdigest()[:8], 16) / 2**32
    return "test" if u < test_fraction else "train"


def _list(value: Any, what: str) -> list:
    if isinstance(value, (list, tuple, np.ndarray, pd.Series)):
        return list(value)
    raise RouterLiteError(f"{what} must be a list, got {type(value).__name__}")


def profile_from_rewards(
    rewards: pd.DataFrame,
    tasks: pd.DataFrame | None = None,
    *,
    name: str = "own",
    prices: Mapping[str, float] | None = None,
    test_fraction: float = 0.3,
) -> Profile:
    """A reward matrix (reward rows: task_id, agent_order, mean_reward, mean_cost) → Profile.

    - models: `agent_order` of the first row; every row must list the same agents (any order).
    - quality = mean_reward; cost = mean_cost, or `prices[agent]` (USD per question) for every query when `prices`
      is given. Rows with a missing (NaN) reward or cost are dropped and counted (`meta["dropped_missing"]`).
    - query_text and split come from `tasks` (columns task_id, prompt, split) when given; without tasks the text
      is empty (`meta["query_text"] = "absent"`), and without a split column a stable hash of task_id puts about
      `test_fraction` of the rows in test.
    """
    models = _check_reward_table(rewards, prices, test_fraction)
    price_vec = None if prices is None else _price_vector(prices, models)
    n = len(rewards)
    quality, cost = _reward_arrays(rewards, models, price_vec)

    task_ids = rewards["task_id"].astype(str).to_numpy()
    keep = np.isfinite(quality).all(axis=1) & np.isfinite(cost).all(axis=1)
    dropped_ids = task_ids[~keep].tolist()
    quality, cost, task_ids = quality[keep], cost[keep], task_ids[keep]

    meta: dict[str, Any] = {
        "source": "reward matrix",
        "quality": "mean reward over repetitions",
        "cost_unit": "USD per question (prices)" if prices is not None else "USD per call (mean_cost)",
        "rows_raw": int(n),
        "dropped_missing": len(dropped_ids),
        "dropped_missing_ids": dropped_ids,
    }
    texts, split = _texts_and_split(tasks, task_ids, test_fraction, meta)
    meta["query_text"] = "tasks.prompt" if tasks is not None and "prompt" in tasks.columns else "absent"
    meta["rows_by_split"] = {str(k): int(v) for k, v in pd.Series(split).value_counts().sort_index().items()}
    return Profile(name, models, task_ids.tolist(), texts, quality, cost, split, meta)


def _check_reward_table(rewards: pd.DataFrame, prices: Mapping[str, float] | None, test_fraction: float) -> list[str]:
    """The agents (first row's agent_order) of a well-formed reward matrix; one clear error otherwise."""
    if not isinstance(rewards, pd.DataFrame):
        raise RouterLiteError(f"rewards must be a pandas DataFrame, got {type(rewards).__name__}")
    need = {"task_id", "agent_order", "mean_reward"} | (set() if prices is not None else {"mean_cost"})
    miss = need - set(rewards.columns)
    if miss:
        raise RouterLiteError(f"reward matrix lacks columns {sorted(miss)} (see docs/architecture.md, reward row)")
    if len(rewards) == 0:
        raise RouterLiteError("reward matrix is empty")
    if not 0.0 <= float(test_fraction) <= 1.0:
        raise RouterLiteError(f"test_fraction must be in [0, 1], got {test_fraction}")
    if rewards["task_id"].duplicated().any():
        dup = rewards.loc[rewards["task_id"].duplicated(), "task_id"].astype(str).tolist()[:5]
        raise RouterLiteError(f"reward matrix has duplicate task_id values: {dup}")
    models = [str(a) for a in _list(rewards["agent_order"].iloc[0], "agent_order of the first row")]
    if not models or len(set(models)) != len(models):
        raise RouterLiteError(f"agent_order of the first row is empty or repeats an agent: {models}")
    return models


def _price_vector(prices: Mapping[str, float], models: list[str]) -> np.ndarray:
    """USD per question of each agent of `models`, in that order."""
    missing_prices = [m for m in models if m not in prices]
    if missing_prices:
        raise RouterLiteError(f"prices lack agents {missing_prices} (have: {sorted(prices)})")
    try:
        price_vec = np.array([float(prices[m]) for m in models])
    except (TypeError, ValueError):
        raise RouterLiteError(f"prices must map agent -> USD per question (a number): {dict(prices)}") from None
    if not np.all(np.isfinite(price_vec)) or np.any(price_vec < 0):
        raise RouterLiteError(f"prices must be finite and >= 0: {dict(zip(models, price_vec))}")
    return price_vec


def _reward_arrays(rewards: pd.DataFrame, models: list[str], price_vec: np.ndarray | None):
    """(quality, cost), each (rows, agents) with columns in `models` order; NaN where a value is missing."""
    n, k = len(rewards), len(models)
    quality = np.empty((n, k))
    cost = np.empty((n, k))
    for i, row in enumerate(rewards.itertuples(index=False)):
        tid = str(row.task_id)
        order = [str(a) for a in _list(row.agent_order, f"agent_order of task {tid}")]
        if sorted(order) != sorted(models):
            raise RouterLiteError(f"task {tid}: agent_order {order} differs from the first row's {models}")
        pos = [order.index(m) for m in models]
        r = _list(row.mean_reward, f"mean_reward of task {tid}")
        if len(r) != len(order):
            raise RouterLiteError(f"task {tid}: {len(r)} mean_reward values for {len(order)} agents")
        quality[i] = [np.nan if r[p] is None else float(r[p]) for p in pos]
        if price_vec is not None:
            cost[i] = price_vec
        else:
            cvals = _list(row.mean_cost, f"mean_cost of task {tid}")
            if len(cvals) != len(order):
                raise RouterLiteError(f"task {tid}: {len(cvals)} mean_cost values for {len(order)} agents")
            cost[i] = [np.nan if cvals[p] is None else float(cvals[p]) for p in pos]
    return quality, cost


def _texts_and_split(tasks: pd.DataFrame | None, task_ids: np.ndarray, test_fraction: float, meta: dict):
    """(query texts, split) of `task_ids` from the tasks table, else empty texts and a hash split; notes the
    split rule in `meta`."""
    texts = [""] * len(task_ids)
    split = None
    if tasks is not None:
        if "task_id" not in tasks.columns:
            raise RouterLiteError("tasks table lacks a task_id column")
        t = tasks.drop_duplicates("task_id").set_index(tasks.drop_duplicates("task_id")["task_id"].astype(str))
        unknown = [tid for tid in task_ids if tid not in t.index]
        if unknown:
            raise RouterLiteError(f"{len(unknown)} reward rows have no task in the tasks table, e.g. {unknown[:3]}")
        if "prompt" in t.columns:
            texts = t.loc[task_ids, "prompt"].astype(str).tolist()
        if "split" in t.columns:
            split = t.loc[task_ids, "split"].astype(str).to_numpy(dtype=object)
    if split is None:
        split = np.array([_hash_split(tid, float(test_fraction)) for tid in task_ids], dtype=object)
        meta["split_rule"] = f"sha256(task_id) < {test_fraction} -> test"
    else:
        meta["split_rule"] = "tasks table"
    return texts, split


def build_own(rewards: pd.DataFrame, tasks: pd.DataFrame | None = None, *, test_fraction: float = 0.3) -> Profile:
    """Any reward matrix in our contract → Profile (cost = the matrix's mean_cost)."""
    return profile_from_rewards(rewards, tasks, name="own", test_fraction=test_fraction)


def _recorded_matrix(name: str, source: str):
    """Builder of a suite made from the active profile's reward matrix of replayed recordings + a price per question."""

    def build(rewards: pd.DataFrame, prices: Mapping[str, float], tasks: pd.DataFrame | None = None, *,
              test_fraction: float = 0.3) -> Profile:
        if prices is None:
            raise RouterLiteError(f"suite {name!r} needs prices: a mapping agent -> USD per question")
        profile = profile_from_rewards(rewards, tasks, name=name, prices=prices, test_fraction=test_fraction)
        profile.meta["source"] = source
        return profile

    build.__doc__ = f"{source} (suite {name!r})."
    return build


build_mmlu_pro_outputs = _recorded_matrix(
    "mmlu-pro-outputs", "MMLU-Pro reward matrix (TIGER-Lab official outputs, regraded) + prices per question")
build_zeroeval_outputs = _recorded_matrix(
    "zeroeval-outputs", "ZeroEval reward matrix (GSM8K, MATH level 5, CRUXEval replies, regraded) + estimated prices "
                        "per question (ceil(chars / 4) tokens x list price)")


PROFILE_BUILDERS = {
    "routerbench": build_routerbench,
    "mmlu-pro-outputs": build_mmlu_pro_outputs,
    "zeroeval-outputs": build_zeroeval_outputs,
    "own": build_own,
}
