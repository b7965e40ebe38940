"""The door of `router-lite train`: a user's reward rows and tasks files, checked before anything is embedded or
written. Every problem is one RouterLiteError naming the file, the row (1-based, with its task_id) and the field.

Formats by extension: .parquet, .jsonl / .jsonl.gz / .json (JSON lines), .csv (a header row; list fields such as
`agent_order` and `mean_reward` as JSON lists, e.g. `"[0.5, 1.0]"`, or Python list literals as pandas writes them).
"""
from __future__ import annotations

import ast
import io
import json
import math
import numbers
import reprlib
import tokenize
from pathlib import Path

import pandas as pd

from pipeline.core.errors import RouterLiteError

SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json", ".csv")
REWARD_COLUMNS = ("task_id", "agent_order", "mean_reward")
TASK_COLUMNS = ("task_id", "prompt", "split")
SPLITS = ("train", "validation", "test")  # pipeline.tasks.task_pool.SPLITS
LIST_FIELDS = ("agent_order", "mean_reward", "mean_cost", "best_agents", "answers")
MAX_ANSWER_CHARS = 5000  # an extracted answer is short (a number, a letter, a literal); longer is not an answer
LABEL_COLUMNS = ("source", "category", "domain", "difficulty")  # optional task labels, carried into `joined`


def read_rows(path: str | Path, what: str) -> pd.DataFrame:
    """One table file as a DataFrame: known extension, readable, at least one row."""
    from pipeline.tasks.sources import read_table

    path = Path(path)
    if not path.name.lower().endswith(SUFFIXES):
        raise RouterLiteError(f"{path}: unsupported {what} file type {''.join(path.suffixes) or '(none)'!r}; "
                              f"use one of {', '.join(SUFFIXES)}")
    if path.is_file() and path.stat().st_size == 0:
        raise RouterLiteError(f"{path}: the {what} file is empty")
    rows = read_table(path)  # names the file on a missing/corrupt file or a bad JSON line
    if not rows:
        raise RouterLiteError(f"{path}: the {what} file has no rows")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise RouterLiteError(f"{path}: row {bad + 1} is not an object with named fields")
    return pd.DataFrame(rows)


def _where(path, df: pd.DataFrame, i: int) -> str:
    return f"{path}: row {i + 1} (task_id {_cut(df['task_id'].iloc[i])})"


def _list(value, path, df, i, field) -> list:
    """A list field; CSV cells hold it as text ("[0.5, 1.0]"), other formats as a list."""
    if isinstance(value, str) and str(path).lower().endswith(".csv"):
        text = value
        if text.strip().startswith("[") and _no_separators(text):
            raise RouterLiteError(f"{_where(path, df, i)}: {field} {_cut(text)} lists items without commas between "
                                  "them; write a list cell as JSON, e.g. [\"agent_a\", \"agent_b\"]")
        try:
            value = json.loads(text)
        except ValueError:
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                raise RouterLiteError(f"{_where(path, df, i)}: {field} {text[:40]!r} is not a list") from None
    if hasattr(value, "tolist"):  # numpy array from Parquet
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise RouterLiteError(f"{_where(path, df, i)}: {field} must be a list, got {type(value).__name__} "
                              f"{str(value)[:40]!r}")
    return list(value)


def _ids(df: pd.DataFrame, path, what: str) -> pd.Series:
    """task_id as text: present in every row, unique."""
    ids = df["task_id"]
    for i, v in enumerate(ids):
        if v is None or (isinstance(v, float) and math.isnan(v)) or str(v).strip() == "":
            raise RouterLiteError(f"{path}: row {i + 1}: task_id is empty")
        if isinstance(v, (list, dict, tuple)) or hasattr(v, "tolist") and not isinstance(v, numbers.Number):
            raise RouterLiteError(f"{path}: row {i + 1}: task_id must be a string, got {type(v).__name__}")
    ids = ids.map(str)
    dup = ids[ids.duplicated(keep=False)]
    if len(dup):
        first = dup.iloc[0]
        rows = [int(i) + 1 for i in dup.index[dup == first]]
        others = dup.nunique() - 1
        raise RouterLiteError(f"{path}: task_id {_cut(first)} appears {len(rows):,} times in the {what} file "
                              f"(rows {_few(rows)})" + (f", and {others:,} other task_id(s) repeat too" if others
                                                         else "") + "; each task must appear once")
    return ids


