"""Publishing to the Hub, up to the network: cards parsed by huggingface_hub, the exact commit operations of
`router-lite publish --dry-run`, the rewards dataset without prompt text, and one error line without a token."""
import hashlib
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from _support import copy_home
from huggingface_hub import CommitOperationAdd, DatasetCard, ModelCard, RepoCard

from cli.main import main
from pipeline.core.errors import RouterLiteError
from pipeline.report.hub_release import _license, build_release, latest_head
from pipeline.route import registry

pytestmark = pytest.mark.slow  # the smoke_home lineage (make test-fast leaves it out)

TASK_FILES = ["README.md", "data/test.parquet", "data/train.parquet", "data/validation.parquet"]
HEAD_FILES = ["README.md", "cost_scorer.safetensors", "guard.npz", "head.safetensors", "manifest.json",
              "reference.py", "scorer.safetensors"]


@pytest.fixture
def published(smoke_home, monkeypatch):
    home = smoke_home[0]
    monkeypatch.setenv("ROUTER_LITE_HOME", str(home))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return home


def test_dry_run_lists_the_exact_files_and_commit_operations(published, capsys):
    assert main(["publish", "--repo-id", "me/router-lite", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    plan = {r["repo_id"]: r for r in json.loads(out)["repos"]}
    assert {k: v["repo_type"] for k, v in plan.items()} == {
        "me/router-lite-tasks": "dataset", "me/router-lite-rewards": "dataset", "me/router-lite": "model"}
    assert [o["path_in_repo"] for o in plan["me/router-lite-tasks"]["operations"]] == TASK_FILES
    assert [o["path_in_repo"] for o in plan["me/router-lite-rewards"]["operations"]] == TASK_FILES
    # the model repo is the ★ router of latest.json (best validation AIQ): every file of its entry, and its card;
    # the printout names the head beside it
    latest = registry.latest_entry(published / "registry")
    head_dir = latest_head(published / "registry")
    assert head_dir == Path(latest["path"]) and json.loads(out)["router"] == latest["name"]
    assert json.loads(out)["head"] == latest["head"]["name"] and latest["head"]["name"] in err
    files = sorted(["README.md", *(f.name for f in head_dir.iterdir() if f.is_file())])
    assert [o["path_in_repo"] for o in plan["me/router-lite"]["operations"]] == files
    if latest["name"] == latest["head"]["name"]:
        assert files == HEAD_FILES
    assert "CommitOperationAdd(path_in_repo='data/train.parquet')" in err
    # the operations are huggingface_hub's own, over the very files on disk
    releases = build_release("me/router-lite", published / "datasets", head_dir)
    ops = releases[2].operations()
    assert all(isinstance(o, CommitOperationAdd) for o in ops)
    name = json.loads((head_dir / "manifest.json").read_text())["files"].get("weights", "head.safetensors")
    weights = next(o for o in ops if o.path_in_repo == name)
    assert weights.upload_info.sha256.hex() == hashlib.sha256((head_dir / name).read_bytes()).hexdigest()
    listed = {o["path_in_repo"]: o["sha256"] for o in plan["me/router-lite"]["operations"]}
    assert listed[name] == weights.upload_info.sha256.hex()
    train = next(o for o in plan["me/router-lite-tasks"]["operations"] if o["path_in_repo"] == "data/train.parquet")
    assert train["bytes"] == (published / "datasets" / "tasks" / "train.parquet").stat().st_size


def test_publish_dry_run_from_a_copied_home_publishes_the_copys_router(smoke_home, tmp_path, monkeypatch, capsys):
    """A home copied with `cp -a` (symlinks kept) to a new path, the original gone: the pointer resolves to the
    copy's entry and `publish --dry-run` lists the copy's files."""
    first = copy_home(smoke_home[0], tmp_path / "first", symlinks=True)
    moved = copy_home(first, tmp_path / "moved", symlinks=True)
    shutil.rmtree(first)
    monkeypatch.setenv("ROUTER_LITE_HOME", str(moved))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    entry = registry.latest_entry(moved / "registry")
    assert Path(entry["path"]).is_relative_to(moved.resolve()) and registry.load(entry["path"]).name == entry["name"]
    assert main(["publish", "--repo-id", "me/router-lite", "--dry-run"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["router"] == entry["name"]
    model = next(r for r in out["repos"] if r["repo_type"] == "model")
    assert "manifest.json" in [o["path_in_repo"] for o in model["operations"]]


def test_cards_parse_with_huggingface_hub(published):
    tasks, rewards, head = build_release("me/router-lite", published / "datasets",
                                         latest_head(published / "registry"))
    for r in (tasks, rewards):
        text = r.files["README.md"].decode()
        yaml.safe_load(text.split("---")[1])  # the front matter is plain YAML
        card = DatasetCard(text)
        assert card.data.license == "apache-2.0"  # smoke: MMLU-Pro only
        assert card.data.size_categories == "n<1K" and card.data.language == ["en"]
        splits = {f["split"]: f["path"] for f in card.data.configs[0]["data_files"]}
        assert splits == {s: f"data/{s}.parquet" for s in ("test", "train", "validation")}
        assert set(splits.values()) <= set(r.files)
    assert DatasetCard(tasks.files["README.md"].decode()).data.task_categories == ["question-answering",
                                                                                 "text-generation"]
    assert "no prompt text" in DatasetCard(rewards.files["README.md"].decode()).text
    model = ModelCard(head.files["README.md"].decode())
    manifest = json.loads((latest_head(published / "registry") / "manifest.json").read_text())
    assert model.data.base_model == manifest["backbone"]["id"]
    assert model.data.datasets == ["me/router-lite-tasks", "me/router-lite-rewards"]
    assert model.data.license == "apache-2.0" and "llm-routing" in model.data.tags
    assert manifest["name"] in model.text and "reference.py" in model.text
    assert isinstance(RepoCard(head.files["README.md"].decode()).data.to_dict(), dict)


def test_rewards_dataset_carries_no_prompt_text(published, tmp_path):
    tasks = pd.concat([pd.read_parquet(p) for p in (published / "datasets" / "tasks").glob("*.parquet")])
    for s in ("train", "validation", "test"):
        rows = pd.read_parquet(published / "datasets" / "rewards" / f"{s}.parquet")
        assert "prompt" not in rows
        for col in rows.columns:
            if rows[col].dtype == object:
                assert not rows[col].map(lambda v: isinstance(v, str) and v in set(tasks["prompt"])).any()
    # a rewards dataset that leaks prompts is refused, by column name and by content
    bad = tmp_path / "datasets"
    shutil.copytree(published / "datasets", bad, ignore=shutil.ignore_patterns("hf"))
    f = bad / "rewards" / "train.parquet"
    rows = pd.read_parquet(f)
    rows.assign(note=tasks["prompt"].iloc[0]).to_parquet(f)
    with pytest.raises(RouterLiteError, match=r"column 'note' \(task \S+\) holds a task's prompt"):
        build_release("me/rl", bad, latest_head(published / "registry"))
    rows.assign(prompt="x").to_parquet(f)
    with pytest.raises(RouterLiteError, match=r"text column\(s\) \['prompt'\]"):
        build_release("me/rl", bad, latest_head(published / "registry"))


def test_missing_token_is_one_error_line_and_a_token_is_never_printed(published, capsys, monkeypatch):
    assert main(["publish", "--repo-id", "me/router-lite"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        ("router-lite: error: HF_TOKEN is not set: export a Hugging Face write token as HF_TOKEN (or use --dry-run "
         "to list what would be pushed)")]
    assert main(["publish", "--repo-id", "not-a-repo-id", "--dry-run"]) == 2
    assert "--repo-id 'not-a-repo-id' must be OWNER/NAME" in capsys.readouterr().err
    # with a token, the push stops at huggingface_hub's offline switch: no request leaves, the token is not shown
    monkeypatch.setenv("HF_TOKEN", "hf_NotARealToken0123456789")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["publish", "--repo-id", "me/router-lite"]) == 2
    out, err = capsys.readouterr()
    assert "HF_HUB_OFFLINE is set" in err and "hf_NotARealToken" not in out + err


def test_hub_release_asset_is_opt_in_and_dry_runs_in_dagster(published, monkeypatch):
    from dagster import DagsterInstance, materialize

    from assets.definitions import build_assets, build_definitions, build_resources
    from cli.run import stages_of

    stages = stages_of(build_definitions(str(published), "smoke"))
    assert "hub_release" not in {k for _, keys, _ in stages for k in keys}  # opt-in: not one of `router-lite run`'s
    monkeypatch.setenv("HF_TOKEN", "hf_NotARealToken0123456789")  # the asset's EnvVar resolves at launch
    result = materialize(build_assets("smoke"), selection=["hub_release"],
                         resources=build_resources(str(published), "smoke"), instance=DagsterInstance.ephemeral(),
                         run_config={"ops": {"hub_release": {"config": {"repo_id": "me/rl", "dry_run": True}}}})
    out = result.output_for_node("hub_release")
    assert out["commits"] == [] and [r["repo_id"] for r in out["repos"]] == ["me/rl-tasks", "me/rl-rewards", "me/rl"]
    assert [o["path_in_repo"] for o in out["repos"][2]["operations"]] == HEAD_FILES
    mat = result.asset_materializations_for_node("hub_release")[0]
    assert "hf_NotARealToken" not in repr(mat.metadata) + repr([e.message for e in result.all_events])


def test_hub_release_dry_runs_without_a_token_and_a_push_says_what_is_missing(published, monkeypatch):
    from dagster import DagsterInstance, materialize

    from assets.definitions import build_assets, build_resources

    monkeypatch.delenv("HF_TOKEN", raising=False)

    def run(dry_run: bool):
        return materialize(build_assets("smoke"), selection=["hub_release"], raise_on_error=False,
                           resources=build_resources(str(published), "smoke"), instance=DagsterInstance.ephemeral(),
                           run_config={"ops": {"hub_release": {"config": {"repo_id": "me/rl", "dry_run": dry_run}}}})

    dry = run(True)
    assert dry.success and dry.output_for_node("hub_release")["commits"] == []
    push = run(False)
    assert not push.success
    failure = next(e for e in push.all_events if e.event_type_value == "STEP_FAILURE")
    assert "HF_TOKEN is not set" in str(failure.event_specific_data.error)


def test_a_card_licence_is_one_hub_id_only_when_every_source_shares_it():
    assert _license(["mmlu", "gsm8k"]) == {"license": "mit"}
    mixed = _license(["mmlu_pro", "gsm8k"])
    assert mixed["license"] == "other" and mixed["license_link"] == "README.md#sources-and-licences"
    assert _license(["aime2025_i"])["license"] == "other"  # no licence stated by the redistributor
