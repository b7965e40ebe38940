"""Profiles are typed and validated once: every bundled profile loads; a bad key or value anywhere is one error
naming the file and the dotted key; every option sits in its section's table; a definitions build reads the file
once."""
import ast
import dataclasses
import re
import shutil
import typing
from pathlib import Path

import pytest
import yaml

from pipeline import profile
from pipeline.core import config
from pipeline.core.errors import RouterLiteError
from pipeline.profile import BackboneSettings, Profile, load_profile

PROFILES = Path(__file__).resolve().parents[1] / "config" / "profiles"


def test_every_bundled_profile_loads_typed():
    for f in sorted(PROFILES.glob("*.yaml")):
        prof = load_profile(f.stem)
        assert prof.name == f.stem and prof.path == str(f)
        for section in ("task_pool", "pool", "collection", "backbone", "train", "benchmark"):
            assert dataclasses.is_dataclass(getattr(prof, section)), (f.stem, section)
        assert all(isinstance(s, profile.SourceSettings) for s in prof.sources.values())
        assert 1 <= prof.repetitions <= profile.MAX_REPETITIONS
    demo = load_profile("demo")
    assert demo.pool.kind == "replay" and demo.pool.wide_name == "demo_wide" and demo.repetitions == 1
    assert demo.benchmark.suites == ("routerbench", "zeroeval-outputs")
    assert load_profile("smoke").train.generations == 20
    with pytest.raises(dataclasses.FrozenInstanceError):
        demo.train.generations = 1  # sections are frozen: no stage can change another's config


def _profile_dir(tmp_path, monkeypatch, edit) -> str:
    """A copy of config/ whose demo profile is edited by `edit(raw_dict)`; returns the edited file's path."""
    shutil.copytree(PROFILES.parent, tmp_path / "config", dirs_exist_ok=True)
    path = tmp_path / "config" / "profiles" / "demo.yaml"
    raw = yaml.safe_load(path.read_text())
    edit(raw)
    path.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("ROUTER_LITE_CONFIG", str(tmp_path / "config"))
    return str(path)


def _set(dotted: str, value):
    def edit(raw):
        *parents, last = dotted.split(".")
        node = raw
        for p in parents:
            if not isinstance(node.get(p), dict):
                node[p] = {}
            node = node[p]
        node[last] = value
    return edit


@pytest.mark.parametrize("dotted, value, problem", [
    # an unknown key in every section, and nested ones
    ("colour", "blue", "unknown key"),
    ("sources.gsm9k", {}, "unknown key"),
    ("sources.zeroeval_gsm8k.hub_splt", "test", "unknown key"),
    ("task_pool.sizes", 10, "unknown key"),
    ("task_pool.split.dev", 0.1, "unknown key"),
    ("task_pool.ood.colum", "category", "unknown key"),
    ("pool.wide", "demo_wide", "unknown key"),
    ("collection.max_token", 10, "unknown key"),
    ("backbone.batch_sise", 8, "unknown key"),
    ("train.generation", 3, "unknown key"),
    ("benchmark.suite", ["routerbench"], "unknown key"),
    ("path", "/etc/passwd", "unknown key"),  # set by load_profile, never by the file
    # a value of the wrong type
    ("collection.concurrency", "many", "expected an integer, got str 'many'"),
    ("collection.repetitions", 1.5, "expected an integer"),
    ("collection.temperature", "warm", "expected a number"),
    ("backbone.batch_size", [1], "expected an integer, got list"),
    ("backbone.model", 7, "expected a string"),
    ("train.standardize", "yes", "expected true or false"),
    ("train.ridge_alphas", 3, "expected a list"),
    ("train.ridge_alphas", [1, "lots"], "expected a number"),
    ("task_pool.split", [0.6, 0.2, 0.2], "expected a mapping"),
    ("task_pool.ood_categories", "geometry", "expected a list"),
    ("sources.zeroeval_gsm8k", ["a.jsonl"], "expected a mapping"),
    ("pool.key_hosts", {"a": 1}, "expected a list"),
    # a value outside its choices
    ("pool.kind", "carrier_pigeon", "'carrier_pigeon' is not one of replay, openrouter, openai_compatible"),
    ("backbone.pooling", "max", "is not one of mean, last_token"),
    ("task_pool.balance", "random", "is not one of domain_difficulty, category"),
    ("benchmark.suites", ["routerbench", "mmlu"], "is not one of routerbench"),
])
def test_a_bad_key_or_value_is_one_error_naming_file_and_key(tmp_path, monkeypatch, dotted, value, problem):
    if dotted.startswith("task_pool.ood_categories"):  # demo uses the `ood:` form; the two exclude each other
        edit = _set(dotted, value)

        def both(raw):
            raw["task_pool"].pop("ood")
            edit(raw)
        path = _profile_dir(tmp_path, monkeypatch, both)
    else:
        path = _profile_dir(tmp_path, monkeypatch, _set(dotted, value))
    with pytest.raises(RouterLiteError) as exc:
        load_profile("demo")
    msg = str(exc.value)
    key = dotted + ("[1]" if dotted == "train.ridge_alphas" and isinstance(value, list) else "")
    key = "benchmark.suites[1]" if dotted == "benchmark.suites" else key
    assert msg.startswith(f"{path}: {key}: "), msg
    assert problem in msg and "\n" not in msg
    if problem == "unknown key":
        assert "; known: " in msg