def _cut(value, limit: int = 60) -> str:
    """A value from the user's file in a message, cut before rendering."""
    text = str(value)
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


_SHORT = reprlib.Repr()
_SHORT.maxlist, _SHORT.maxstring, _SHORT.maxother = 6, 40, 40


def _short(values) -> str:
    """A list from the user's file in a message: at most a few items, each cut."""
    return _SHORT.repr(values)


def _no_separators(text: str) -> bool:
    """True when a list cell has two items in a row without a comma (numpy's print form `['a' 'b']`, which Python
    would read as the one string 'ab')."""
    try:
        toks = [t for t in tokenize.generate_tokens(io.StringIO(text).readline)
                if t.type in (tokenize.STRING, tokenize.NUMBER, tokenize.OP, tokenize.NAME)]
    except (tokenize.TokenError, SyntaxError):
        return False
    items = (tokenize.STRING, tokenize.NUMBER, tokenize.NAME)
    return any(a.type in items and b.type in items for a, b in zip(toks, toks[1:]))


def _few(items, n: int = 5) -> str:
    """The first `n` of `items` and how many there are: a message stays one short line for any file size."""
    items = list(items)
    head = ", ".join(map(str, items[:n]))
    return head if len(items) <= n else f"{head}, ... {len(items):,} in all"


def _number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def check_rewards(df: pd.DataFrame, path) -> pd.DataFrame:
    """Reward rows: task_id (unique), agent_order (the same list of >= 2 distinct agents in every row),
    mean_reward (one number in [0, 1] per agent); optional mean_cost (numbers >= 0) and best_agents (agent names)."""
    missing = [c for c in REWARD_COLUMNS if c not in df]
    if missing:
        raise RouterLiteError(f"{path}: the rewards file lacks column(s) {missing} (needs {', '.join(REWARD_COLUMNS)})")
    df = df.reset_index(drop=True).copy()
    df["task_id"] = _ids(df, path, "rewards")
    agents = None
    cols = {f: [] for f in LIST_FIELDS if f in df}
    for i in range(len(df)):
        order = _list(df["agent_order"].iloc[i], path, df, i, "agent_order")
        if agents is None:
            if not all(isinstance(a, str) and a for a in order):
                raise RouterLiteError(f"{_where(path, df, i)}: agent_order must list agent names (strings)")
            if len(set(order)) != len(order):
                raise RouterLiteError(f"{_where(path, df, i)}: agent_order names an agent twice: "
                                      f"{_short(order)}")
            if len(order) < 2:
                raise RouterLiteError(f"{path}: agent_order {_short(order)} has {len(order)} agent(s); routing "
                                      "needs at least 2")
            agents = order
        elif order != agents:
            raise RouterLiteError(f"{_where(path, df, i)}: agent_order {_short(order)} differs from row 1's "
                                  f"{_short(agents)}")
        rewards = _list(df["mean_reward"].iloc[i], path, df, i, "mean_reward")
        if len(rewards) != len(agents):
            raise RouterLiteError(f"{_where(path, df, i)}: mean_reward has {len(rewards)} values for "
                                  f"{len(agents)} agents")
        for a, r in zip(agents, rewards):
            if not _number(r):
                raise RouterLiteError(f"{_where(path, df, i)}: mean_reward for agent {a!r} is "
                                      f"{type(r).__name__} {r!r}, not a number")
            if not math.isfinite(r) or not 0.0 <= r <= 1.0:
                raise RouterLiteError(f"{_where(path, df, i)}: mean_reward for agent {a!r} is {r}, outside [0, 1]")
        cols["agent_order"].append(order)
        cols["mean_reward"].append([float(r) for r in rewards])
        if "mean_cost" in cols:
            costs = _list(df["mean_cost"].iloc[i], path, df, i, "mean_cost")
            if len(costs) != len(agents):
                raise RouterLiteError(f"{_where(path, df, i)}: mean_cost has {len(costs)} values for "
                                      f"{len(agents)} agents")
            for a, c in zip(agents, costs):
                if c is not None and (not _number(c) or not (math.isnan(c) or c >= 0)):
                    raise RouterLiteError(f"{_where(path, df, i)}: mean_cost for agent {a!r} is {c!r}, not a "
                                          "number >= 0")
            cols["mean_cost"].append([float("nan") if c is None else float(c) for c in costs])
        if "best_agents" in cols:
            best = _list(df["best_agents"].iloc[i], path, df, i, "best_agents")
            unknown = [b for b in best if b not in agents]
            if unknown or not best:
                raise RouterLiteError(f"{_where(path, df, i)}: best_agents {_short(best)} must name agents of "
                                      f"agent_order {_short(agents)}")
            cols["best_agents"].append(best)
        if "answers" in cols:
            cols["answers"].append(_answers(df["answers"].iloc[i], path, df, i, agents))
    for f, values in cols.items():
        df[f] = pd.Series(values, index=df.index, dtype=object)
    return df


