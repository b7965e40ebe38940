"""`router-lite train` on a reward matrix the project did not produce: the RouterBench subset (11 models), written
as plain reward rows + tasks files — then `route` and the registry's standalone reference code agree."""
import json
import re
import subprocess
import sys

import pandas as pd
import pytest

from cli.main import main
from pipeline.report.suites import build_suite

KEYS = {"head", "best_single", "oracle", "random", "knn", "headroom_captured", "distribution", "n_train", "n_test"}


@pytest.fixture(scope="module")
def own_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("own")
    s = build_suite("routerbench")
    ev = s.meta["per_query"]["eval_name"]
    keep = [i for i in range(s.n) if ev[i] == "mbpp"]
    rows = [{"task_id": s.query_ids[i], "agent_order": s.models, "mean_reward": s.quality[i].tolist(),
             "mean_cost": s.cost[i].tolist()} for i in keep]
    tasks = [{"task_id": s.query_ids[i], "prompt": s.query_text[i], "split": s.split[i]} for i in keep]
    pd.DataFrame(rows).to_json(d / "rewards.jsonl", orient="records", lines=True)
    pd.DataFrame(tasks).to_parquet(d / "tasks.parquet")
    return d


@pytest.mark.slow
def test_train_prints_one_json_object_and_registers(own_files, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path))
    rc = main(["train", "--rewards", str(own_files / "rewards.jsonl"), "--tasks", str(own_files / "tasks.parquet"),
               "--generations", "5", "--out", str(tmp_path / "reg")])
    assert rc == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert KEYS <= set(out)
    assert "**Pool verdict: " in captured.err and "Operating points (chosen by crossfit)" in captured.err
    assert out["operating_points"]["method"] == "crossfit" and out["operating_points"]["folds"] == 5
    assert out["pool_verdict"].startswith(("quality-dominated", "complementary"))
    assert {"max-quality", "parity", "quality>=0.98"} <= set(out["targets"])
    assert out["n_test"] == 128 and len(out["distribution"]) == 11
    assert {"head", "knn", "cluster"} <= set(out["prompt_routers"]) and "## Prompt routers" in captured.err
    assert set(out["shipped"]) >= {"kind", "validation", "test"} and out["shipped"]["test"] == out["head"]
    arena = out["router_arena"]  # RouterArena's optimality of the same picks (pipeline/report/arena.py)
    assert set(arena["targets"]) == set(out["targets"]) and set(arena["prompt_routers"]) == set(out["prompt_routers"])
    assert all(0 <= m["optimal_selection"] <= 1 and 0 < m["optimal_cost_ratio"] <= 1 + 1e-9
               for m in [*arena["targets"].values(), *arena["prompt_routers"].values()])
    head_dir = out["registered"]
    assert main(["route", "--head", head_dir, "Write a python function to reverse a list."]) == 0
    picked = capsys.readouterr().out.split("\t")[0]
    ref = subprocess.run([sys.executable, "reference.py", "Write a python function to reverse a list."],
                         cwd=head_dir, capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    assert ref.stdout.split("\t")[0] == picked
    assert main(["route", "--head", head_dir, "--target", "budget=0.001", "Write a python function."]) == 0
    assert "target budget=0.001" in capsys.readouterr().err
    assert main(["route", "--head", head_dir, "--target", "cheapest", "hi"]) == 2
    assert "unknown target 'cheapest'" in capsys.readouterr().err


def test_bad_inputs_are_one_clear_error(own_files, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path))
    tasks = pd.read_parquet(own_files / "tasks.parquet").drop(columns=["split"])
    tasks.to_parquet(tmp_path / "nosplit.parquet")
    assert main(["train", "--rewards", str(own_files / "rewards.jsonl"),
                 "--tasks", str(tmp_path / "nosplit.parquet")]) == 2
    assert "lacks column 'split'" in capsys.readouterr().err
    assert main(["train", "--rewards", str(own_files / "rewards.jsonl"), "--tasks", str(own_files / "tasks.parquet"),
                 "--ship-confidence", "1.5"]) == 2
    assert "TrainConfig.ship_confidence: must be < 1, got float 1.5" in capsys.readouterr().err
    assert main(["route", "--head", str(tmp_path / "missing"), "hi"]) == 2
    assert "not a registered router" in capsys.readouterr().err


def test_train_takes_its_defaults_and_help_from_train_config(capsys):
    """`router-lite train` repeats no TrainConfig default: the parser's defaults are the dataclass fields' and its
    help is the docstring table's meaning."""
    import dataclasses

    from cli.main import TRAIN_OPTIONS, build_parser
    from pipeline.core.config import option_table
    from pipeline.route.train import TrainConfig

    args = build_parser().parse_args(["train", "--rewards", "r.jsonl", "--tasks", "t.parquet"])
    fields = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
    assert {name: getattr(args, name) for name in TRAIN_OPTIONS} == {name: fields[name] for name in TRAIN_OPTIONS}
    assert TrainConfig(**{name: getattr(args, name) for name in TRAIN_OPTIONS}) == TrainConfig()
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    from cli.main import CLI_MEANING

    # TrainConfig's own meaning, or its short form where that names fields the command line lacks
    meaning = {**dict((name, text) for name, _, text in option_table(TrainConfig)), **CLI_MEANING}
    for name in TRAIN_OPTIONS:
        assert "--" + name.replace("_", "-") in help_text and " ".join(meaning[name].split()[:6]) in help_text


def test_every_option_of_every_command_has_help():
    """`router-lite X --help` explains every option and argument, and names no option the command lacks."""
    import argparse
    import dataclasses

    from cli.main import build_parser
    from pipeline.route.train import TrainConfig

    fields = {f.name for f in dataclasses.fields(TrainConfig)}  # the options a help text may name as ``field``
    missing, dangling = [], []

    def walk(parser, path):
        options = {o for a in parser._actions for o in a.option_strings}
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sub in a.choices.items():
                    walk(sub, f"{path} {name}")
            elif a.dest != "help" and not a.help:
                missing.append(f"{path} {'/'.join(a.option_strings) or a.dest}")
            elif a.help and a.help is not argparse.SUPPRESS:
                dangling.extend(f"{path} {a.dest}: {o}" for o in re.findall(r"``(\w+)``", a.help)
                                if o in fields and "--" + o.replace("_", "-") not in options)

    walk(build_parser(), "router-lite")
    assert not missing, missing
    assert not dangling, dangling


def test_serve_takes_its_defaults_and_help_from_serve_settings(capsys):
    """`router-lite serve` repeats no ServeSettings default: the parser's defaults are the dataclass fields', its
    help the docstring table's meaning, and the table's written defaults are the fields'."""
    import ast
    import dataclasses

    from cli.main import SERVE_OPTIONS, build_parser
    from pipeline.core.config import option_table
    from pipeline.serve.settings import ServeSettings

    args = build_parser().parse_args(["serve"])
    fields = {f.name: f.default for f in dataclasses.fields(ServeSettings)}
    assert {name: getattr(args, name) for name in SERVE_OPTIONS} == {name: fields[name] for name in SERVE_OPTIONS}
    assert ServeSettings(**{name: getattr(args, name) for name in SERVE_OPTIONS}) == ServeSettings()
    table = {name: (written, meaning) for name, written, meaning in option_table(ServeSettings)}
    assert set(SERVE_OPTIONS) <= set(table)
    assert all(ast.literal_eval(written) == fields[name] for name, (written, _) in table.items())
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    for name in SERVE_OPTIONS:
        assert "--" + name.replace("_", "-") in help_text and " ".join(table[name][1].split()[:6]) in help_text
