"""Profiles: one YAML file per way of running the lineage (config/profiles/<name>.yaml).

The active profile is chosen by one setting — `ROUTER_LITE_PROFILE` (or `router-lite --profile NAME`) — never by
code edits. Default: `demo`, the embedded default (replay pool, bundled data, bundled backbone).

Every section of a profile is a typed, frozen dataclass whose docstring is its table of options (option = default,
meaning; pycma style):

    sources     dict source -> `SourceSettings`   which benchmarks, and where each one's rows come from
    task_pool   `pipeline.tasks.task_pool.TaskPoolConfig`   size, balance, split and out-of-distribution set
                                                            of the task pool
    pool        `AgentPoolSettings`               the agent pool: kind, pool name(s), endpoint
    collection  `CollectionConfig`                repetitions + `pipeline.collect.settings.CollectionSettings`
                                                  (how one call is made)
    backbone    `BackboneSettings`                the frozen embedding model (`resources.backbone.BackboneResource`)
    train       `pipeline.route.train.TrainConfig`      the router head's CMA-ES training
    benchmark   `BenchmarkSettings`               the routed benchmark and the replication suites
    serve       `ServeProfileSettings`            what `router-lite serve` serves when no --head / --target is given

`load_profile` validates the whole file once (`from_yaml`: pydantic, with the dataclass fields and their annotated
types as the schema): an unknown key, a value of the wrong type, outside its bounds or its choices anywhere is one
`RouterLiteError` naming the file and the dotted key. Everything downstream takes the typed `Profile`; nothing
re-validates a section.

An override file (`ROUTER_LITE_OVERRIDE=FILE`, or `router-lite run|serve --override FILE`) is merged over the profile
before that validation: a mapping merges key by key, any other value (a list, a number, a string) replaces the
profile's. It changes a profile for one machine without copying it, e.g. the pilot's endpoint:
`pool: {base_url: http://127.0.0.1:8765/api/v1, key_hosts: ["127.0.0.1:8765"]}`.

This module sits above the stages (core < tasks < collect < route < report, serve): it assembles the option
classes each stage owns (`TaskPoolConfig`, `CollectionSettings`, `TrainConfig`, the sources table, the default
backbone) with the sections below, and no stage imports it. The generic reader is `pipeline/core/config.py`.
"""
from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass, field
from typing import Annotated, Literal

import pydantic

from pipeline.collect.judge import JudgeSettings
from pipeline.collect.sampling import NewAgentSample
from pipeline.collect.settings import CollectionSettings
from pipeline.collect.traffic import TrafficSettings
from pipeline.core import config
from pipeline.core.config import (  # noqa: F401 - the reader's names, re-exported for the profile's callers
    DEFAULT_PROFILE,
    OVERRIDE_ENV,
    Int,
    Number,
    Section,
    active_profile_name,
    code_only,
    config_dir,
    from_yaml,
    merged,
    one_of,
    override_path,
    profile_path,
)
from pipeline.core.errors import RouterLiteError
from pipeline.embed.backbone import DEFAULT_MODEL_ID
from pipeline.route.train import TrainConfig
from pipeline.tasks.sources import SOURCES
from pipeline.tasks.task_pool import TaskPoolConfig

MAX_REPETITIONS = 3  # the seed's 3 repetitions; a profile may use fewer

Suite = Literal["routerbench", "mmlu-pro-outputs", "zeroeval-outputs"]
# The names of the agent-pool kinds. resources/pool.py owns each kind's client factory (`POOL_KINDS` there) and
# adds a kind registered with `register_pool_kind` here, so a profile naming it loads (register before loading).
POOL_KINDS: list[str] = ["replay", "openrouter", "openai_compatible"]
BENCHMARK_SUITES: tuple[str, ...] = typing.get_args(Suite)


# --- the sections -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceSettings:
    """Where one source's rows come from (`sources.<source>`; `{}` = the bundled copy). First match wins.

    hub_id = None
        A hub dataset id (or a local dataset dir / data file) read through `datasets.load_dataset`.
    hub_config = None
        The hub dataset's configuration name (with ``hub_id``).
    hub_split = "test"
        The hub dataset's split (with ``hub_id``).
    path = None
        A local Parquet, JSONL (optionally .gz) or CSV file in the source's original format (docs/tasks.md).
        Needed for a source without a bundled copy (rlpr).
    """

    hub_id: str | None = None
    hub_config: str | None = None
    hub_split: str = "test"
    path: str | None = None


