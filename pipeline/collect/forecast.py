"""`forecast(...)`: what a collection will cost before any paid call. No call, no key: the calls still wanted (the
task pool x agents x repetitions, less the call log's done calls) and a USD range per agent and in all.

Per call, for an agent priced `p_in` / `p_out` USD per million tokens:

- prompt tokens: ceil(characters / 4) (the estimate the replay and the stand-in count with) for the low and the
  expected figure; for the high figure the prompt's UTF-8 bytes + `TEMPLATE_TOKENS` (a byte-level tokenizer never
  makes more tokens than bytes; the chat template adds a few): a bound, not an estimate.
- completion tokens: low = the 5th percentile, expected = the mean of the agent's recorded calls (done rows of the
  call log under the same call settings, at least `MIN_MEASURED` of them); without them the pre-flight's shortest
  reply for the low figure; else the stated defaults `DEFAULT_COMPLETION_LOW` / `DEFAULT_COMPLETION_MEAN`.
  High = the profile's `max_tokens` on every call.
- prices: the list price (config/prices.yaml, on the agent); where the provider's models endpoint gave one (a key is
  set) low takes the lower and high the higher of the two, expected the provider's.

A new agent collected on a sample (`collection.new_agent_sample`; `sampled`: agent -> fraction) is asked, per source
and repetition, `sampling.sample_size` of the source's tasks, which ones chosen only once the existing agents have
answered: its calls are that size less the sample's tasks already logged, between `calls_low` (every logged task in
the sample) and `calls` (none); its prompt tokens range from the shortest to the longest prompts of that many
not-yet-logged tasks (expected: their mean). Its remaining calls, when the decision says it may join, are the next
collection's and are forecast then (the agent is no longer in `sampled`).

`call_cost_high` is the worst case of one call: what the budget (`pipeline.collect.budget`) reserves before sending.
"""
from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping

import pandas as pd

from pipeline.collect.agents import AgentSpec
from pipeline.collect.call_log import DONE_STATUSES, call_key
from pipeline.collect.replay import approx_tokens
from pipeline.collect.sample_size import sample_size
from pipeline.collect.settings import CollectionSettings

TEMPLATE_TOKENS = 32  # chat-template tokens around one user message, on the high side
MIN_MEASURED = 5  # recorded calls of an agent before their lengths replace the defaults
DEFAULT_COMPLETION_LOW = 8  # tokens: a bare answer line ("The answer is (C).")
DEFAULT_COMPLETION_MEAN = 512  # tokens: a worked answer, stated when nothing was measured


def prompt_tokens_high(prompt: str) -> int:
    """An upper bound of a prompt's tokens: its UTF-8 bytes + the chat template."""
    return len(prompt.encode("utf-8")) + TEMPLATE_TOKENS


def call_cost_high(agent: AgentSpec, prompt: str, max_tokens: int, price: tuple[float, float] | None = None) -> float:
    """The most one call of `agent` on `prompt` can cost: bound prompt tokens + `max_tokens` completion tokens, at
    `price` (USD per million tokens in / out; default the agent's list price)."""
    p_in, p_out = price or (agent.price_in_per_mtok, agent.price_out_per_mtok)
    return (prompt_tokens_high(prompt) * p_in + int(max_tokens) * p_out) / 1e6


def completion_lengths(calls: pd.DataFrame | None, preflight: pd.DataFrame | None = None) -> dict[str, dict]:
    """Per agent the completion tokens a forecast uses: {low, mean, n, source} from recorded done calls (columns
    agent, status, completion_tokens), else the pre-flight's shortest reply (column min_completion_tokens) for low."""
    out: dict[str, dict] = {}
    if preflight is not None and len(preflight) and "min_completion_tokens" in preflight.columns:
        for _, r in preflight.iterrows():
            if pd.notna(r["min_completion_tokens"]) and int(r.get("n_ok", 0) or 0) > 0:
                out[str(r["agent"])] = {"low": float(r["min_completion_tokens"]),
                                        "mean": float(DEFAULT_COMPLETION_MEAN), "n": int(r["n_ok"]),
                                        "source": "pre-flight (low only)"}
    if calls is not None and len(calls):
        done = calls[calls["status"].isin(DONE_STATUSES) & calls["completion_tokens"].notna()]
        for agent, ct in done.groupby("agent")["completion_tokens"]:
            if len(ct) >= MIN_MEASURED:
                ct = ct.astype(float)
                out[str(agent)] = {"low": float(ct.quantile(0.05)), "mean": float(ct.mean()), "n": int(len(ct)),
                                   "source": "recorded calls"}
    return out


def _price_range(agent: AgentSpec, live: Mapping[str, tuple[float, float]] | None):
    listed = (agent.price_in_per_mtok, agent.price_out_per_mtok)
    got = (live or {}).get(agent.model)
    if got is None:
        return listed, listed, listed, "list"
    low = (min(listed[0], got[0]), min(listed[1], got[1]))
    high = (max(listed[0], got[0]), max(listed[1], got[1]))
    return low, tuple(got), high, "provider models endpoint + list"


