"""What `router-lite serve` (no --head) gives plain OpenAI requests after `router-lite run`: the ★ router of the
home's latest run at the profile's serve.target, asked the held-out test questions exactly as recorded, with no
answer format in the request. Prints the format guess's accuracy on every test prompt (offline, from the home's
embeddings), then, for the first N test prompts sent through a real `router-lite serve` subprocess, the served
accuracy (graded like the pipeline) and cost against the best single agent's on the same prompts.

With `--guard`: every held-out test question is sent once as a user types it (its user text, bare) and once as the
agents' prompt (the benchmark's template pasted), and the share of replies with `X-Router-OOD: true` is printed for
each (a bare question is not in the replay pool's recordings: its reply is an upstream error, the decision headers
are there all the same). An open-ended profile's instructions (`chat`: no template) are sent once, as written.

With `--open-ended-profile P` (e.g. chat): one `serve --profile PROFILE --open-ended-profile P` serves both worlds
(docs/serving.md, "Both worlds in one endpoint"); every held-out test question of PROFILE (bare and templated) and
every held-out instruction of P is sent once, and for each set the share answered by each world (`X-Router-World`)
and the share flagged `X-Router-OOD` by the router that answered are printed.

    python scripts/serve_star.py [--profile demo] [--n 60] [--guard] [--open-ended-profile chat]
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    import httpx
    import numpy as np
    import pandas as pd

    from cli import lineage
    from pipeline.collect.grading import grade
    from pipeline.collect.rewards import to_arrays
    from pipeline.route import registry
    from pipeline.route.fit import reward_embeddings
    from pipeline.route.formats import FormatGuess
    from resources.storage import default_home

    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--n", type=int, default=60)
    ap.add_argument("--guard", action="store_true", help="the OOD guard's rate on bare and templated test questions")
    ap.add_argument("--open-ended-profile", default=None, help="serve both worlds; the world each held-out prompt "
                                                                "of both profiles is answered in")
    args = ap.parse_args(argv)
    home = Path(default_home()).resolve()
    latest = registry.latest_entry(home / "registry")
    pool = lineage.load("task_pool", args.profile)
    train = pool[(pool["split"] == "train") & ~pool["ood"]]
    test = pool[(pool["split"] == "test") & ~pool["ood"]]
    emb = lineage.load("prompt_embeddings", args.profile)  # read once; rows in each frame's task order
    guess = FormatGuess(reward_embeddings(emb, train), train["grader"].tolist())
    g = guess.guess(reward_embeddings(emb, test))
    right = np.mean([a == b for a, b in zip(g, test["grader"])])
    none = np.mean([a is None for a in g])
    print(f"★ {latest['star']['label']}: {latest['name']} at {latest['star']['target']}; held-out (router_value): "
          f"{latest['star']['held_out']}")
    print(f"format guess on {len(test)} test prompts: {right:.4f} right, {none:.4f} no guess (prompt-only)")

    rewards = lineage.load("reward_matrix", args.profile)
    agents, R, _, C = to_arrays(rewards)
    best = agents.index(json.loads((home / "reports" / "router_value.json").read_text())["best_single"]["agent"])
    by_task = {t: i for i, t in enumerate(rewards["task_id"])}
    sample = test.iloc[: args.n]
    if args.open_ended_profile:
        offline_worlds(args.profile, args.open_ended_profile)
        other = lineage.load("task_pool", args.open_ended_profile)
        other = other[(other["split"] == "test") & ~other["ood"]]
        with serving(args.profile, ["--open-ended-profile", args.open_ended_profile]) as (port, startup):
            world_rates(port, phrasings(test) + [(f"{args.open_ended_profile} {name}", texts)
                                                 for name, texts in phrasings(other)])
        print("\n".join(startup))
        return 0
    with serving(args.profile) as (port, startup):
        if args.guard:
            return guard_rates(port, test, startup)
        rows = []
        for t in sample.itertuples():
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300,
                           json={"messages": [{"role": "user", "content": t.prompt}]})
            body = r.json()
            text = body["choices"][0]["message"]["content"] if r.status_code == 200 else None
            i = by_task[t.task_id]
            rows.append({"status": r.status_code, "correct": bool(grade(text, t.gold, t.grader)[1]) if text else False,
                         "cost": float(r.headers.get("x-router-cost-usd", "nan")),
                         "calls": len((r.headers.get("x-router-agents-called") or r.headers["x-router-agent"])
                                      .split(",")),
                         "guessed": r.headers.get("x-router-grader-source") == "guessed",
                         "best_reward": float(R[i, best]), "best_cost": float(C[i, best])})
    df = pd.DataFrame(rows)
    print(startup[0] if startup else "(no startup line)")
    print(f"served {len(df)} plain held-out prompts: status {df['status'].value_counts().to_dict()}, "
          f"{df['guessed'].mean():.2f} with a guessed format, {df['calls'].mean():.2f} calls per prompt")
    print(f"accuracy {df['correct'].mean():.4f} vs best single {agents[best]} {df['best_reward'].mean():.4f} "
          f"(ratio {df['correct'].mean() / df['best_reward'].mean():.3f}); cost {1000 * df['cost'].mean():.4f} vs "
          f"{1000 * df['best_cost'].mean():.4f} USD per 1k (ratio {df['cost'].mean() / df['best_cost'].mean():.3f})")
    return 0


@contextlib.contextmanager
def serving(profile: str, more: list[str] = ()):
    """A `router-lite serve --profile P` subprocess (with the options `more`) on a free loopback port: (port, its
    startup lines once stopped)."""
    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "serve", "--profile", profile, "--port",
                             str(port), "--workers", "1", "--access-log", "off", *more], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stderr=subprocess.PIPE, text=True)
    startup: list[str] = []
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                if proc.poll() is not None:
                    raise SystemExit(proc.stderr.read()) from None
                time.sleep(1)
        yield port, startup
    finally:
        proc.terminate()
        startup += [line for line in proc.stderr.read().splitlines() if "router-lite serve:" in line]
        proc.wait(30)


def phrasings(test) -> list:
    """(name, texts) of the held-out questions: bare (the user's text, the benchmark's template removed) and
    templated (the prompt as recorded); an open-ended source (AlpacaEval) has no template: its instructions once,
    as written."""
    from pipeline.core.prompts import user_text

    bare = test["prompt"].map(user_text)
    if (bare == test["prompt"].str.strip()).all():  # user_text trims: no template, only surrounding whitespace
        return [("as written", test["prompt"])]
    return [("bare", bare), ("templated", test["prompt"])]


def guard_rates(port: int, test, startup: list[str]) -> int:
    """Each test question sent once bare and once templated; the OOD guard's rate (and statuses) of each."""
    import httpx

    out = {}
    for phrasing, texts in phrasings(test):
        ood, status = [], {}
        for text in texts:
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300,
                           json={"messages": [{"role": "user", "content": text}]})
            ood.append(r.headers.get("x-router-ood") == "true")
            status[r.status_code] = status.get(r.status_code, 0) + 1
        out[phrasing] = {"n": len(ood), "ood_rate": sum(ood) / max(len(ood), 1), "status": status}
        print(f"{phrasing}: X-Router-OOD true on {sum(ood)}/{len(ood)} = {out[phrasing]['ood_rate']:.1%} "
              f"(status {status})", flush=True)
    print(json.dumps(out))
    return 0