@dataclass(frozen=True)
class OodSpec:
    """`task_pool.ood`: the general form of `task_pool.ood_categories` (set one or the other).

    column = "category"
        The task column whose values mark a task out-of-distribution.
    values = ()
        Values of ``column`` kept out of training entirely (split "test", ood=True). At least one.
    """

    column: str = "category"
    values: Annotated[tuple[str, ...], pydantic.Field(min_length=1, validate_default=True)] = ()  # profile only


@dataclass(frozen=True)
class AgentPoolSettings:
    """The agent pool (`pool:`): which agents of config/agents.yaml answer, and through which client.

    kind = "replay"
        "replay" (real recorded outputs, in process, no key), "openrouter" (needs OPENROUTER_API_KEY) or
        "openai_compatible" (any OpenAI-protocol endpoint at ``base_url``). Also names the Dagster concurrency pool
        `provider:<kind>` when the pool's agents mix providers, and the call-log directory.
    name = "demo"
        The pool in config/agents.yaml.
    wide_name = None
        A wider pool of the same kind that the re-collection schedule collects with (None = no re-collection).
    base_url = None
        Endpoint of the pool's client (None = the kind's default; required for openai_compatible).
    key_hosts = ()
        Hosts (``host`` or ``host:port``) besides openrouter.ai that may receive the API key.
    """

    kind: Annotated[str, one_of(lambda: POOL_KINDS)] = "replay"
    name: str = "demo"
    wide_name: str | None = None
    base_url: str | None = None
    key_hosts: tuple[str, ...] = ()


@dataclass(frozen=True)
class CollectionConfig(CollectionSettings):
    """The `collection:` section: how many times each task is asked, plus every
    `pipeline.collect.settings.CollectionSettings` option (how one call is made; its table is there). Only
    `repetitions` is not a call setting: it decides the `graded_calls` partitions and never enters a call's
    settings hash.

    repetitions = 3
        Times each task is asked each agent (1..3; partitions ``repetition`` 0..repetitions-1). Use 1 with a replay
        pool: a repetition would replay the same recorded reply.
    empty_rate_max = 0.05
        The collection quality rule (above 0, at most 1): an agent whose share of empty replies on a source ×
        repetition reaches it is quarantined, left out of every downstream asset with its reason
        (`pipeline.collect.quality`); the other agents go on. Not a call setting either.
    max_usd = None
        USD the whole collection may spend (every partition, reruns included; None = no limit). Each call reserves
        its worst case before it is sent; the collection stops with one line when the next would not fit
        (`pipeline.collect.budget`; `router-lite run --max-usd X` overrides it for one run).
    new_agent_sample = NewAgentSample()
        New agents of a wider pool called on a sample of tasks first, the rest estimated, the remaining calls made
        only for agents that may join the frontier (`pipeline.collect.sampling.NewAgentSample`, its table there);
        off by default (fraction 0). Not a call setting.
    judge = JudgeSettings()
        The judge agent of tasks with `grader: judge` (open-ended prompts without a gold answer): its model, the
        reference agent replies are compared with, and how position bias is controlled
        (`pipeline.collect.judge.JudgeSettings`, its table there). Not a call setting: it never enters a call key.
    """

    repetitions: Annotated[Int, pydantic.Field(ge=1, le=MAX_REPETITIONS)] = 3
    empty_rate_max: Annotated[Number, pydantic.Field(gt=0, le=1)] = 0.05
    max_usd: Annotated[Number, pydantic.Field(ge=0)] | None = None
    new_agent_sample: Section[NewAgentSample] = field(default_factory=NewAgentSample)
    judge: Section[JudgeSettings] = field(default_factory=JudgeSettings)