def forecast(tasks: pd.DataFrame, agents: list[AgentSpec], repetitions: int, settings: CollectionSettings,
             done_keys: Iterable[str] = (), lengths: Mapping[str, dict] | None = None,
             live_prices: Mapping[str, tuple[float, float]] | None = None,
             sampled: Mapping[str, float] | None = None) -> dict:
    """The calls of (tasks x agents x repetitions 0..repetitions-1) not in `done_keys` (for an agent of `sampled`,
    the sample's), and their USD range: {calls, calls_low, calls_total, calls_done, usd_low, usd_expected, usd_high,
    max_tokens, sampled, per_agent: {agent: {...}}}."""
    done = set(done_keys)
    sh = settings.hash()
    ids = [str(t) for t in tasks["task_id"]]
    est = [approx_tokens(p) for p in tasks["prompt"]]
    high = [prompt_tokens_high(p) for p in tasks["prompt"]]
    sources = [str(s) for s in tasks["source"]] if "source" in tasks.columns else [""] * len(ids)
    sampled = dict(sampled or {})
    per_agent = {}
    for a in agents:
        by_rep = [[i for i, t in enumerate(ids) if call_key(a.name, t, r, sh) not in done] for r in range(repetitions)]
        todo = [i for rep in by_rep for i in rep]
        if a.name in sampled:
            n, n_low, pt_low, pt_est, pt_high = _sampled_calls(by_rep, sources, est, high, sampled[a.name])
        else:
            n = n_low = len(todo)
            pt_est, pt_high = sum(est[i] for i in todo), sum(high[i] for i in todo)
            pt_low = pt_est
        ln = dict((lengths or {}).get(a.name) or {"low": float(DEFAULT_COMPLETION_LOW),
                                                   "mean": float(DEFAULT_COMPLETION_MEAN), "n": 0,
                                                   "source": "default"})
        cap = float(settings.max_tokens)  # no reply is longer than max_tokens
        ln["low"], ln["mean"] = min(ln["low"], cap), min(ln["mean"], cap)
        p_low, p_exp, p_high, price_source = _price_range(a, live_prices)
        per_agent[a.name] = {
            "model": a.model, "calls": n, "calls_low": n_low, "calls_total": len(ids) * repetitions,
            "calls_done": len(ids) * repetitions - len(todo), "prompt_tokens": pt_est,
            "sample_fraction": sampled.get(a.name),
            "completion_tokens_low": ln["low"], "completion_tokens_mean": ln["mean"],
            "completion_measured_n": ln["n"], "completion_source": ln["source"],
            "price_in_per_mtok": p_exp[0], "price_out_per_mtok": p_exp[1], "price_source": price_source,
            "usd_low": (pt_low * p_low[0] + n_low * ln["low"] * p_low[1]) / 1e6,
            "usd_expected": (pt_est * p_exp[0] + (n + n_low) / 2 * ln["mean"] * p_exp[1]) / 1e6,
            "usd_high": (pt_high * p_high[0] + n * int(settings.max_tokens) * p_high[1]) / 1e6,
        }
    judge = _judge_forecast(tasks, agents, repetitions, settings, done, per_agent, live_prices)
    if judge is not None:
        per_agent[judge[0]] = judge[1]
    total = {k: sum(v[k] for v in per_agent.values()) for k in ("calls", "calls_low", "calls_total", "calls_done")}
    usd = {k: math.fsum(v[k] for v in per_agent.values()) for k in ("usd_low", "usd_expected", "usd_high")}
    return {**total, **usd, "max_tokens": int(settings.max_tokens), "repetitions": int(repetitions),
            "tasks": len(ids), "sampled": sorted(a.name for a in agents if a.name in sampled),
            "per_agent": per_agent}