def offline_worlds(verifiable: str, open_ended: str) -> None:
    """The world rule on the lineages' stored embeddings, per split (validation chose it; test reports it): the share
    of each profile's prompts sent to the wrong world by serve's rule (the verifiable ★'s OOD guard fired, or no
    answer format guessed: pipeline/serve/worlds.py) and by the rule it was compared with (also: the prompt is nearer
    the open-ended router's training prompts than the verifiable one's, each distance over its own guard's
    threshold)."""
    import numpy as np

    from cli import lineage
    from cli.main import _format_guess
    from pipeline.profile import load_profile
    from pipeline.route import registry
    from pipeline.route.served import auto_view
    from resources.storage import home_of

    def lineage_of(name):
        prof = load_profile(name)
        reg = registry.load(registry.latest_entry(home_of(prof) / "registry")["path"])
        emb = lineage.read("prompt_embeddings", prof).set_index("task_id")
        return prof, reg, lineage.read("task_pool", prof), emb

    (vprof, vreg, vpool, vemb), (_, oreg, opool, oemb) = lineage_of(verifiable), lineage_of(open_ended)
    view = auto_view(vreg, _format_guess(vreg, vprof), vprof.serve.target)
    for split in ("validation", "test"):
        for name, pool, emb, wanted_open in ((verifiable, vpool, vemb, False), (open_ended, opool, oemb, True)):
            ids = pool.loc[(pool["split"] == split) & ~pool["ood"].astype(bool), "task_id"]
            X = np.stack([emb.loc[i, "embedding"] for i in ids]).astype(np.float32)
            _, fired, guessed = view.route(X)
            served = fired | (guessed < 0)
            nearer = (oreg.guard.distance(X) / oreg.guard.threshold) < (vreg.guard.distance(X) / vreg.guard.threshold)
            wrong = {rule: float(np.mean(sent != wanted_open)) for rule, sent in (("served", served),
                                                                                  ("or nearer", served | nearer))}
            print(f"offline {split} {name} n={len(X)}: to the wrong world {wrong['served']:.1%} (served rule), "
                  f"{wrong['or nearer']:.1%} (or nearer the open-ended prompts)", flush=True)


def world_rates(port: int, sets: list) -> dict:
    """Each (name, texts) set sent once: the share answered by each world and flagged OOD, and the statuses."""
    import collections

    import httpx

    out = {}
    for name, texts in sets:
        worlds, ood, status = collections.Counter(), 0, collections.Counter()
        for text in texts:
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=300,
                           json={"messages": [{"role": "user", "content": text}]})
            worlds[r.headers.get("x-router-world")] += 1
            ood += r.headers.get("x-router-ood") == "true"
            status[r.status_code] += 1
        n = max(len(texts), 1)
        out[name] = {"n": len(texts), "world": {w: c / n for w, c in worlds.items()}, "ood_rate": ood / n,
                     "status": dict(status)}
        print(f"{name}: n={len(texts)}, answered by " + ", ".join(f"{w} {c / n:.1%}" for w, c in worlds.items())
              + f"; X-Router-OOD true on {ood / n:.1%} (status {dict(status)})", flush=True)
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(main())
