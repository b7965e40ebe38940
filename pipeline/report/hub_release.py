"""What a Hub release holds: the tasks dataset, the rewards dataset (no prompt text) and the registered head, each
with its card, as commit operations per repository. Builds everything locally; resources/hub.py does the network.

One `--repo-id OWNER/NAME` gives three repositories, so each card describes exactly one thing:
dataset `OWNER/NAME-tasks`, dataset `OWNER/NAME-rewards`, model `OWNER/NAME` (the head).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from huggingface_hub import CommitOperationAdd, DatasetCard, DatasetCardData, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from pipeline.core.errors import RouterLiteError
from pipeline.report.datasets import dataset_card

# Hub licence ids per bundled source (pipeline/report/datasets.py SOURCE_LICENCES has the full attribution text)
SOURCE_LICENSE_IDS = {"math500": "mit", "gsm8k": "mit", "mmlu": "mit", "mmlu_pro": "apache-2.0",
                      "arc_challenge": "cc-by-sa-4.0"}
# columns that would carry a prompt or a reply: never in the rewards dataset
TEXT_COLUMNS = {"prompt", "user_text", "question", "problem", "messages", "completion", "response", "answer_text",
                "choices"}
HEAD_FILES = ("manifest.json", "head.safetensors", "guard.npz", "scorer.safetensors", "cost_scorer.safetensors",
              "reference.py")


@dataclass
class RepoRelease:
    """One repository's commit: path_in_repo → local file (Path) or generated content (bytes)."""
    repo_id: str
    repo_type: str  # "dataset" | "model"
    files: dict[str, Path | bytes] = field(default_factory=dict)
    commit_message: str = ""

    def operations(self) -> list[CommitOperationAdd]:
        return [CommitOperationAdd(path_in_repo=p, path_or_fileobj=f) for p, f in sorted(self.files.items())]

    def describe(self) -> dict:
        """Each operation with its size and sha256 (what `--dry-run` prints)."""
        ops = [{"op": "add", "path_in_repo": o.path_in_repo, "bytes": o.upload_info.size,
                "sha256": o.upload_info.sha256.hex()} for o in self.operations()]
        return {"repo_id": self.repo_id, "repo_type": self.repo_type, "commit_message": self.commit_message,
                "operations": ops}


def check_repo_id(repo_id: str) -> str:
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise RouterLiteError(f"--repo-id {repo_id!r} must be OWNER/NAME (e.g. my-org/router-lite)")
    try:
        for suffix in ("", "-tasks", "-rewards"):
            validate_repo_id(repo_id + suffix)
    except HFValidationError as exc:
        raise RouterLiteError(f"--repo-id {repo_id!r} is not a valid Hub repository id: {exc}") from None
    return repo_id


def _size_category(n: int) -> str:
    for limit, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < limit:
            return name
    return "n>1M"


def _license(sources) -> dict:
    ids = {SOURCE_LICENSE_IDS.get(s, "other") for s in sources}
    if len(ids) == 1 and "other" not in ids:
        return {"license": ids.pop()}
    # the card's "Sources and licences" section lists each source's licence and attribution
    return {"license": "other", "license_name": "mixed-per-source", "license_link": "README.md#sources-and-licences"}


def _splits(folder: Path) -> dict[str, Path]:
    files = {p.stem: p for p in sorted(folder.glob("*.parquet"))}
    if not files:
        raise RouterLiteError(f"{folder} holds no published dataset (*.parquet): materialise task_pool and "
                              f"reward_matrix first (`router-lite run`)")
    return files


def _read(files: dict[str, Path]) -> pd.DataFrame:
    parts = [pd.read_parquet(p) for p in files.values()]
    return pd.concat([d if "split" in d else d.assign(split=s) for s, d in zip(files, parts)], ignore_index=True)


def hub_dataset_card(df: pd.DataFrame, files: dict[str, Path], title: str, description: str,
                     task_categories: list[str], tags: list[str]) -> DatasetCard:
    """The local card (pipeline/report/datasets.py) under Hub metadata: licence, task categories, size, one config whose
    splits are the uploaded Parquet files."""
    data = DatasetCardData(
        pretty_name=title, language=["en"], task_categories=task_categories, tags=tags,
        size_categories=_size_category(len(df)),
        configs=[{"config_name": "default", "data_files": [{"split": s, "path": f"data/{s}.parquet"}
                                                           for s in files]}],
        **_license(sorted(df["source"].unique()) if "source" in df else []))
    return DatasetCard(f"---\n{data.to_yaml()}\n---\n\n{dataset_card(df, title, description)}")


def assert_no_prompt_text(rewards: pd.DataFrame, tasks: pd.DataFrame) -> None:
    """The rewards dataset carries ids and numbers only: no text column, and no cell equal to a task's prompt."""
    bad = sorted(TEXT_COLUMNS & set(rewards.columns))
    if bad:
        raise RouterLiteError(f"rewards dataset has text column(s) {bad}: it must not carry prompt text")
    prompts = set(tasks["prompt"].astype(str)) if "prompt" in tasks else set()
    for col in rewards.columns:
        if rewards[col].dtype == object:
            hit = rewards[col].map(lambda v: isinstance(v, str) and v in prompts)
            if hit.any():
                row = rewards[hit].iloc[0]
                where = f"task {row['task_id']}" if "task_id" in rewards else f"row {hit.to_numpy().argmax()}"
                raise RouterLiteError(f"rewards dataset column {col!r} ({where}) holds a task's prompt text: it "
                                      f"must not carry prompt text")