def _answers(value, path, df, i, agents) -> list:
    """`answers`: one extracted answer (text) or null per agent of agent_order (a cascade's evidence)."""
    ans = _list(value, path, df, i, "answers")
    if len(ans) != len(agents):
        raise RouterLiteError(f"{_where(path, df, i)}: answers has {len(ans)} values for {len(agents)} agents")
    out = []
    for a, v in zip(agents, ans):
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(None)
        elif isinstance(v, str) and len(v) <= MAX_ANSWER_CHARS:
            out.append(v if v.strip() else None)
        else:
            raise RouterLiteError(f"{_where(path, df, i)}: answers for agent {a!r} must be text of at most "
                                  f"{MAX_ANSWER_CHARS} characters or null, got {type(v).__name__} {str(v)[:40]!r}")
    return out


def check_tasks(df: pd.DataFrame, path) -> pd.DataFrame:
    """Tasks: task_id (unique), prompt (non-empty text), split (text); optional grader (a known grader name: the
    equivalence a cascade compares answers with)."""
    missing = [c for c in TASK_COLUMNS if c not in df]
    if missing:
        raise RouterLiteError(f"{path}: tasks file lacks column {missing[0]!r} (needs {', '.join(TASK_COLUMNS)})")
    df = df.reset_index(drop=True).copy()
    df["task_id"] = _ids(df, path, "tasks")
    for field in ("prompt", "split"):
        for i, v in enumerate(df[field]):
            if not isinstance(v, str) or not v.strip():
                raise RouterLiteError(f"{_where(path, df, i)}: {field} must be non-empty text, got "
                                      f"{type(v).__name__} {str(v)[:40]!r}")
    unknown = ~df["split"].isin(SPLITS)
    if unknown.any():  # a row of another split would be left out of training and evaluation without a word
        i = int(unknown.to_numpy().argmax())
        raise RouterLiteError(f"{_where(path, df, i)}: split {_cut(df['split'].iloc[i])} is not one of "
                              f"{', '.join(SPLITS)} ({int(unknown.sum()):,} row(s) with another split)")
    if "grader" in df:
        from pipeline.collect.grading import GRADERS

        for i, v in enumerate(df["grader"]):
            if v not in GRADERS:
                raise RouterLiteError(f"{_where(path, df, i)}: grader {str(v)[:40]!r} is not a known grader; known: "
                                      f"{', '.join(GRADERS)}")
    return df


def train_inputs(rewards_path, tasks_path, held_out: str = "test"):
    """(rewards, tasks, joined) for `router-lite train`: both files checked, every reward row's task present,
    `held_out` and 'train' among the splits of the rewarded tasks."""
    rewards = check_rewards(read_rows(rewards_path, "rewards"), rewards_path)
    tasks = check_tasks(read_rows(tasks_path, "tasks"), tasks_path)
    # the tasks file is authoritative for what it holds (a published rewards dataset carries split and source too)
    cols = ["task_id", "prompt", "split", *[c for c in (*LABEL_COLUMNS, "grader", "user_text") if c in tasks]]
    joined = rewards.drop(columns=[c for c in cols[1:] if c in rewards]).merge(tasks[cols], on="task_id", how="left")
    if joined["prompt"].isna().any():
        i = int(joined["prompt"].isna().to_numpy().argmax())
        raise RouterLiteError(f"{rewards_path}: row {i + 1}: task {joined['task_id'].iloc[i]!r} has no row in "
                              f"{tasks_path}")
    splits = sorted(set(joined["split"]))
    if held_out not in splits:
        raise RouterLiteError(f"--held-out-split {held_out!r} is not a split of the rewarded tasks in {tasks_path} "
                              f"(splits: {', '.join(splits)})")
    if "train" not in splits or held_out == "train":
        raise RouterLiteError(f"{tasks_path}: no rewarded task has split 'train' apart from the held-out split "
                              f"(splits: {', '.join(splits)})")
    return rewards, tasks, joined
