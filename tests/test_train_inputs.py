"""`router-lite train` at its door: a bad rewards or tasks file is one error line naming
the file, row and field, exit code 2, and nothing is written to --out. CSV and Parquet are read by extension."""
import json

import numpy as np
import pandas as pd
import pytest

from cli.main import main

AGENTS = ["a", "b", "c"]


def rewards_rows(n=20, agents=AGENTS):
    rng = np.random.default_rng(0)
    return [{"task_id": f"t{i}", "agent_order": list(agents),
             "mean_reward": [float(x) for x in rng.integers(0, 2, len(agents))]} for i in range(n)]


def tasks_rows(n=20):
    splits = ["train"] * 12 + ["validation"] * 4 + ["test"] * 4
    return [{"task_id": f"t{i}", "prompt": f"question number {i} about {'math' if i % 2 else 'history'}",
             "split": splits[i % len(splits)]} for i in range(n)]


def write(path, rows):
    df = pd.DataFrame(rows)
    if path.suffix == ".parquet":
        df.to_parquet(path)
    elif path.suffix == ".csv":
        df.to_csv(path, index=False)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def train(tmp_path, rewards, tasks, *extra, capsys):
    out = tmp_path / "reg"
    rc = main(["train", "--rewards", str(rewards), "--tasks", str(tasks), "--generations", "2", "--out", str(out),
               *extra])
    err = capsys.readouterr().err
    return rc, err, out


def assert_one_error(rc, err, out, *needles):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("router-lite: error: "), err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert not out.exists()


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path / "home"))
    return tmp_path


def test_duplicate_task_id_in_rewards_names_file_and_id(files, capsys):
    rows = rewards_rows()
    rows.append(dict(rows[3]))
    r, t = write(files / "r.jsonl", rows), write(files / "t.jsonl", tasks_rows())
    assert_one_error(*train(files, r, t, capsys=capsys), "r.jsonl", "task_id 't3' appears 2 times", "rows 4, 21")


def test_duplicate_task_id_in_tasks_names_file_and_id(files, capsys):
    rows = tasks_rows()
    rows.append(dict(rows[5]))
    r, t = write(files / "r.jsonl", rewards_rows()), write(files / "t.parquet", rows)
    assert_one_error(*train(files, r, t, capsys=capsys), "t.parquet", "task_id 't5' appears 2 times")


@pytest.mark.parametrize("content", [b"", b"\n\n"])
def test_empty_rewards_file(files, capsys, content):
    r = files / "r.jsonl"
    r.write_bytes(content)
    t = write(files / "t.jsonl", tasks_rows())
    assert_one_error(*train(files, r, t, capsys=capsys), "r.jsonl", "empty" if not content else "no rows")


def test_empty_parquet_and_csv(files, capsys):
    r = files / "r.parquet"
    pd.DataFrame({"task_id": pd.Series([], dtype=str)}).to_parquet(r)
    t = write(files / "t.jsonl", tasks_rows())
    assert_one_error(*train(files, r, t, capsys=capsys), "r.parquet", "no rows")
    c = files / "r.csv"
    c.write_text("")
    assert_one_error(*train(files, c, t, capsys=capsys), "r.csv", "empty")


def test_short_mean_reward_row_names_row(files, capsys):
    rows = rewards_rows()
    rows[7]["mean_reward"] = [1.0, 0.0]
    r, t = write(files / "r.jsonl", rows), write(files / "t.jsonl", tasks_rows())
    assert_one_error(*train(files, r, t, capsys=capsys), "r.jsonl: row 8 (task_id 't7')",
                     "mean_reward has 2 values for 3 agents")


def test_string_rewards_rejected(files, capsys):
    rows = rewards_rows()
    rows[2]["mean_reward"] = ["1", "0", "0.5"]
    r, t = write(files / "r.jsonl", rows), write(files / "t.jsonl", tasks_rows())
    assert_one_error(*train(files, r, t, capsys=capsys), "row 3 (task_id 't2')", "agent 'a' is str '1', not a number")


def test_reward_outside_unit_interval_names_row(files, capsys):
    rows = rewards_rows()
    rows[9]["mean_reward"] = [0.0, 1.5, 0.0]
    r, t = write(files / "r.jsonl", rows), write(files / "t.jsonl", tasks_rows())
    assert_one_error(*train(files, r, t, capsys=capsys), "r.jsonl: row 10 (task_id 't9')", "agent 'b' is 1.5",
                     "outside [0, 1]")