def _dataset_release(repo_id: str, folder: Path, df: pd.DataFrame, title: str, description: str,
                     task_categories: list[str], tags: list[str]) -> RepoRelease:
    files = _splits(folder)
    card = hub_dataset_card(df, files, title, description, task_categories, tags)
    out = {"README.md": str(card).encode()}
    out.update({f"data/{s}.parquet": p for s, p in files.items()})
    return RepoRelease(repo_id, "dataset", out, f"router-lite: publish {title}")


def _round(v):
    return round(v, 4) if isinstance(v, float) else v


def head_model_card(manifest: dict, repo_id: str) -> ModelCard:
    m = manifest.get("metrics", {})
    data = ModelCardData(
        license="apache-2.0", library_name="router-lite", pipeline_tag="text-classification",
        base_model=manifest["backbone"]["id"], datasets=[f"{repo_id}-tasks", f"{repo_id}-rewards"],
        tags=["llm-routing", "router", "safetensors", "cma-es"], model_name=manifest["name"])
    agents = "\n".join(f"| {i} | `{a['name']}` | `{a['model']}` |" for i, a in enumerate(manifest["agents"]))
    metrics = "\n".join(f"| {k} | {_round(m[k])} |" for k in ("head", "best_single", "knn", "random", "oracle",
                                                              "headroom_captured", "n_train", "n_test") if k in m)
    body = f"""# {manifest['name']}

A BenchGen Router Lite router (kind `{manifest.get('router_kind', 'head')}`): it embeds a query with the frozen
backbone `{manifest['backbone']['id']}` and picks one agent of the pool below (trained with separable CMA-ES on the
rewards dataset `{repo_id}-rewards`; tasks in `{repo_id}-tasks`). {manifest.get('n_params', '?')} parameters.

## Agents

| index | name | model |
|---|---|---|
{agents}

## Held-out reward

| metric | value |
|---|---|
{metrics}

## Files

- `head.safetensors`: the head; `scorer.safetensors` / `cost_scorer.safetensors`: value and cost scorers behind
  the operating points (when present); `guard.npz`: the out-of-distribution guard (training embeddings, float16)
- `manifest.json`: backbone, agents, training config, data hashes, metrics, operating points
- `reference.py`: standalone embed-and-pick (numpy + sentence-transformers):
  `python reference.py "Which planet is largest?"`
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}")


def head_release(repo_id: str, head_dir: Path) -> RepoRelease:
    head_dir = Path(head_dir)
    mf = head_dir / "manifest.json"
    if not mf.exists():
        raise RouterLiteError(f"{head_dir} is not a registered head (no manifest.json): materialise registered_head "
                              f"first (`router-lite run`)")
    manifest = json.loads(mf.read_text())
    # what serve would refuse is not published either: the entry is loaded as serve loads it, whatever its kind
    # (each kind checks its own files: a cascade its cascade.json, one line naming the file and the field)
    from pipeline.route.registry import load

    load(head_dir)
    named = [n for n in (manifest.get("files") or {}).values()  # other router kinds' files: plain names inside only
             if isinstance(n, str) and n and Path(n).name == n and n not in (".", "..")]
    files: dict[str, Path | bytes] = {n: head_dir / n for n in dict.fromkeys([*HEAD_FILES, *named])
                                      if (head_dir / n).is_file() and not (head_dir / n).is_symlink()}
    files["README.md"] = str(head_model_card(manifest, repo_id)).encode()
    return RepoRelease(repo_id, "model", files, f"router-lite: publish head {manifest['name']}")


def latest_head(registry_dir: Path) -> Path:
    from pipeline.route.registry import LATEST, latest_path

    path = latest_path(registry_dir)
    if path is None:
        raise RouterLiteError(f"no promoted router ({Path(registry_dir) / LATEST} missing): materialise "
                              f"promotion first (`router-lite run`), or `router-lite promote NAME`")
    return path


def build_release(repo_id: str, datasets_dir: Path, head_dir: Path) -> list[RepoRelease]:
    """The three commits of a release, checked: valid repo id, datasets present, rewards without prompt text."""
    check_repo_id(repo_id)
    datasets_dir = Path(datasets_dir)
    tasks_files, rewards_files = _splits(datasets_dir / "tasks"), _splits(datasets_dir / "rewards")
    tasks, rewards = _read(tasks_files), _read(rewards_files)
    assert_no_prompt_text(rewards, tasks)
    return [
        _dataset_release(f"{repo_id}-tasks", datasets_dir / "tasks", tasks, "BenchGen Router Lite tasks",
                         "Balanced task pool (prompt, gold answer, grader, source, split) the router is trained "
                         "and evaluated on.", ["question-answering", "text-generation"], ["llm-routing", "benchmark"]),
        _dataset_release(f"{repo_id}-rewards", datasets_dir / "rewards", rewards, "BenchGen Router Lite rewards",
                         f"Mean reward per task and agent over repetitions; no prompt text (join `{repo_id}-tasks` "
                         "by task_id).", ["text-classification"], ["llm-routing", "rewards"]),
        head_release(repo_id, head_dir),
    ]