def test_section_invariants_name_the_file(tmp_path, monkeypatch):
    path = _profile_dir(tmp_path, monkeypatch, _set("collection.repetitions", 4))
    with pytest.raises(RouterLiteError, match=re.escape(f"{path}: collection.repetitions: must be <= 3, got int 4")):
        load_profile("demo")
    path = _profile_dir(tmp_path, monkeypatch, _set("train.seed", 0))
    with pytest.raises(RouterLiteError, match=re.escape(f"{path}: train.seed: must be >= 1, got int 0")):
        load_profile("demo")  # TrainConfig's bounds are checked at load, not minutes later in router_head
    path = _profile_dir(tmp_path, monkeypatch, _set("backbone.device", "gpu"))
    with pytest.raises(RouterLiteError, match=re.escape(f"{path}: backbone.device 'gpu' is not one of")):
        load_profile("demo")
    path = _profile_dir(tmp_path, monkeypatch, lambda raw: raw.__setitem__("sources", {}))
    with pytest.raises(RouterLiteError, match=re.escape(f"{path}: `sources` is empty")):
        load_profile("demo")


@pytest.mark.parametrize("dotted, value, says", [
    ("train.folds", 1, "train.folds: must be >= 2, got int 1"),
    ("train.ridge_alphas", [1, 0], "train.ridge_alphas[1]: must be > 0, got int 0"),
    ("train.select", "best", "train.select: str 'best' is not one of crossfit, validation"),
    ("collection.top_p", 1.5, "collection.top_p: must be <= 1, got float 1.5"),
    ("collection.max_usd", -1, "collection.max_usd: must be >= 0, got int -1"),
    ("collection.new_agent_sample.confidence", 1.0,
     "collection.new_agent_sample.confidence: must be < 1, got float 1.0"),
    ("task_pool.size", 0, "task_pool.size: must be > 0, got int 0"),
    ("backbone.batch_size", 0, "backbone.batch_size: must be >= 1, got int 0"),
])
def test_a_value_out_of_bounds_is_one_line_naming_the_dotted_key(tmp_path, monkeypatch, dotted, value, says):
    """pydantic checks the bounds; its error is told as the profile's other errors are: file, dotted key, problem."""
    path = _profile_dir(tmp_path, monkeypatch, _set(dotted, value))
    with pytest.raises(RouterLiteError) as exc:
        load_profile("demo")
    assert str(exc.value) == f"{path}: {says}"


def test_a_section_built_in_code_gets_the_checks_of_a_read_one():
    from pipeline.collect.settings import CollectionSettings
    from pipeline.route.train import TrainConfig
    from pipeline.tasks.task_pool import TaskPoolConfig

    with pytest.raises(RouterLiteError, match=r"^TrainConfig.generations: expected an integer, got bool True$"):
        TrainConfig(generations=True).validate()
    with pytest.raises(RouterLiteError, match=r"^task_pool.size: expected an integer, got bool True$"):
        TaskPoolConfig(size=True)
    with pytest.raises(RouterLiteError, match=r"^collection.max_retries: must be >= 0, got int -1$"):
        CollectionSettings(max_retries=-1)
    assert TrainConfig(seed=3, ridge_alphas=(0.5,)).validate() is None and TaskPoolConfig(size=10).size == 10


