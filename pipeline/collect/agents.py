"""The agent pool: `AgentSpec`, `load_agents(path, pool_name)` (the agents of a pool in `config/agents.yaml`, priced
from `config/prices.yaml`), `select_agents`. "Pool" in this code base always means this: a set of agents."""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable
from pathlib import Path

import yaml

from pipeline.collect.costs import price_problem
from pipeline.core.config import config_dir, override_pools
from pipeline.core.errors import RouterLiteError


@dataclasses.dataclass(frozen=True)
class AgentSpec:
    name: str
    model: str
    provider: str
    base_url: str | None
    price_in_per_mtok: float
    price_out_per_mtok: float
    role: str = ""
    # its replies omit tokens it is billed for (a reasoning model's hidden reasoning: `hidden_reasoning: true` on the
    # agent or its model's price entry), so a cost estimated from the recorded text is a lower bound
    hidden_reasoning: bool = False

    @property
    def cost_note(self) -> str:
        """Why an estimated cost of this agent is only a lower bound ("" when it is not)."""
        return ("lower bound: its hidden reasoning tokens are billed as output but absent from the recorded reply, "
                "so an estimate from the reply's text leaves them out" if self.hidden_reasoning else "")

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.price_in_per_mtok + completion_tokens * self.price_out_per_mtok) / 1e6


