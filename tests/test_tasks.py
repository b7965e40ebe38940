import gzip
import json
import subprocess
import sys

import pandas as pd
import pytest

from pipeline.core.errors import RouterLiteError
from pipeline.tasks.sources import SOURCES, TASK_COLUMNS, data_dir, load_source
from pipeline.tasks.task_pool import TaskPoolConfig, build_task_pool, drop_duplicate_prompts, pool_counts

BUNDLED = [k for k, s in SOURCES.items() if s.bundled]


@pytest.fixture(scope="module")
def all_tasks():
    return {k: load_source(k) for k in BUNDLED}


@pytest.mark.parametrize("key", BUNDLED)
def test_every_bundled_source_loads_and_normalises(all_tasks, key):
    df = all_tasks[key]
    assert list(df.columns) == TASK_COLUMNS
    assert df["task_id"].is_unique
    assert df["task_id"].str.fullmatch(rf"{key}/test/\d{{6}}").all()
    assert df["gold"].str.len().gt(0).all()
    assert set(df["difficulty"]) <= {"easy", "medium", "hard"}
    assert df["domain"].nunique() == 1 and df["domain"].iloc[0] == SOURCES[key].domain


def test_expected_sizes(all_tasks):
    sizes = {k: len(v) for k, v in all_tasks.items()}
    assert sizes == {"math500": 500, "gsm8k": 1319, "aime2025_i": 15, "aime2025_ii": 15, "arc_challenge": 1172,
                     "mmlu": 14042, "mmlu_pro": 12032,
                     "zeroeval_gsm8k": 1319, "zeroeval_math_l5": 721, "zeroeval_crux": 800, "alpaca_eval": 805}


def _row(df, **where):
    sel = df
    for k, v in where.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, where
    return sel.iloc[0]


def test_gold_answers_checked_by_hand(all_tasks):
    # Janet's ducks: 16 - 3 - 4 = 9 eggs at $2 → 18
    assert _row(all_tasks["gsm8k"], task_id="gsm8k/test/000000")["gold"] == "18"
    assert "Janet" in _row(all_tasks["gsm8k"], task_id="gsm8k/test/000000")["prompt"]
    # AIME 2025 I problem 1 (bases b > 9 with 17_b | 97_b: 21 + 49 = 70); AIME 2025 II problem 1 is 468
    assert _row(all_tasks["aime2025_i"], task_id="aime2025_i/test/000000")["gold"] == "70"
    assert _row(all_tasks["aime2025_ii"], task_id="aime2025_ii/test/000000")["gold"] == "468"
    assert _row(all_tasks["aime2025_ii"], task_id="aime2025_ii/test/000014")["gold"] == "240"
    m = _row(all_tasks["math500"], task_id="math500/test/000000")
    assert m["gold"] == r"\left( 3, \frac{\pi}{2} \right)" and m["grader"] == "math_expression"
    arc = _row(all_tasks["arc_challenge"], question_id="Mercury_7175875")
    assert arc["gold"] == "C" and "C. Planetary days will become shorter." in arc["prompt"]
    # Q(sqrt2, sqrt3, sqrt18) = Q(sqrt2, sqrt3): degree 4 = option B
    mm = all_tasks["mmlu"]
    first = mm[mm["category"] == "abstract_algebra"].iloc[0]
    assert first["gold"] == "B" and "B. 4" in first["prompt"]
    pro = _row(all_tasks["mmlu_pro"], question_id="70")
    assert pro["gold"] == "I" and pro["choices"] == 9 and pro["category"] == "business"


def test_difficulty_rules(all_tasks):
    m = all_tasks["math500"]
    assert (m["difficulty"] == "hard").sum() == 262  # levels 4-5
    assert (all_tasks["aime2025_i"]["difficulty"] == "hard").all()
    assert set(all_tasks["mmlu_pro"]["difficulty"]) == {"medium", "hard"}


def test_rlpr_without_file_names_the_config_key():
    with pytest.raises(RouterLiteError, match=r"sources\.rlpr\.path"):
        load_source("rlpr")


def test_rlpr_from_a_local_file(tmp_path):
    f = tmp_path / "rlpr.jsonl"
    f.write_text(json.dumps({"prompt": [{"role": "user", "content": "What is 2+2?"}],
                             "reward_model": {"ground_truth": "4"}}) + "\n")
    df = load_source("rlpr", path=str(f))
    assert df.iloc[0]["gold"] == "4" and "What is 2+2?" in df.iloc[0]["prompt"]


def test_unknown_source_key():
    with pytest.raises(RouterLiteError, match="unknown source 'nope'"):
        load_source("nope")