def test_yaml_readings_are_coerced_losslessly(tmp_path, monkeypatch):
    def edit(raw):
        raw["train"] = {"ridge_alphas": ["1e-3", 10, 1.5], "sigma0": "2e-1", "popsize": 8.0, "patience": None}
        raw["collection"]["top_p"] = 1
        raw["pool"]["key_hosts"] = ["llm.example:8443"]
        raw["backbone"] = None  # an empty section: every default
    _profile_dir(tmp_path, monkeypatch, edit)
    prof = load_profile("demo")
    assert prof.train.ridge_alphas == (1e-3, 10, 1.5) and prof.train.sigma0 == 0.2
    assert prof.train.popsize == 8 and isinstance(prof.train.popsize, int) and prof.train.patience is None
    assert prof.collection.top_p == 1 and isinstance(prof.collection.top_p, int)  # the settings hash is unchanged
    assert prof.pool.key_hosts == ("llm.example:8443",) and prof.backbone == BackboneSettings()


def _documented(cls) -> set[str]:
    """Option names of the pycma-style tables (`name = default` lines) in the docstrings of cls and its bases."""
    return {name for name, _, _ in config.option_table(cls)}


@pytest.mark.parametrize("cls", profile.SECTIONS, ids=lambda c: c.__name__)
def test_every_option_is_in_its_section_table(cls):
    fields = {f.name for f in dataclasses.fields(cls) if f.metadata.get("yaml", True)}
    assert fields == _documented(cls)


@pytest.mark.parametrize("cls", profile.SECTIONS, ids=lambda c: c.__name__)
def test_every_written_default_is_the_fields_default(cls):
    """A table's `name = default` is the field's default wherever it is written as a Python literal (a default
    written as prose, a constructor call or with `...` is not compared)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    compared = 0
    for name, written, _ in config.option_table(cls):
        try:
            value = ast.literal_eval(written)
        except (ValueError, SyntaxError):
            continue
        if "..." in written:
            continue
        f = fields[name]
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        assert value == default, (name, written, default)
        compared += 1
    assert compared or cls is profile.Profile


def test_backbone_settings_match_the_resource():
    from resources.backbone import BackboneResource

    res = BackboneResource.model_fields
    for f in dataclasses.fields(BackboneSettings):
        assert f.name in res and res[f.name].default == f.default, f.name
    from pipeline.embed import backbone as embed

    hints = typing.get_type_hints(BackboneSettings)
    assert typing.get_args(hints["pooling"]) == embed.POOLINGS and typing.get_args(hints["dtype"]) == embed.DTYPES
    assert typing.get_args(hints["backend"]) == embed.BACKENDS


def test_pool_kinds_and_suites_match_their_owners():
    from assets.benchmark import SUITES
    from pipeline.report.suites import PROFILE_BUILDERS
    from resources.pool import KINDS

    assert profile.POOL_KINDS == list(KINDS)
    assert set(SUITES) == set(profile.BENCHMARK_SUITES) <= set(PROFILE_BUILDERS)


def test_a_definitions_build_reads_the_profile_once(monkeypatch):
    from assets.definitions import build_definitions

    reads = []
    real = config._read_yaml
    monkeypatch.setattr(config, "_read_yaml", lambda path: reads.append(path) or real(path))
    defs = build_definitions(profile="smoke")
    assert [Path(p).name for p in reads] == ["smoke.yaml"]
    assert defs.resolve_assets_def("graded_calls").partitions_def.get_partition_keys()  # a real build
    reads.clear()
    build_definitions(profile=load_profile("pilot"))
    assert [Path(p).name for p in reads] == ["pilot.yaml"]  # the load itself; the build adds none


def test_profile_is_typed_end_to_end():
    hints = typing.get_type_hints(Profile)
    assert hints["train"].__name__ == "TrainConfig" and hints["task_pool"].__name__ == "TaskPoolConfig"
