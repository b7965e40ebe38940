import os

# tests never reach a hub: models and datasets come from bundled files
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import uuid  # noqa: E402

import pytest  # noqa: E402
from _support import (  # noqa: E402
    REPO,
    SESSION_MARK,
    AutomationTicks,
    SmokeLineage,
    built_once,
    copy_home,
    instance_dagster_yaml,
    repo_instance_files,
    session_processes,
)


@pytest.fixture(scope="session", autouse=True)
def no_trace(tmp_path_factory):
    """Tests leave no trace: the whole suite runs Dagster in a temporary instance (DAGSTER_HOME, whatever the caller,
    e.g. the Makefile, set) with a temporary ROUTER_LITE_HOME; after the last test it fails (an error in the
    session's teardown) when a file under the repository's instance folders was written, or when a process the suite
    started is still alive. Under pytest-xdist each worker is a session with a mark of its own: it checks the
    processes it started, never another worker's."""
    mp = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("instance")
    mp.setenv("DAGSTER_HOME", str(instance_dagster_yaml(root / "dagster_home")))
    mp.setenv("ROUTER_LITE_HOME", str(root / "router_lite_home"))
    mark = uuid.uuid4().hex
    mp.setenv(SESSION_MARK, mark)
    before = repo_instance_files()
    yield
    mp.undo()
    after = repo_instance_files()
    written = sorted(f for f, t in after.items() if before.get(f) != t)
    assert not written, (f"the tests wrote {len(written)} file(s) under the repository's instance folders (first: "
                         f"{written[:5]}): run Dagster on a temporary instance (DAGSTER_HOME) and home")
    import time

    from pipeline.collect import bounded

    bounded.close()  # the grading workers (the forkserver's children) go now, not at exit
    for _ in range(20):  # a process being stopped gets a moment to go
        left = session_processes(mark)
        if not left:
            break
        time.sleep(0.25)
    assert not left, f"the tests left {len(left)} process(es) running: {left}"


@pytest.fixture(scope="session")
def smoke_lineage(tmp_path_factory) -> SmokeLineage:
    """The whole lineage of the `smoke` profile (300 MMLU-Pro tasks, replay pool, MiniLM) materialised once for the
    run (once for all pytest-xdist workers: `built_once`), on a persistent temp Dagster instance, between two ticks
    of the automation evaluator (what the sensor sees of `router-lite run`: tests/test_automation.py reads them
    rather than running the lineage once more)."""
    return built_once(tmp_path_factory, "smoke", _materialise_smoke)


def _materialise_smoke(root) -> SmokeLineage:
    from dagster import DagsterInstance

    home, dagster_home = root / "home", root / "dagster"
    dagster_home.mkdir()
    # the repo's dagster.yaml with its relative dirs made absolute under this temp root
    text = (REPO / "dagster.yaml").read_text()
    (dagster_home / "dagster.yaml").write_text(text.replace(".router-lite/dagster", str(dagster_home / "instance")))
    mp = pytest.MonkeyPatch()
    mp.setenv("ROUTER_LITE_HOME", str(home))
    mp.setenv("DAGSTER_HOME", str(dagster_home))
    from assets.definitions import build_definitions
    from cli.run import run_lineage

    defs = build_definitions(home=str(home), profile="smoke")
    try:
        with DagsterInstance.get() as inst:
            ticks = AutomationTicks(defs, inst)
            before = ticks()
            run_lineage(defs, "smoke", log=lambda m: None, instance=inst)
            after = ticks()
    finally:
        mp.undo()
    return SmokeLineage(home, dagster_home, (before, after), ticks.cursor)


@pytest.fixture(scope="session")
def smoke_home(smoke_lineage):
    """`smoke_lineage`'s (ROUTER_LITE_HOME, DAGSTER_HOME) as Paths: read only (`smoke_home_copy` for a test that
    writes)."""
    return smoke_lineage.home, smoke_lineage.dagster_home


# --- operations tests (tests/test_ops.py, test_dask.py, test_postgres.py, test_ui.py) -----------------------------

