"""Cascade policies: ask cheap agents first, accept their answer when they agree, escalate when they do not.

A policy is an ordered list of stages. Stage t calls `agents` (in parallel; an agent already called is not called
again) and accepts when at least `k` of the agents called so far give equivalent answers (the task's grader decides
equivalence: pipeline/collect/answers.py); the accepted reply is that of the agreeing agent with the best training
accuracy. The last stage has one agent and answers without condition. The prompt router may add two shortcuts,
each a threshold on its predicted success (the value scorer's calibrated predicted reward) of the first stage's
lead agent: below `skip_below` the cheap stages are skipped (the query looks hard: straight to the last agent);
at or above `accept_above` the lead agent alone is asked and its reply accepted without a check.

Everything here is a pure function of arrays, so a policy is scored exactly on the static reward matrix:
R (n, K) rewards, C (n, K) costs, E (n, K, K) agreement, P (n, K) predicted success. Cost is every call made,
including those of stages that escalated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.core.errors import RouterLiteError
from pipeline.route.routers import register_router


@dataclass(frozen=True)
class Stage:
    agents: tuple[int, ...]  # agent indices called at this stage
    k: int = 0  # accept when >= k of the agents called so far agree; 0: answer without condition (last stage)


@dataclass(frozen=True)
class Policy:
    stages: tuple[Stage, ...]
    skip_below: float | None = None  # predicted success of the lead agent below this: skip to the last stage
    accept_above: float | None = None  # at or above this: ask the lead agent alone and accept its reply

    def __post_init__(self) -> None:
        if not self.stages:
            raise RouterLiteError("a cascade policy needs at least one stage")
        last = self.stages[-1]
        if len(last.agents) != 1 or last.k != 0:
            raise RouterLiteError(f"a cascade's last stage asks one agent and answers without condition, got {last}")
        for s in self.stages[:-1]:
            if not s.agents or not 1 <= s.k:
                raise RouterLiteError(f"a cascade stage before the last needs agents and k >= 1, got {s}")

    @property
    def lead(self) -> int:
        return self.stages[0].agents[0]

    @property
    def final(self) -> int:
        return self.stages[-1].agents[0]

    def to_dict(self, agents: list[str]) -> dict:
        return {"stages": [{"agents": [agents[j] for j in s.agents], "k": s.k} for s in self.stages],
                "skip_below": self.skip_below, "accept_above": self.accept_above}

    @classmethod
    def from_dict(cls, d: dict, agents: list[str]) -> Policy:
        if not isinstance(d, dict) or not isinstance(d.get("stages"), list):
            raise RouterLiteError(f"cascade policy must be an object with a 'stages' list, got {str(d)[:80]!r}")
        pos = {a: j for j, a in enumerate(agents)}
        stages = []
        for s in d["stages"]:
            names = s.get("agents") if isinstance(s, dict) else None
            if not isinstance(names, list) or any(a not in pos for a in names):
                raise RouterLiteError(f"cascade stage {str(s)[:80]!r}: agents must be a list of {agents}")
            k = s.get("k", 0)
            if isinstance(k, bool) or not isinstance(k, int):
                raise RouterLiteError(f"cascade stage {str(s)[:80]!r}: k must be an integer")
            stages.append(Stage(tuple(pos[a] for a in names), k))
        thresholds = []
        for key in ("skip_below", "accept_above"):
            v = d.get(key)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v)):
                raise RouterLiteError(f"cascade policy: {key} must be a finite number or null, got {v!r}")
            thresholds.append(None if v is None else float(v))
        return cls(tuple(stages), *thresholds)

    def describe(self, agents: list[str]) -> str:
        parts = []
        if self.accept_above is not None:
            parts.append(f"if the head predicts {agents[self.lead]} succeeds (>= {self.accept_above:.2f}): "
                         f"{agents[self.lead]} alone")
        if self.skip_below is not None:
            parts.append(f"if it predicts < {self.skip_below:.2f}: {agents[self.final]} directly")
        called: list[int] = []
        for s in self.stages:
            new = [j for j in s.agents if j not in called]
            called += new
            if s.k:
                parts.append(f"ask {' + '.join(agents[j] for j in new)}; accept if {s.k} of "
                             f"{{{', '.join(agents[j] for j in called)}}} agree")
            else:
                parts.append(f"else {agents[s.agents[0]]}")
        return "; ".join(parts)


@dataclass(frozen=True)
class Outcome:
    reward: np.ndarray  # (n,) reward of the reply returned
    cost: np.ndarray  # (n,) summed cost of every call made
    answered_by: np.ndarray  # (n,) agent index whose reply is returned
    n_calls: np.ndarray  # (n,) calls made
    stage: np.ndarray  # (n,) index of the stage that answered (-1: accepted alone, -2: skipped to the last)


def preference_rank(order) -> np.ndarray:
    """rank[j] = position of agent j in `order` (agent preference, best first)."""
    order = np.asarray(order, dtype=np.int64)
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    return rank


def agreeing_rep(E: np.ndarray, called: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row: (size of the largest class of agreeing answers among the `called` agents (n, K) bool, the agent
    of that class that comes first in `order` (agent preference, best first)). Ties between classes of equal size
    go to the class holding the preferred agent."""
    n, K = called.shape
    cm = called[:, :, None] & called[:, None, :]
    counts = (E & cm).sum(axis=2) * called  # (n, K): agents agreeing with j (itself included), among the called
    size = counts.max(axis=1)
    best = np.where(counts == size[:, None], preference_rank(order)[None, :], K + 1)
    return size, order[np.minimum(best.min(axis=1), K - 1)]