def _judge_forecast(tasks: pd.DataFrame, agents: list[AgentSpec], repetitions: int, settings, done: set,
                    per_agent: dict, live_prices) -> tuple[str, dict] | None:
    """The judge's calls and cost (pipeline/collect/judge.py) when tasks are judge-graded: per not-yet-logged call
    of an agent other than the reference, one judge call per order (`position: both` = 2). Its prompt holds the
    judge's text, the instruction and two replies: expected = each reply at its agent's expected completion length
    (the reference's for the reference reply), low = at their low lengths, high = both replies at `max_tokens`
    and the prompt's bytes; its completion is `judge.max_tokens` tokens. A collection the judge has not begun
    costs these calls on top of the agents' (the `judge:<model>` row)."""
    from pipeline.collect.judge import JUDGE_GRADER, PROMPT_HEAD, judge_agent

    js = getattr(settings, "judge", None)
    if "grader" not in tasks.columns or js is None or not js.model or not js.reference:
        return None
    judged = [i for i, g in enumerate(tasks["grader"]) if g == JUDGE_GRADER]
    ref = next((a for a in agents if a.name == js.reference), None)
    if not judged or ref is None:
        return None
    judge = judge_agent(js, ref)
    per_call = 2 if js.position == "both" else 1
    sh = settings.hash()
    ids = [str(t) for t in tasks["task_id"]]
    prompts = [str(p) for p in tasks["prompt"]]
    head = approx_tokens(PROMPT_HEAD)
    cap = int(settings.max_tokens)
    n = n_all = 0
    pt_low = pt_est = pt_high = 0.0
    ref_len = per_agent[ref.name]
    for a in agents:
        if a.name == ref.name:
            continue
        ln = per_agent[a.name]
        for r in range(repetitions):
            for i in judged:
                n_all += per_call
                if call_key(a.name, ids[i], r, sh) in done:
                    continue
                n += per_call
                base = head + approx_tokens(prompts[i])
                pt_low += per_call * (base + ln["completion_tokens_low"] + ref_len["completion_tokens_low"])
                pt_est += per_call * (base + ln["completion_tokens_mean"] + ref_len["completion_tokens_mean"])
                pt_high += per_call * (prompt_tokens_high(PROMPT_HEAD + prompts[i]) + 2 * cap)
    p_low, p_exp, p_high, price_source = _price_range(judge, live_prices)
    ct = int(js.max_tokens)
    return judge.name, {
        "model": judge.model, "calls": n, "calls_low": n, "calls_total": n_all, "calls_done": n_all - n,
        "prompt_tokens": pt_est, "sample_fraction": None, "completion_tokens_low": float(ct),
        "completion_tokens_mean": float(ct), "completion_measured_n": 0, "completion_source": "judge max_tokens",
        "price_in_per_mtok": p_exp[0], "price_out_per_mtok": p_exp[1], "price_source": price_source,
        "usd_low": (pt_low * p_low[0] + n * ct * p_low[1]) / 1e6,
        "usd_expected": (pt_est * p_exp[0] + n * ct * p_exp[1]) / 1e6,
        "usd_high": (pt_high * p_high[0] + n * ct * p_high[1]) / 1e6,
    }


def forecast_table(fc: Mapping) -> str:
    """The forecast as a printable table: one row per agent and the total."""
    rows = [{"agent": a, "model": v["model"], "calls": v["calls"], "done": v["calls_done"],
             "usd_low": v["usd_low"], "usd_expected": v["usd_expected"], "usd_high": v["usd_high"],
             "completion": f"{v['completion_tokens_mean']:.0f} ({v['completion_source']})",
             "price": v["price_source"]} for a, v in fc["per_agent"].items()]
    rows.append({"agent": "total", "model": "", "calls": fc["calls"], "done": fc["calls_done"],
                 "usd_low": fc["usd_low"], "usd_expected": fc["usd_expected"], "usd_high": fc["usd_high"],
                 "completion": "", "price": ""})
    df = pd.DataFrame(rows)
    for c in ("usd_low", "usd_expected", "usd_high"):
        df[c] = df[c].map(lambda x: f"{x:,.4f}")
    df["calls"] = df["calls"].map(lambda x: f"{x:,}")
    return df.to_string(index=False)


def forecast_line(fc: Mapping) -> str:
    """One line: calls and the USD range."""
    sampled = fc.get("sampled") or []
    on_sample = (f"; {', '.join(sampled)} on a sample: {fc.get('calls_low', fc['calls']):,} to {fc['calls']:,} calls"
                 if sampled else "")
    return (f"{fc['calls']:,} calls wanted ({fc['calls_done']:,} of {fc['calls_total']:,} done{on_sample}), "
            f"USD {fc['usd_low']:,.4f} .. {fc['usd_high']:,.4f} (expected {fc['usd_expected']:,.4f}; high = "
            f"max_tokens {fc['max_tokens']} on every call)")


def _sampled_calls(by_rep: list[list[int]], sources: list[str], est: list[int], high: list[int],
                   fraction: float) -> tuple[int, int, int, float, int]:
    """(calls high, calls low, prompt tokens low, expected, high) of a sampled agent whose not-yet-logged tasks are
    `by_rep` (task indices per repetition): per source and repetition the sample's size, less what may already be
    logged, over the shortest / mean / longest prompts of what is left."""
    size = collections.Counter(sources)
    n = n_low = pt_low = pt_high = 0
    pt_est = 0.0
    for rep in by_rep:
        left: dict[str, list[int]] = collections.defaultdict(list)
        for i in rep:
            left[sources[i]].append(i)
        for src, idx in left.items():
            k = sample_size(size[src], fraction)
            hi, lo = min(k, len(idx)), max(0, k - (size[src] - len(idx)))  # lo: every logged task in the sample
            by_est = sorted(est[i] for i in idx)
            n, n_low = n + hi, n_low + lo
            pt_low += sum(by_est[:lo])
            pt_est += (lo + hi) / 2 * (sum(by_est) / len(by_est))
            pt_high += sum(sorted((high[i] for i in idx), reverse=True)[:hi])
    return n, n_low, pt_low, pt_est, pt_high