@pytest.fixture
def smoke_home_copy(smoke_home, tmp_path):
    """A private copy of the materialised smoke ROUTER_LITE_HOME (assets, call log, caches) that a test may change;
    `drop` names top-level folders (e.g. "calls") left out of the copy. Its backbone cache is hard-linked
    (tests/_support.py `copy_home`)."""

    def make(name: str = "home", drop: tuple[str, ...] = ()):
        return copy_home(smoke_home[0], tmp_path / name, drop=drop)

    return make


@pytest.fixture
def temp_instance_dir(tmp_path):
    """A DAGSTER_HOME with the repo's dagster.yaml, its relative storage folders made absolute under tmp_path
    (so the concurrency block is the repo's own)."""
    return instance_dagster_yaml(tmp_path / "dagster_home")


@pytest.fixture
def quiet_instance_dir(tmp_path):
    """`temp_instance_dir` without compute-log capture: for a test that runs a step in a thread of its own."""
    return instance_dagster_yaml(tmp_path / "dagster_home", capture_logs=False)


def pytest_collection_modifyitems(config, items):
    """A test that takes the materialised lineage (`smoke_lineage`, `smoke_home`, `smoke_home_copy`) is `slow` even
    when its module forgot the mark, so `make test-fast` (`-m "not slow"`) never materialises the lineage."""
    for item in items:
        if {"smoke_lineage", "smoke_home", "smoke_home_copy"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# ---------------------------------------------------------------------------------------------- shared test data
# a static backbone distilled in seconds: every token but these words and BERT's special tokens is dropped
TINY_WORDS = ("the a an of to in is what which how write python function list reverse sort number sum two three four "
              "derivative x squared law contract court capacitor voltage resistor enzyme protein cell gene energy mass "
              "velocity market price demand integral matrix series string return find largest smallest given array "
              "element count words first last print code program value true false answer question").split()


@pytest.fixture(scope="session")
def tiny_distill() -> dict:
    """Distillation settings of a tiny static backbone (`tiny_static`; tests/test_static_backbone.py)."""
    import re

    return {"pca_dims": 16, "token_remove_pattern": r"^(?!(?:" + "|".join(map(re.escape, TINY_WORDS))
            + r"|\[UNK\]|\[PAD\]|\[CLS\]|\[SEP\]|\[MASK\])$)"}


@pytest.fixture(scope="session")
def tiny_static(tmp_path_factory, tiny_distill):
    """A static model distilled from the bundled MiniLM with the hub unreachable (HF_HUB_OFFLINE=1), under its cache
    key: once for the run (a distillation costs seconds of CPU; once for all pytest-xdist workers: `built_once`), read
    only (a test that changes it copies it)."""
    from pipeline.embed import static_backbone
    from pipeline.embed.backbone import bundled_model_path

    def distill(root):
        mp = pytest.MonkeyPatch()
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        src = bundled_model_path()
        try:
            return static_backbone.build_static(src, root / static_backbone.distill_key(src, **tiny_distill),
                                                **tiny_distill)
        finally:
            mp.undo()

    return built_once(tmp_path_factory, "static", distill)


def _synthetic_cascade(n=3000, seed=0):
    """Two formats. 'integer': cheap agents 1 and 2 are right together 80 % of the time and agree then; when wrong
    they disagree. 'math_expression': cheap agents are weak and their agreement means little. Agent 0 is right 85 %
    everywhere and costs 1. Returns (R, C, E, graders, masks)."""
    import numpy as np

    from pipeline.collect.answers import agreement

    rng = np.random.default_rng(seed)
    g = np.where(rng.random(n) < 0.6, "integer", "math_expression")
    R = np.zeros((n, 3))
    answers = []
    for i in range(n):
        strong = rng.random() < 0.85
        if g[i] == "integer":
            cheap = rng.random() < 0.8
            a = ["1" if strong else "2", "1" if cheap else "3", "1" if cheap else "4"]
            R[i] = [strong, cheap, cheap]
        else:
            c1, c2 = rng.random() < 0.4, rng.random() < 0.4
            a = ["1" if strong else "2", "1" if c1 else "5", "1" if c2 else "5"]  # wrong answers agree too
            R[i] = [strong, c1, c2]
        answers.append(a)
    C = np.tile([1.0, 0.02, 0.03], (n, 1))
    split = np.array(["train", "validation", "test"])[rng.integers(0, 3, n)]
    masks = {"train": split == "train", "validation": split == "validation", "held_out": split == "test"}
    return R, C, agreement(answers, g.tolist()), g, masks


@pytest.fixture(scope="session")
def synthetic_cascade():
    """A factory of a synthetic 3-agent matrix with answers whose agreement a cascade can use (n, seed)."""
    return _synthetic_cascade


@pytest.fixture
def static_head_dir(tmp_path, tiny_static):
    """(a registered head over a tiny static backbone and the mmlu_pro replay pool's agents, 12 recorded prompts):
    a `serve` process loads it in seconds (tests/test_serve_workers.py, tests/test_serve_keys.py)."""
    import numpy as np

    from pipeline.embed.backbone import Backbone, Runtime
    from pipeline.route import registry
    from pipeline.route.head import Head
    from pipeline.route.ood import OODGuard
    from pipeline.tasks.sources import load_source
    from resources.pool import PoolResource

    bb = Backbone(tiny_static, runtime=Runtime(log_every=10**9))
    pool = PoolResource(kind="replay", pool="mmlu_pro")
    agents, store = pool.agents(), pool.store()
    prompts = [p for p in load_source("mmlu_pro")["prompt"].iloc[:200]
               if all(store.text_for(a.model, p) is not None for a in agents)][:12]
    X = bb.encode(prompts)
    rng = np.random.default_rng(0)
    head = Head(rng.normal(size=(bb.dim, len(agents))), np.zeros(len(agents)), agents=[a.name for a in agents])
    guard = OODGuard(k=3).fit(X[:8], X[8:])
    head_dir = registry.register(
        tmp_path / "reg", head, registry.PromptFit(guard, 0),
        backbone={"id": bb.model_id, "key": bb.key, "pooling": "mean", "max_seq_length": 256, "dim": bb.dim,
                  **bb.registry_fields()},
        agents=[{"name": a.name, "model": a.model} for a in agents], training={}, data_hashes={}, metrics={})
    return head_dir, prompts


def _small_head_parts(seed=0):
    """(a linear head over 3 agents a, b, c on 8-d embeddings, its OOD guard, 50 unit embeddings): a registry entry
    made in milliseconds."""
    import numpy as np

    from pipeline.route.head import Head
    from pipeline.route.ood import OODGuard

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(50, 8)).astype(np.float32)
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    head = Head(rng.normal(size=(8, 3)), rng.normal(size=3), agents=["a", "b", "c"])
    guard = OODGuard(k=5).fit(X[:40], X[40:])
    return head, guard, X