def agreeing_answer(answers: dict[int, str | None], K: int, order: np.ndarray, agree) -> tuple[int, int]:
    """`agreeing_rep` for one query whose answers are in hand (agent -> answer or None; `agree(a, b)` compares two
    answers): (size of the largest agreeing class, its preferred agent). The live executors use it."""
    called = np.zeros((1, K), dtype=bool)
    E = np.zeros((1, K, K), dtype=bool)
    for a, x in answers.items():
        called[0, a] = True
        for b, y in answers.items():
            E[0, a, b] = x is not None and y is not None and (a == b or agree(x, y))
    size, rep = agreeing_rep(E, called, order)
    return int(size[0]), int(rep[0])


ALONE, SKIPPED, STAGES = -1, -2, -3  # Outcome.stage of a row a prompt shortcut answered; STAGES: it did not


def alone(j: int) -> Policy:
    """The one-stage policy that asks agent `j` and answers without condition (a single agent)."""
    return Policy((Stage((int(j),)),))


def policy_for(policy: Policy, direct: int) -> Policy:
    """What one query runs: `policy`, or agent `direct` alone when a prompt shortcut or the OOD guard chose one
    (`direct` >= 0)."""
    return alone(direct) if direct >= 0 else policy


def shortcuts(policy: Policy, p: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """The prompt shortcuts of `policy` per row, from `p` (n,) the prompt router's predicted success of its lead
    agent: (code, agent) with code ALONE and the lead where p >= accept_above (checked first: it wins where both
    thresholds hold), SKIPPED and the last agent where p < skip_below, else STAGES and -1 (run the stages)."""
    if uses_prediction(policy) and p is None:
        raise RouterLiteError("this cascade uses the prompt router's predictions; none were given")
    n = 0 if p is None else len(p)
    code, agent = np.full(n, STAGES, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    if policy.accept_above is not None:
        code[p >= policy.accept_above] = ALONE
    if policy.skip_below is not None:
        code[(code == STAGES) & (p < policy.skip_below)] = SKIPPED
    agent[code == ALONE], agent[code == SKIPPED] = policy.lead, policy.final
    return code, agent


def uses_prediction(policy: Policy) -> bool:
    """Whether `policy`'s shortcuts read the prompt router's predicted success."""
    return policy.skip_below is not None or policy.accept_above is not None


def new_agents(stage: Stage, called) -> list[int]:
    """The agents `stage` asks that were not called at an earlier stage (an agent is never called twice)."""
    return [j for j in stage.agents if j not in called]


def stage_step(stage: Stage, answers: dict[int, str | None], K: int, order: np.ndarray, agree) -> int | None:
    """One stage's rule on one query, once its new agents answered (`answers`: every agent called so far ->
    answer or None): the agent whose reply is accepted, None to escalate. The last stage (k = 0) accepts its agent;
    another accepts the preferred agent of the largest agreeing class when at least k agree."""
    if stage.k == 0:
        return stage.agents[0]
    size, rep = agreeing_answer(answers, K, order, agree)
    return rep if size >= stage.k else None


def policy_agents(policy: Policy) -> np.ndarray:
    """The agents `policy` can call (every stage's; the shortcuts' lead and last agent are among them), ascending."""
    return np.array(sorted({j for s in policy.stages for j in s.agents}), dtype=np.int64)


def sub_agreement(E, agents: np.ndarray) -> np.ndarray:
    """E restricted to `agents` (ascending indices): (n, L, L) bool. `E` is the (n, K, K) tensor or a lazy
    pipeline.collect.answers.Agreement, which compares only these agents' answers (the pairs a policy reads)."""
    if hasattr(E, "sub"):
        return E.sub(agents)
    return np.asarray(E)[:, agents[:, None], agents[None, :]]


def run_stages(policy: Policy, R: np.ndarray, C: np.ndarray, E, order: np.ndarray,
               rank: np.ndarray | None = None) -> Outcome:
    """`policy`'s stages on every row, its prompt shortcuts not applied (`with_shortcuts` applies them); `order` =
    agent preference (best first), `rank` its `preference_rank` when the caller has it.

    Only the L agents the policy can call are read (R, C, E restricted to them): a policy's cost is O(n L^2)
    whatever the pool's width K, so the cascade search over O(K) policies grows linearly with K. Exact: an agent
    that is never called has no agreeing class, and the relative preference of the called agents is unchanged."""
    n = R.shape[0]
    use = policy_agents(policy)
    L = len(use)
    local = {int(j): i for i, j in enumerate(use)}
    C_ = C[:, use]
    E_ = sub_agreement(E, use)
    order_ = np.argsort((preference_rank(order) if rank is None else rank)[use], kind="stable")  # O(L) per policy
    rows = np.arange(n)
    open_ = np.ones(n, dtype=bool)
    reward = np.zeros(n)
    cost = np.zeros(n)
    by = np.full(n, -1, dtype=np.int64)
    stage_of = np.full(n, STAGES, dtype=np.int64)
    called = np.zeros((n, L), dtype=bool)
    for t, s in enumerate(policy.stages):
        if not open_.any():
            break
        new = np.zeros((n, L), dtype=bool)
        new[:, [local[j] for j in s.agents]] = True
        new &= ~called & open_[:, None]
        cost += (C_ * new).sum(axis=1)
        called |= new
        if s.k == 0:
            j = s.agents[0]
            accept, rep = open_.copy(), np.full(n, j)
        else:
            size, rep_ = agreeing_rep(E_, called & open_[:, None], order_)
            rep = use[rep_]
            accept = open_ & (size >= s.k)
        reward[accept] = R[rows[accept], rep[accept]]
        by[accept] = rep[accept]
        stage_of[accept] = t
        open_ &= ~accept
    return Outcome(reward, cost, by, called.sum(axis=1), stage_of)


def with_shortcuts(policy: Policy, stages: Outcome, R: np.ndarray, C: np.ndarray, P: np.ndarray | None) -> Outcome:
    """`policy`'s outcome from its stages' outcome on every row (`run_stages`): a row a prompt shortcut answers is
    the lead's or the last agent's reply alone (one call); every other row is the stages' (rows never interact)."""
    if not uses_prediction(policy):
        return stages
    code, agent = shortcuts(policy, None if P is None else P[:, policy.lead])
    direct = code != STAGES
    j = np.where(direct, agent, 0)
    rows = np.arange(len(code))
    return Outcome(np.where(direct, R[rows, j], stages.reward), np.where(direct, C[rows, j], stages.cost),
                   np.where(direct, agent, stages.answered_by), np.where(direct, 1, stages.n_calls),
                   np.where(direct, code, stages.stage))


def run_policy(policy: Policy, R: np.ndarray, C: np.ndarray, E, order: np.ndarray,
               P: np.ndarray | None = None) -> Outcome:
    """Score a policy on the static matrix (see the module docstring); `order` = agent preference (best first),
    `P` the prompt router's predicted success its shortcuts read."""
    return with_shortcuts(policy, run_stages(policy, R, C, E, order), R, C, P)


def run_policies(policies: list[Policy], R: np.ndarray, C: np.ndarray, E, order: np.ndarray,
                 P: np.ndarray | None = None) -> list[Outcome]:
    """`run_policy` of each policy, with the stages of policies that differ only in their prompt shortcuts run once:
    the cascade search scores ~25 threshold pairs per stage structure, so this divides its work by about that."""
    rank = preference_rank(order)
    plain: dict[tuple[Stage, ...], Outcome] = {}
    out = []
    for policy in policies:
        if policy.stages not in plain:
            plain[policy.stages] = run_stages(policy, R, C, E, order, rank)
        out.append(with_shortcuts(policy, plain[policy.stages], R, C, P))
    return out


@dataclass(frozen=True)
class Plan:
    """One operating point of a cascade router: a policy per answer format (grader) — cascades that pay on GSM8K
    integers need not pay on MATH expressions — and a pooled `default` for a grader it was not fitted on."""

    default: Policy
    by_grader: tuple[tuple[str, Policy], ...] = ()

    def for_grader(self, grader: str | None) -> Policy:
        return dict(self.by_grader).get(grader, self.default)

    def to_dict(self, agents: list[str]) -> dict:
        return {"default": self.default.to_dict(agents),
                "by_grader": {g: p.to_dict(agents) for g, p in self.by_grader}}

    @classmethod
    def from_dict(cls, d: dict, agents: list[str]) -> Plan:
        if not isinstance(d, dict) or "default" not in d:
            raise RouterLiteError(f"cascade plan must be an object with a 'default' policy, got {str(d)[:80]!r}")
        by = d.get("by_grader") or {}
        if not isinstance(by, dict):
            raise RouterLiteError("cascade plan: 'by_grader' must be an object grader -> policy")
        return cls(Policy.from_dict(d["default"], agents),
                   tuple(sorted((str(g), Policy.from_dict(p, agents)) for g, p in by.items())))

    def describe(self, agents: list[str]) -> str:
        if not self.by_grader:
            return self.default.describe(agents)
        return " | ".join(f"{g}: {p.describe(agents)}" for g, p in self.by_grader) + \
            f" | other formats: {self.default.describe(agents)}"


def run_plan(plan: Plan, R, C, E, order, P, graders) -> Outcome:
    """`run_policy` row by row group: each grader's rows under its own policy."""
    graders = np.asarray(graders, dtype=object)
    n = len(R)
    parts = {f: np.zeros(n, dtype=t) for f, t in (("reward", float), ("cost", float), ("answered_by", np.int64),
                                                  ("n_calls", np.int64), ("stage", np.int64))}
    fitted = {g for g, _ in plan.by_grader}
    groups = [(g, graders == g) for g in fitted] + [(None, ~np.isin(graders, list(fitted)))]
    for g, m in groups:
        if not m.any():
            continue
        o = run_policy(plan.for_grader(g), R[m], C[m], E[m], order, None if P is None else P[m])
        for f in parts:
            parts[f][m] = getattr(o, f)
    return Outcome(**parts)


def execute(policies: list[Policy], direct: np.ndarray, order, ask, agree) -> Outcome:
    """Run per-row policies with real calls, stage wave by stage wave: `ask(j, rows)` calls agent j for those rows
    (all at once, e.g. one collection) and returns {row: (answer or None, reward, cost)}; `agree(i, a, b)` compares
    two answers of row i. `direct[i] >= 0` asks that agent alone (a prompt shortcut or the OOD guard). The routed
    benchmark uses it, so every stage's calls are really made and paid for."""
    n = len(policies)
    K = len(order)
    order = np.asarray(order, dtype=np.int64)
    got: list[dict[int, tuple]] = [{} for _ in range(n)]
    reward, cost = np.zeros(n), np.zeros(n)
    by, stage_of = np.full(n, -1, dtype=np.int64), np.full(n, STAGES, dtype=np.int64)
    open_ = set(range(n))
    stages = [policy_for(policies[i], int(direct[i])).stages for i in range(n)]
    t = 0
    while open_:
        wants: dict[int, list[int]] = {}
        for i in open_:
            for j in new_agents(stages[i][t], got[i]):
                wants.setdefault(j, []).append(i)
        for j, rows in wants.items():
            for i, res in ask(j, rows).items():
                got[i][j] = res
                cost[i] += res[2]
        for i in list(open_):
            j = stage_step(stages[i][t], {a: r[0] for a, r in got[i].items()}, K, order,
                           lambda x, y, i=i: agree(i, x, y))
            if j is None:
                continue
            reward[i], by[i], stage_of[i] = got[i][j][1], j, (ALONE if direct[i] >= 0 else t)
            open_.discard(i)
        t += 1
    return Outcome(reward, cost, by, np.array([len(g) for g in got], dtype=np.int64), stage_of)


# What a cascade does with a prompt its OOD guard finds unfamiliar (path["guard_action"]; docs/training.md, "The
# guard"): send it to the best single agent, run the plan anyway (the cheap agents' agreement is evidence whatever
# the prompt looked like; the request is still flagged), or ignore the guard.
GUARD_BEST_SINGLE, GUARD_PLAN, GUARD_OFF = "best_single", "plan", "off"
GUARD_ACTIONS = (GUARD_BEST_SINGLE, GUARD_PLAN, GUARD_OFF)


def guard_action(path: dict) -> str:
    """A cascade path's guard action (a path saved before the choice existed: the best single agent)."""
    action = path.get("guard_action") or GUARD_BEST_SINGLE
    if action not in GUARD_ACTIONS:
        raise RouterLiteError(f"cascade guard_action {action!r} is not one of {', '.join(GUARD_ACTIONS)}")
    return action


@dataclass
class CascadeView:
    """A registered cascade at one operating point for requests of one answer format (`CascadeRouter.view`):
    `route(X)` -> (per row -1 = run the policy's stages, j >= 0 = ask agent j alone: a prompt shortcut, a one-stage
    policy or the OOD guard's best single agent; mask where the guard fired). `registered` is the registry entry
    (its `scorer` gives the predicted success the shortcuts read, its `guard` and `best_single` the OOD guard)."""

    registered: object  # pipeline.route.registry.RegisteredRouter
    point: dict  # the cascade path point (target, lambda = path index, validation stats, plan)
    policy: Policy  # the policy of this view's grader
    grader: str

    @property
    def name(self) -> str:
        return self.registered.name

    def route(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        reg, pol = self.registered, self.policy
        p = None
        if uses_prediction(pol):
            if reg.scorer is None:
                raise RouterLiteError(f"cascade {reg.name} uses predicted success but has no value scorer")
            p = reg.scorer.scores(X)[:, pol.lead]
        picks = shortcuts(pol, p)[1] if p is not None else np.full(len(X), -1, dtype=np.int64)
        if len(pol.stages) == 1:  # a single agent: asked alone
            picks[:] = pol.final
        fired = reg.guard.fires(X)
        action = guard_action(reg.router.path)
        if action == GUARD_BEST_SINGLE:
            picks[fired] = reg.best_single
        elif action == GUARD_OFF:
            fired = np.zeros_like(fired)
        return picks, fired  # GUARD_PLAN: flagged (X-Router-OOD), but the plan runs: answers are evidence anyway


# ---------------------------------------------------------------------------------------------------- router kind
CASCADE_FILE = "cascade.json"
FALLBACK_FILE = "cascade_head.safetensors"
FALLBACK_PREFIX = "fallback."  # the files of a prompt router of another kind than head


@register_router("cascade")
class CascadeRouter:
    """The `cascade` router kind: a validation path of cascade policies (pipeline/route/cascade_fit.py), the agent
    preference that picks the reply within an agreeing class, and the prompt router it falls back on.

    Router protocol: `scores` / `pick` are the prompt-only fallback's (a request without an answer format, or a
    caller that cannot run stages); `policy(target)` is the cascade a target selects and `predicted(X)` the prompt
    router's predicted success that the policy's thresholds read (the registry's value scorer)."""

    kind = "cascade"
    needs_answers = True  # fitted from the agents' recorded answers (pipeline.route.routers.CAPABILITIES)
    needs_grader = True  # a request names its answer format; `view` routes one (target, grader)
    reference_code = True  # reference.py reads its plans

    def __init__(self, fallback, path: dict, order, agents: list[str]):
        self.fallback = fallback  # a Head (the shipped prompt router at max-quality)
        self.path = path
        self.order = np.asarray(order, dtype=np.int64)
        self.agents = list(agents)
        if sorted(self.order.tolist()) != list(range(len(self.agents))):
            raise RouterLiteError(f"cascade agent preference {self.order.tolist()} is not a permutation of "
                                  f"{len(self.agents)} agents")
        for p in path.get("points", []):
            Plan.from_dict(p.get("plan"), self.agents)  # every stored plan must parse

    @property
    def d(self) -> int:
        return self.fallback.d

    @property
    def K(self) -> int:
        return len(self.agents)

    def scores(self, X: np.ndarray) -> np.ndarray:
        return self.fallback.scores(X)

    def pick(self, X: np.ndarray) -> np.ndarray:
        return self.fallback.pick(X)

    def resolve(self, target=None) -> dict:
        """The path point a target selects (the guard of `cascade_fit` applies)."""
        from pipeline.route.targets import resolve

        return resolve(target, self.path)

    def plan(self, target=None) -> Plan:
        return Plan.from_dict(self.path["points"][self.resolve(target)["index"]]["plan"], self.agents)

    def policy(self, target=None, grader: str | None = None) -> Policy:
        """The policy a request of answer format `grader` runs at `target`."""
        return self.plan(target).for_grader(grader)

    def view(self, registered, target, grader: str) -> CascadeView:
        """This cascade, registered as `registered`, at one operating point for requests of answer format `grader`
        (an unknown grader: one error naming the known ones)."""
        from pipeline.collect.grading import grader_spec

        grader_spec(grader)
        return CascadeView(registered, self.resolve(target), self.plan(target).for_grader(grader), grader)

    def save_files(self, directory: str | Path) -> dict:
        from pipeline.core.io import atomic_write_json
        from pipeline.route.targets import REPORT_TARGETS

        directory = Path(directory)
        doc = {}
        if getattr(self.fallback, "kind", "head") == "head":  # the head's one file, as the reference code reads it
            self.fallback.save(directory / FALLBACK_FILE)
            files = {"weights": FALLBACK_FILE}
        else:  # any other router kind: its own files, prefixed, and its manifest fields in cascade.json
            import tempfile

            with tempfile.TemporaryDirectory(dir=directory) as tmp:  # its files, renamed into this directory
                fields = dict(self.fallback.save_files(tmp))
                files = {role: FALLBACK_PREFIX + name for role, name in fields.pop("files").items()}
                for name in files.values():
                    (Path(tmp) / name[len(FALLBACK_PREFIX):]).replace(directory / name)
            doc["fallback"] = {"kind": self.fallback.kind, "files": files, **fields}
            files = {}
        targets = {name: self.resolve(name)["index"] for name in REPORT_TARGETS}  # for reference.py
        atomic_write_json({"path": self.path, "order": self.order.tolist(), "agents": self.agents,
                           "targets": targets, **doc}, directory / CASCADE_FILE)
        return {"files": {**files, "cascade": CASCADE_FILE},
                "cascade": {"n_points": len(self.path["points"]), "guard_z": self.path.get("guard_z")}}

    @classmethod
    def from_files(cls, directory: str | Path, manifest: dict) -> CascadeRouter:
        from pipeline.route.head import Head

        files = manifest.get("files", {})
        names = [a["name"] for a in manifest["agents"]]
        f = Path(directory) / files.get("cascade", CASCADE_FILE)
        from pipeline.route.cascade_check import read_cascade_doc

        doc = read_cascade_doc(f, names, Path(directory))  # one line naming the file and the field
        if isinstance(doc.get("fallback"), dict):  # a prompt router of another kind than head
            from pipeline.route.routers import ROUTER_TYPES  # the kinds are loaded: a registry or fitted loads us

            fb = doc["fallback"]
            fallback = ROUTER_TYPES.lookup(fb.get("kind")).from_files(directory, {**fb, "dim": manifest["dim"],
                                                                           "agents": manifest["agents"]})
        else:
            fallback = Head.load(Path(directory) / files.get("weights", FALLBACK_FILE), d=int(manifest["dim"]),
                                 K=len(names), agents=names)
        try:
            return cls(fallback, doc["path"], doc.get("order", list(range(len(names)))), names)
        except RouterLiteError as exc:
            raise RouterLiteError(f"cascade file {f}: {exc}") from None

    def fingerprint(self) -> tuple[list[bytes], list]:
        arrays, settings = self.fallback.fingerprint()
        return arrays, [*settings, json.dumps(self.path, sort_keys=True, default=str), self.order.tolist()]