def _read_yaml(path: Path, what: str) -> dict:
    if not path.exists():
        raise RouterLiteError(f"{what} file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise RouterLiteError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(raw, dict):
        raise RouterLiteError(f"{path}: expected a mapping at the top level")
    return raw


def load_prices(path: str | Path) -> dict[str, dict]:
    """`models:` of a prices file: model id -> {input, output, ...} (USD per million tokens), every price a number
    in [0, MAX_PRICE_PER_MTOK] (pipeline/collect/costs.py), else one error naming the file and the field."""
    path = Path(path)
    models = _read_yaml(path, "prices").get("models")
    if not isinstance(models, dict):
        raise RouterLiteError(f"{path}: needs a `models:` mapping of model id -> {{input, output}}")
    for model, entry in models.items():  # every entry: a bad price is a broken file, used by this pool or not
        for side in ("input", "output"):
            problem = price_problem(entry.get(side)) if isinstance(entry, dict) and entry.get(side) is not None \
                else None
            if problem:
                raise RouterLiteError(f"{path}: models.{model}.{side} {problem}")
    return models


def load_agents(path: str | Path, pool_name: str, prices_path: str | Path | None = None,
                only: Iterable[str] | None = None) -> list[AgentSpec]:
    """Agents of pool `pool_name` in the agents file `path` (config/agents.yaml).

    A pool is `{provider, base_url, extends?, agents: [{name, model, role, provider?, base_url?, price_in_per_mtok?,
    price_out_per_mtok?}]}`; `extends: other_pool` prepends that pool's agents. Prices not given on the agent come
    from the prices file (`prices:` in the agents file, relative to it; default prices.yaml beside it).
    `only` keeps the named agents (in pool order). Unknown pool/agent, empty pool, duplicate names, missing prices
    raise RouterLiteError naming them.
    """
    path = Path(path)
    raw = _read_yaml(path, "agents")
    pools = raw.get("pools")
    if isinstance(pools, dict) and path.resolve() == (config_dir() / "agents.yaml").resolve():
        pools = {**pools, **override_pools()}  # an override file's `agents: {pools: ...}` (docs/usage.md)
    if not isinstance(pools, dict) or not pools:
        raise RouterLiteError(f"{path}: needs a non-empty `pools:` mapping")
    if prices_path is None:
        prices_path = path.parent / str(raw.get("prices", "prices.yaml"))
    prices: dict[str, dict] = {}

    def price_of(model: str):  # the prices file, read once and only when an agent needs it
        if not prices:
            prices["table"] = load_prices(prices_path)
        return prices["table"].get(model)

    def resolve(name: str, chain: tuple[str, ...]) -> list[AgentSpec]:
        if name not in pools:
            raise RouterLiteError(f"unknown pool {name!r} in {path}; known pools: {', '.join(sorted(pools))}")
        if name in chain:
            raise RouterLiteError(f"{path}: pool {name!r} extends itself ({' -> '.join(chain + (name,))})")
        pool = pools[name] or {}
        if not isinstance(pool, dict):
            raise RouterLiteError(f"{path}: pool {name!r} must be a mapping")
        out = resolve(pool["extends"], chain + (name,)) if pool.get("extends") else []
        entries = pool.get("agents") or []
        if not isinstance(entries, list):
            raise RouterLiteError(f"{path}: pool {name!r}: `agents` must be a list")
        return out + [_agent_spec(path, name, pool, i, a, price_of, prices_path) for i, a in enumerate(entries)]

    agents = resolve(pool_name, ())
    if not agents:
        raise RouterLiteError(f"pool {pool_name!r} in {path} has no agents")
    dup = sorted(n for n, c in collections.Counter(a.name for a in agents).items() if c > 1)
    if dup:
        raise RouterLiteError(f"pool {pool_name!r} in {path}: duplicate agent name(s) {dup}")
    if only is not None:
        agents = select_agents(agents, only, pool_name)
    return agents


def _agent_spec(path: Path, name: str, pool: dict, i: int, a, price_of, prices_path) -> AgentSpec:
    """Agent #`i` of pool `name` (a mapping of the agents file), its prices from the entry or `price_of(model)`."""
    if not isinstance(a, dict) or not a.get("name") or not a.get("model"):
        raise RouterLiteError(f"{path}: pool {name!r} agent #{i} needs `name` and `model`: {a!r}")
    provider = a.get("provider", pool.get("provider"))
    if not provider:
        raise RouterLiteError(f"{path}: pool {name!r} agent {a['name']!r} has no provider")
    p_in, p_out = a.get("price_in_per_mtok"), a.get("price_out_per_mtok")
    if p_in is None or p_out is None:
        entry = price_of(a["model"])
        if not isinstance(entry, dict) or entry.get("input") is None or entry.get("output") is None:
            raise RouterLiteError(f"no price for model {a['model']!r} (pool {name!r}, agent {a['name']!r}) "
                                  f"in {prices_path}")
        p_in = entry["input"] if p_in is None else p_in
        p_out = entry["output"] if p_out is None else p_out
    hidden = a.get("hidden_reasoning")
    if hidden is None:  # the model's price entry says it, when there is one
        known = price_of(a["model"]) if Path(prices_path).exists() else None
        hidden = isinstance(known, dict) and bool(known.get("hidden_reasoning"))
    for field, v in (("price_in_per_mtok", p_in), ("price_out_per_mtok", p_out)):
        problem = price_problem(v)
        if problem:  # the agent's own price (a table's was checked by load_prices)
            raise RouterLiteError(f"{path}: pool {name!r} agent {a['name']!r}: {field} {problem}")
    p_in, p_out = float(p_in), float(p_out)
    return AgentSpec(name=str(a["name"]), model=str(a["model"]), provider=str(provider),
                     base_url=a.get("base_url", pool.get("base_url")), price_in_per_mtok=p_in,
                     price_out_per_mtok=p_out, role=str(a.get("role", "")), hidden_reasoning=bool(hidden))


def select_agents(agents: list[AgentSpec], names: Iterable[str], pool_name: str = "") -> list[AgentSpec]:
    names = list(names)
    known = {a.name for a in agents}
    unknown = [n for n in names if n not in known]
    if unknown:
        where = f" in pool {pool_name!r}" if pool_name else ""
        raise RouterLiteError(f"unknown agent(s) {unknown}{where}; known agents: {', '.join(sorted(known))}")
    if not names:
        raise RouterLiteError(f"empty agent selection{' for pool ' + repr(pool_name) if pool_name else ''}")
    return [a for a in agents if a.name in set(names)]