def _register_small_head(root, seed=0):
    from pipeline.route import registry

    head, guard, _ = _small_head_parts(seed)
    return registry.register(root, head, registry.PromptFit(guard, 1),
                             backbone={"id": "sentence-transformers/all-MiniLM-L6-v2", "dim": 8},
                             agents=[{"name": n, "model": f"m-{n}"} for n in "abc"], training={"generations": 3},
                             data_hashes={"rewards": "x"}, metrics={"head": 0.5})


@pytest.fixture(scope="session")
def small_head_parts():
    """A factory: (head, guard, X) of a small head (seed)."""
    return _small_head_parts


@pytest.fixture(scope="session")
def register_small_head():
    """A factory: the registry entry of a small head under `root` (seed); the same seed gives the same entry."""
    return _register_small_head


def _cascade_point(plan, names, quality: float, cost: float) -> dict:
    """An operating point of a cascade's `cascade.json` holding `plan` over agents `names` (the figures the target
    resolution reads; the rest zero)."""
    return {"plan": plan.to_dict(names), "quality": quality, "ci_low": quality, "ci_high": quality,
            "cost_per_1k": cost, "gain": 0.0, "gain_low": 0.0, "gain_high": 0.0, "gain_se": 0.0,
            "shares": {a: 0.0 for a in names}, "lambda": 0.0}


@pytest.fixture(scope="session")
def cascade_point():
    """A factory of cascade operating points: (plan, agent names, quality, cost per 1k) -> the point's dict."""
    return _cascade_point