def test_missing_and_corrupt_files_name_the_file(tmp_path):
    with pytest.raises(RouterLiteError, match="not found: .*missing.jsonl"):
        load_source("gsm8k", path=str(tmp_path / "missing.jsonl"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": "#### 1"}\n{not json\n')
    with pytest.raises(RouterLiteError, match=r"bad.jsonl: line 2 is not valid JSON"):
        load_source("gsm8k", path=str(bad))
    gz = tmp_path / "broken.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(RouterLiteError, match="broken.jsonl.gz"):
        load_source("gsm8k", path=str(gz))
    pq = tmp_path / "bad.parquet"
    pq.write_bytes(b"PAR1 not really")
    with pytest.raises(RouterLiteError, match="bad.parquet"):
        load_source("mmlu_pro", path=str(pq))


def test_row_without_gold_names_file_and_row(tmp_path):
    f = tmp_path / "math.jsonl"
    rows = [{"problem": "1+1?", "answer": "2", "level": 1}, {"problem": "2+2?", "answer": "", "level": 1}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with pytest.raises(RouterLiteError, match=r"math.jsonl: row 1: no 'answer'"):
        load_source("math500", path=str(f))


def test_hub_path_through_datasets_load_dataset(tmp_path):
    # the real `datasets.load_dataset` code path, on a local data file in the hub schema of openai/gsm8k
    f = tmp_path / "gsm8k.jsonl"
    with gzip.open(data_dir() / "sources" / SOURCES["gsm8k"].bundled, "rt") as fh:
        f.write_text("".join(fh.readlines()[:5]))
    df = load_source("gsm8k", hub_id=str(f))
    assert len(df) == 5 and df.iloc[0]["gold"] == "18"
    # a hub-style dataset directory (parquet) in the schema of cais/mmlu: choices list + integer answer
    d = tmp_path / "mmlu_hub"
    d.mkdir()
    pd.DataFrame({"question": ["Capital of France?"], "subject": ["geography"],
                  "choices": [["Rome", "Paris", "Oslo", "Bern"]],
                  "answer": [1]}).to_parquet(d / "test.parquet")
    df = load_source("mmlu", hub_id=str(d), hub_split="test")  # split inferred from the file name
    assert df.iloc[0]["gold"] == "B" and "B. Paris" in df.iloc[0]["prompt"]
    with pytest.raises(RouterLiteError, match="hub dataset 'no/such-dataset'"):
        load_source("mmlu", hub_id="no/such-dataset")


PILOT_SOURCES = ("math500", "gsm8k", "aime2025_i", "aime2025_ii", "arc_challenge", "mmlu", "mmlu_pro")


def _seed_pool(all_tasks, **kw):
    """The pilot profile's pool: its seven seed sources (not the ZeroEval copies)."""
    seed = [v for k, v in all_tasks.items() if k in PILOT_SOURCES]
    return build_task_pool(pd.concat(seed, ignore_index=True), TaskPoolConfig(**kw))


def test_seed_pool_balanced_and_split(all_tasks):
    pool = _seed_pool(all_tasks)
    assert len(pool) == 1110 and pool["task_id"].is_unique
    counts = pool_counts(pool)
    assert counts["domain"] == {"knowledge": 370, "math": 370, "reasoning": 370}
    for _, g in pool.groupby("domain"):  # equal thirds of difficulty inside each domain
        assert g["difficulty"].value_counts().max() - g["difficulty"].value_counts().min() <= 1
    shares = pool["split"].value_counts(normalize=True)
    assert abs(shares["train"] - 0.58) < 0.02 and abs(shares["validation"] - 0.20) < 0.02
    assert abs(shares["test"] - 0.22) < 0.02
    # without rlpr, the reasoning third comes from ARC-Challenge
    assert set(pool[pool["domain"] == "reasoning"]["source"]) == {"arc_challenge"}


def test_pool_is_deterministic_and_order_independent(all_tasks):
    a = _seed_pool(all_tasks)
    shuffled = {k: v.sample(frac=1, random_state=7) for k, v in reversed(list(all_tasks.items()))}
    b = _seed_pool(shuffled)
    assert a.equals(b)
    c = _seed_pool(all_tasks, seed=43)
    assert not a["task_id"].equals(c["task_id"])


def test_demo_pool_stratified_by_category_with_ood(all_tasks):
    cfg = TaskPoolConfig(size=3000, balance="category", split={"train": 0.6, "validation": 0.2, "test": 0.2},
                     ood_categories=("history", "philosophy"))
    pool = build_task_pool(all_tasks["mmlu_pro"], cfg)
    assert len(pool) == 3000 and pool["category"].nunique() == 14
    full = drop_duplicate_prompts(all_tasks["mmlu_pro"])[0]["category"].value_counts(normalize=True)  # one per prompt
    got = pool["category"].value_counts(normalize=True)
    assert (got - full).abs().max() < 0.002
    assert (pool[pool["ood"]]["split"] == "test").all()
    assert set(pool[pool["ood"]]["category"]) == {"history", "philosophy"}


def test_zeroeval_sources(all_tasks):
    gsm, math, crux = (all_tasks[k] for k in ("zeroeval_gsm8k", "zeroeval_math_l5", "zeroeval_crux"))
    janet = _row(gsm, task_id="zeroeval_gsm8k/test/000000")
    # the exact ZeroEval prompt (the replay's key), its gold "# 18" read as 18, the seed gsm8k's step rule
    assert janet["prompt"].startswith("\n## Question: \n\nJanet") and '"answer": "___"' in janet["prompt"]
    assert janet["gold"] == "18" and janet["grader"] == "integer" and janet["question_id"] == "gsm:gsm8k-main-test-#0"
    seed = all_tasks["gsm8k"].set_index("task_id")["difficulty"]
    assert (gsm["difficulty"].to_numpy() == seed.to_numpy()).all()  # same questions, same order, same rule
    assert not gsm["gold"].str.contains(",").any()  # "# 1,600" -> 1600
    assert set(math["difficulty"]) == {"hard"} and (math["grader"] == "math_expression").all()
    assert set(math["category"]) == {"geometry", "other"} and (math["category"] == "geometry").sum() == 123
    assert _row(math, task_id="zeroeval_math_l5/test/000000")["gold"] == "-15"
    assert (crux["grader"] == "python_literal").all() and crux["domain"].eq("reasoning").all()
    assert crux["difficulty"].value_counts().to_dict() == {"medium": 295, "easy": 265, "hard": 240}
    first = _row(crux, task_id="zeroeval_crux/test/000000")
    assert first["gold"] == "[(4, 1), (4, 1), (4, 1), (4, 1), (2, 3), (2, 3)]" and "def f(nums):" in first["prompt"]


def test_zeroeval_prompts_are_recorded_for_all_ten_models(all_tasks):
    from pipeline.collect.replay import ReplayStore
    from pipeline.core.prompts import prompt_hash

    store = ReplayStore.load(data_dir() / "replay" / "zeroeval_outputs.parquet")
    assert len(store.models()) == 10 and len(store) == 28_400
    for key in ("zeroeval_gsm8k", "zeroeval_math_l5", "zeroeval_crux"):
        hashes = set(all_tasks[key]["prompt"].map(prompt_hash))
        assert all(hashes <= store.hashes(m) for m in store.models()), key


def test_zeroeval_pool_split_by_source_with_geometry_out_of_distribution(all_tasks):
    tasks = pd.concat([all_tasks[k] for k in ("zeroeval_gsm8k", "zeroeval_math_l5", "zeroeval_crux")])
    cfg = TaskPoolConfig(size=2840, balance="category", stratify_column="source", ood_column="category",
                     ood_categories=("geometry",), split={"train": 0.6, "validation": 0.2, "test": 0.2})
    pool = build_task_pool(tasks, cfg)
    assert len(pool) == 2840 and pool["ood"].sum() == 123
    assert set(pool[pool["ood"]]["source"]) == {"zeroeval_math_l5"} and (pool[pool["ood"]]["split"] == "test").all()
    inside = pool[~pool["ood"]]
    for _, g in inside.groupby("source"):  # 60/20/20 inside every source
        shares = g["split"].value_counts(normalize=True)
        assert abs(shares["train"] - 0.6) < 0.01 and abs(shares["test"] - 0.2) < 0.01


def test_profile_ood_rule(tmp_path, monkeypatch):
    from pipeline.profile import load_profile

    demo = load_profile("demo")
    assert demo.task_pool.ood_column == "category" and demo.task_pool.ood_categories == ("geometry",)
    assert load_profile("mmlu_pro").task_pool.ood_categories == ("history", "philosophy")
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "bad.yaml").write_text("sources: {gsm8k: {}}\ntask_pool: {ood: [geometry]}\n")
    monkeypatch.setenv("ROUTER_LITE_CONFIG", str(tmp_path))
    with pytest.raises(RouterLiteError, match=r"bad.yaml: task_pool.ood: expected a mapping"):
        load_profile("bad")


def test_duplicate_task_ids_rejected(all_tasks):
    df = all_tasks["aime2025_i"]
    with pytest.raises(RouterLiteError, match="duplicate task_id"):
        build_task_pool(pd.concat([df, df.iloc[:1]]),
                        TaskPoolConfig(size=10, balance="category", stratify_column="source"))


def test_importing_pipeline_pulls_in_no_dagster():
    code = ("import sys, importlib, pkgutil, pipeline\n"
            "names = [m.name for m in pkgutil.walk_packages(pipeline.__path__, 'pipeline.')]\n"
            "assert len(names) > 40, names\n"
            "for n in names: importlib.import_module(n)\n"
            "bad = sorted(m for m in sys.modules if m == 'dagster' or m.startswith('dagster.'))\n"
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