@dataclass(frozen=True)
class BackboneSettings:
    """The frozen embedding model (`backbone:`); the fields of `resources.backbone.BackboneResource` a profile sets.

    model = "sentence-transformers/all-MiniLM-L6-v2"
        Hub id or local dir; the MiniLM id maps to the bundled copy. ``static``: a Model2Vec static embedding
        distilled from the bundled MiniLM (built once under $ROUTER_LITE_HOME/backbones; hundreds of times faster
        on a CPU, docs/backbones.md), or the directory of any Model2Vec model.
    pooling = "mean"
        "mean" (sentence-transformers encoders) or "last_token" (decoders, e.g. Qwen/Qwen3-1.7B).
    device = "auto"
        "auto" (CUDA when torch sees one, else the CPU), "cpu", "cuda" or "cuda:N".
    dtype = "auto"
        "auto" (float16 on CUDA; on the CPU bf16 OpenVINO where the CPU has it, else float32), "float32",
        "float16" or "bfloat16".
    batch_size = 64
        Prompts per forward pass.
    max_seq_length = 256
        Tokens per prompt; longer prompts are cut. Part of the embedding cache key.
    revision = None
        Hub revision of ``model`` (None = the default branch).
    log_every = 10
        A progress log line every this many batches.
    backend = "auto"
        "auto" (OpenVINO on the CPU for mean pooling, torch on CUDA), "torch", "openvino" or "onnx"
        (docs/backbones.md has the measurements behind the choice).
    export_dir = None
        Where ONNX exports and compiled blobs go (None = $ROUTER_LITE_HOME/backbones).
    """

    model: str = DEFAULT_MODEL_ID
    pooling: Literal["mean", "last_token"] = "mean"
    device: str = "auto"
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    batch_size: Annotated[Int, pydantic.Field(ge=1)] = 64
    max_seq_length: Annotated[Int, pydantic.Field(ge=1)] = 256
    revision: str | None = None
    log_every: Int = 10
    backend: Literal["auto", "torch", "openvino", "onnx"] = "auto"
    export_dir: str | None = None

    def __post_init__(self) -> None:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device):
            raise RouterLiteError(f"backbone.device {self.device!r} is not one of auto, cpu, cuda, cuda:N")


@dataclass(frozen=True)
class BenchmarkSettings:
    """The routed benchmark and the replication suites (`benchmark:`).

    file = None
        An extra benchmark file (`pipeline.report.benchmark.load_benchmark`) routed next to the held-out test split.
    target = None
        The operating point the routed benchmark uses (e.g. "parity"; `router-lite run --target` or the run config
        of benchmark_report overrides it; None = the head's default).
    suites = ()
        The `routerbench_replication` partitions `router-lite run` materialises, of "routerbench",
        "mmlu-pro-outputs", "zeroeval-outputs" (() = all).
    """

    file: str | None = None
    target: str | None = None
    suites: tuple[Suite, ...] = ()


@dataclass(frozen=True)
class ServeProfileSettings:
    """What `router-lite serve` serves by default (`serve:`; docs/serving.md).

    target = "quality>=0.98"
        The operating point the ★ router (the best router by validation AIQ of the profile's latest run,
        reports/router_value.json) is served at when `serve` is given neither `--head` nor `--target`; the
        README's headline target.
    record_traffic = False
        Record each served request in the home's traffic log (`serve --record-traffic`; docs/serving.md,
        "Recording traffic"): its routed text, messages, decision, every agent called with its reply, cost and
        latency, the client key's name (never the key). Off: `serve` keeps no prompt anywhere.
    traffic_retention_days = 30
        Days of the traffic log kept (`--traffic-retention-days`): older day folders are deleted.
    explore = 0.0
        Share of the recorded requests whose un-asked agents are asked after the reply (`--explore`).
    explore_usd_per_day = None
        The exploration's cap in USD per UTC day (`--explore-usd-per-day`; required when explore > 0).
    """

    target: str = "quality>=0.98"
    record_traffic: bool = False
    traffic_retention_days: Annotated[Int, pydantic.Field(ge=1)] = 30
    explore: Annotated[Number, pydantic.Field(ge=0, le=1)] = 0.0
    explore_usd_per_day: Annotated[Number, pydantic.Field(ge=0)] | None = None

    def __post_init__(self) -> None:
        from pipeline.route.targets import parse_target

        try:
            parse_target(self.target)
        except RouterLiteError as exc:
            raise RouterLiteError(f"serve.target: {exc}") from None
        if self.explore > 0 and self.explore_usd_per_day is None:
            raise RouterLiteError("serve.explore > 0 needs its cap: serve.explore_usd_per_day (USD per UTC day)")