def test_unknown_held_out_split(files, capsys):
    r, t = write(files / "r.jsonl", rewards_rows()), write(files / "t.jsonl", tasks_rows())
    assert_one_error(*train(files, r, t, "--held-out-split", "tset", capsys=capsys),
                     "--held-out-split 'tset'", "splits: test, train, validation")


def test_single_agent_matrix_rejected(files, capsys):
    r, t = write(files / "r.jsonl", rewards_rows(agents=["only"])), write(files / "t.jsonl", tasks_rows())
    assert_one_error(*train(files, r, t, capsys=capsys), "r.jsonl", "1 agent(s); routing needs at least 2")


def test_unknown_extension_and_missing_task(files, capsys):
    r, t = write(files / "r.jsonl", rewards_rows()), write(files / "t.jsonl", tasks_rows())
    x = files / "r.xlsx"
    x.write_bytes(b"PK\x03\x04")
    assert_one_error(*train(files, x, t, capsys=capsys), "r.xlsx", "unsupported rewards file type '.xlsx'")
    t2 = write(files / "t2.jsonl", tasks_rows()[:-1])
    assert_one_error(*train(files, r, t2, capsys=capsys), "r.jsonl: row 20", "'t19' has no row in")


@pytest.mark.slow
def test_csv_and_parquet_files_train(files, capsys):
    """CSV cells hold the list fields as text; the head trained from CSV equals the one from Parquet/JSONL."""
    r_csv, t_csv = write(files / "r.csv", rewards_rows()), write(files / "t.csv", tasks_rows())
    rc, err, out = train(files, r_csv, t_csv, capsys=capsys)
    assert rc == 0, err
    r_pq, t_pq = write(files / "r.parquet", rewards_rows()), write(files / "t.jsonl", tasks_rows())
    rc2 = main(["train", "--rewards", str(r_pq), "--tasks", str(t_pq), "--generations", "2",
                "--out", str(files / "reg2")])
    assert rc2 == 0
    a = json.loads((next(out.iterdir()) / "manifest.json").read_text())
    b = json.loads((next((files / "reg2").iterdir()) / "manifest.json").read_text())
    assert a["metrics"] == b["metrics"] and a["agents"] == b["agents"]


@pytest.mark.slow
def test_published_rewards_with_split_and_source_columns(files, capsys):
    """A rewards file that also carries split/source (as the published rewards dataset does) trains; the tasks
    file's values are the ones used."""
    rows = [{**r, "split": "train", "source": "x"} for r in rewards_rows()]
    r, t = write(files / "r.parquet", rows), write(files / "t.jsonl", tasks_rows())
    rc, err, out = train(files, r, t, capsys=capsys)
    assert rc == 0, err
    manifest = json.loads((next(out.iterdir()) / "manifest.json").read_text())
    assert manifest["metrics"]["n_test"] == 4


# --- cascades from a user's matrix: `answers` in the rewards, `grader` in the tasks ----------------------
def _with_answers(rows, answers):
    return [{**r, "answers": a} for r, a in zip(rows, answers)]


@pytest.mark.parametrize("answers, needles", [
    ([["1", "2"]] * 20, ["row 1", "answers has 2 values for 3 agents"]),
    ([["1", 2, None]] * 20, ["row 1", "answers for agent 'b'", "text"]),
    ([["1", "2", "x" * 6000]] * 20, ["answers for agent 'c'", "at most 5000"]),
])
def test_bad_answers_are_one_error(files, capsys, answers, needles):
    r = write(files / "r.jsonl", _with_answers(rewards_rows(), answers))
    t = write(files / "t.jsonl", [{**row, "grader": "integer"} for row in tasks_rows()])
    assert_one_error(*train(files, r, t, capsys=capsys), "r.jsonl", *needles)


def test_unknown_grader_in_tasks_is_one_error(files, capsys):
    r = write(files / "r.jsonl", _with_answers(rewards_rows(), [["1", "2", None]] * 20))
    t = write(files / "t.jsonl", [{**row, "grader": "morse" if i == 3 else "integer"}
                                  for i, row in enumerate(tasks_rows())])
    assert_one_error(*train(files, r, t, capsys=capsys), "t.jsonl", "row 4", "grader 'morse'", "known:")