@dataclass(frozen=True)
class Profile:
    """One profile file (config/profiles/<name>.yaml): its sections, each typed and validated by `load_profile`.

    name = the file name
        Shown in the UI, the printed report and the tasks dataset card.
    description = ""
        One line about the profile.
    sources = {}
        Source key -> `SourceSettings` (`{}` = bundled copy); at least one of `pipeline.tasks.sources.SOURCES`.
    task_pool = TaskPoolConfig()
        The task pool (`pipeline.tasks.task_pool.TaskPoolConfig`).
    pool = AgentPoolSettings()
        The agent pool.
    collection = CollectionConfig()
        Repetitions and call settings.
    backbone = BackboneSettings()
        The embedding model.
    train = TrainConfig()
        The router head's training (`pipeline.route.train.TrainConfig`).
    benchmark = BenchmarkSettings()
        The routed benchmark and replication suites.
    serve = ServeProfileSettings()
        What `router-lite serve` serves by default.
    traffic = TrafficSettings()
        The served traffic as a task source (`pipeline.collect.traffic.TrafficSettings`).
    """

    name: str = ""
    description: str = ""
    # live: a registered source counts
    sources: dict[Annotated[str, one_of(lambda: SOURCES, key=True)], Section[SourceSettings]] = \
        field(default_factory=dict)
    task_pool: Section[TaskPoolConfig] = field(default_factory=TaskPoolConfig)
    pool: Section[AgentPoolSettings] = field(default_factory=AgentPoolSettings)
    collection: Section[CollectionConfig] = field(default_factory=CollectionConfig)
    backbone: Section[BackboneSettings] = field(default_factory=BackboneSettings)
    train: Section[TrainConfig] = field(default_factory=TrainConfig)
    benchmark: Section[BenchmarkSettings] = field(default_factory=BenchmarkSettings)
    serve: Section[ServeProfileSettings] = field(default_factory=ServeProfileSettings)
    traffic: Section[TrafficSettings] = field(default_factory=TrafficSettings)
    # the file it was read from, and the override file merged over it ("" = none): not keys
    path: Annotated[str, pydantic.AfterValidator(code_only)] = field(default="", metadata={"yaml": False})
    override: Annotated[str, pydantic.AfterValidator(code_only)] = field(default="", metadata={"yaml": False})

    def __post_init__(self) -> None:
        if not self.sources:
            raise RouterLiteError(f"`sources` is empty; name at least one of {', '.join(SOURCES)}")

    @property
    def repetitions(self) -> int:
        return self.collection.repetitions


SECTIONS = (SourceSettings, OodSpec, AgentPoolSettings, CollectionConfig, BackboneSettings, BenchmarkSettings,
            ServeProfileSettings, Profile, TaskPoolConfig, CollectionSettings,
            TrainConfig, NewAgentSample, TrafficSettings)  # every dataclass a profile is read into


def _ood_form(raw: dict) -> dict:
    """`task_pool.ood: {column, values}` -> TaskPoolConfig's `ood_column` / `ood_categories`."""
    tp = raw.get("task_pool")
    if not isinstance(tp, dict) or "ood" not in tp:
        return raw
    tp = dict(tp)
    ood = from_yaml(OodSpec, tp.pop("ood"), "task_pool.ood")
    if tp.get("ood_categories"):
        raise RouterLiteError("task_pool.ood: replaces task_pool.ood_categories; set one of them")
    tp["ood_column"], tp["ood_categories"] = ood.column, list(ood.values)
    return {**raw, "task_pool": tp}


def load_profile(name: str | None = None) -> Profile:
    """Read and validate config/profiles/<name>.yaml (default: the active profile) into a typed `Profile`, with the
    override file of ROUTER_LITE_OVERRIDE (when set) merged over it first."""
    name = name or active_profile_name()
    path = profile_path(name)
    if not path.exists():
        known = sorted(p.stem for p in (config_dir() / "profiles").glob("*.yaml"))
        raise RouterLiteError(f"unknown profile {name!r} (ROUTER_LITE_PROFILE); known profiles: {', '.join(known)}")
    over = override_path()
    where = f"{path} (override {over})" if over else str(path)
    try:
        raw = config._read_yaml(path)
        if over is not None:
            extra = config._read_yaml(over)
            if not isinstance(extra, dict):
                raise RouterLiteError(f"override {over}: expected a mapping, got {config._what(extra)}")
            # `agents:` adds agent pools (pipeline.collect.agents reads it); the rest is the profile's
            raw = merged(raw, {k: v for k, v in extra.items() if k != config.OVERRIDE_AGENTS})
        profile = from_yaml(Profile, _ood_form(raw) if isinstance(raw, dict) else raw)
    except RouterLiteError as exc:
        raise RouterLiteError(f"{where}: {exc}" if not str(exc).startswith(str(path)) else str(exc)) from None
    return dataclasses.replace(profile, name=profile.name or name, path=str(path), override=str(over or ""))


def as_profile(profile: Profile | str | None) -> Profile:
    """A `Profile` as given, or the named (default: the active) one loaded."""
    return profile if isinstance(profile, Profile) else load_profile(profile or None)
