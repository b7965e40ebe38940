"""Fuzzing `router-lite train` with generated bad rewards and tasks files: whatever is wrong, the command
ends with exit code 2, exactly one error line on stderr, nothing on stdout, and nothing written to --out.

Each example starts from a valid pair of files (20 tasks, 3 agents) and breaks one thing: a field of one row set to
a wrong value (type, range, length, null, unicode), a duplicated or missing row, the whole file replaced by random
bytes or text, a wrong --held-out-split. Every break is invalid by construction, so any exit 0 is a hole in the
door's checks. Formats: JSONL, CSV and Parquet. Bounded: EXAMPLES per test (HYPOTHESIS_EXAMPLES overrides).
"""
import contextlib
import io
import json
import math
import os
import tempfile
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cli.main import main

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
AGENTS = ["a", "b", "c"]
N = 20
SPLITS = ["train"] * 12 + ["validation"] * 4 + ["test"] * 4


def good_rewards():
    return [{"task_id": f"t{i}", "agent_order": list(AGENTS), "mean_reward": [float((i + j) % 2) for j in range(3)],
             "mean_cost": [0.001, 0.002, 0.003]} for i in range(N)]


def good_tasks():
    return [{"task_id": f"t{i}", "prompt": f"question {i}", "split": SPLITS[i]} for i in range(N)]


# --- invalid values per field -----------------------------------------------------------------------------------
no_list_text = st.text(max_size=8).filter(lambda t: not t.lstrip().startswith(("[", "(")))  # CSV would parse it
junk = st.one_of(st.none(), st.booleans(), no_list_text,
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
                 st.lists(st.integers(), max_size=2), st.integers())
out_of_range = st.floats(allow_nan=True, allow_infinity=True).filter(lambda x: not 0.0 <= x <= 1.0)
bad_reward_entry = st.one_of(out_of_range, st.text(max_size=6), st.none(), st.booleans(),
                             st.lists(st.floats(0, 1), max_size=2),
                             st.dictionaries(st.text(max_size=2), st.floats(0, 1), max_size=1))
bad_reward_list = st.one_of(
    st.lists(st.floats(0, 1), max_size=6).filter(lambda v: len(v) != 3),       # wrong length
    st.integers(0, 2).flatmap(lambda j: bad_reward_entry.map(lambda x: (j, x))),  # one bad entry
    junk.filter(lambda v: not (isinstance(v, list) and len(v) == 3)),             # not a list of 3
)
bad_agent_order = st.one_of(
    st.just(["a"]), st.just([]), st.just(["a", "a", "b"]), st.just(["a", "b", "d"]), st.just(["c", "b", "a"]),
    st.lists(st.one_of(st.integers(), st.none()), min_size=3, max_size=3), junk.filter(lambda v: v != AGENTS))
bad_text = st.one_of(st.none(), st.just(""), st.just("   "), st.integers(), st.floats(allow_nan=True), st.booleans(),
                     st.lists(st.text(max_size=3), max_size=2))


non_object_row = st.one_of(st.lists(st.integers(), max_size=3), st.text(max_size=5), st.integers())


def drop_column(draw, rows: list[dict], columns: list[str]) -> None:
    """Remove one required column (drawn from `columns`) from every row."""
    col = draw(st.sampled_from(columns))
    for r in rows:
        r.pop(col)


@st.composite
def broken_rewards(draw):
    rows = good_rewards()
    i = draw(st.integers(0, N - 1))
    kind = draw(st.sampled_from(["reward", "order", "task_id", "dup", "cost", "best", "drop_col", "non_object"]))
    if kind == "reward":
        v = draw(bad_reward_list)
        if isinstance(v, tuple):
            j, x = v
            rows[i]["mean_reward"][j] = x
        else:
            rows[i]["mean_reward"] = v
    elif kind == "order":
        rows[i]["agent_order"] = (draw(bad_agent_order) if i
                                  else draw(st.sampled_from([["a"], [], ["a", "a", "b"], [1, 2, 3]])))
    elif kind == "task_id":
        rows[i]["task_id"] = draw(st.one_of(st.none(), st.just(""), st.just(f"t{(i + 1) % N}")))
    elif kind == "dup":
        rows.insert(draw(st.integers(0, N)), dict(rows[i]))
    elif kind == "cost":
        rows[i]["mean_cost"] = draw(st.one_of(st.lists(st.floats(0, 1), max_size=5).filter(lambda v: len(v) != 3),
                                              st.just([-1.0, 0.0, 0.0]), st.just(["x", 0.0, 0.0])))
    elif kind == "best":
        rows[i]["best_agents"] = draw(st.sampled_from([["z"], [], ["a", "nobody"]]))
        for r in rows:
            r.setdefault("best_agents", ["a"])
    elif kind == "drop_col":
        drop_column(draw, rows, ["task_id", "agent_order", "mean_reward"])
    else:
        rows[i] = draw(non_object_row)
    return kind, rows


csv_bad_text = st.sampled_from([None, "", "   "])  # a CSV cell is text: 5 or True are the prompts "5", "True"


@st.composite
def broken_tasks(draw, ext):
    rows = good_tasks()
    i = draw(st.integers(0, N - 1))
    kind = draw(st.sampled_from(["prompt", "split", "task_id", "dup", "missing_row", "drop_col", "non_object"]))
    if kind in ("prompt", "split"):
        rows[i][kind] = draw(csv_bad_text if ext == ".csv" else bad_text)
    elif kind == "task_id":
        rows[i]["task_id"] = draw(st.one_of(st.none(), st.just(""), st.just(f"t{(i + 1) % N}")))
    elif kind == "dup":
        rows.insert(draw(st.integers(0, N)), dict(rows[i]))
    elif kind == "missing_row":
        rows.pop(i)
    elif kind == "drop_col":
        drop_column(draw, rows, ["task_id", "prompt", "split"])
    else:
        rows[i] = draw(non_object_row)
    return kind, rows


def write(path: Path, rows) -> bool:
    """Write rows in the format of path's extension; False when that format cannot hold them (skip the example)."""
    try:
        if path.suffix == ".jsonl":
            path.write_text("".join(json.dumps(r, allow_nan=True) + "\n" for r in rows))
        elif not all(isinstance(r, dict) for r in rows):
            return False  # a non-object row exists only in JSON lines
        elif path.suffix == ".csv":
            pd.DataFrame(rows).to_csv(path, index=False)
        else:
            pd.DataFrame(rows).to_parquet(path)
            # pyarrow coerces some mixes (False in a list of floats becomes 0.0): keep only files that hold the rows
            back = pd.read_parquet(path).to_dict("records")
            plain = [{k: v.tolist() if hasattr(v, "tolist") else v for k, v in r.items()} for r in back]
            if json.dumps(plain, default=str) != json.dumps(rows, default=str):
                return False
    except Exception:  # noqa: BLE001 - e.g. pyarrow cannot store a column of mixed types
        return False
    return True


def run_train(rewards: Path, tasks: Path, out: Path, held_out: str = "test"):
    err, std = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(std):
        rc = main(["train", "--rewards", str(rewards), "--tasks", str(tasks), f"--held-out-split={held_out}",
                   "--generations", "1", "--out", str(out)])
    return rc, err.getvalue(), std.getvalue()


def assert_refused(rc, err, std, out, context):
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("router-lite: error: "), (context, rc, err)
    assert std == "" and not out.exists(), context


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path / "home"))


fmt = st.sampled_from([".jsonl", ".csv", ".parquet"])


@FUZZ
@given(broken=broken_rewards(), ext=fmt)
def test_fuzzed_rewards_file_is_one_error_line(broken, ext):
    kind, rows = broken
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        assume(write(d / f"rewards{ext}", rows))
        write(d / "tasks.jsonl", good_tasks())
        assert_refused(*run_train(d / f"rewards{ext}", d / "tasks.jsonl", d / "out"), d / "out", (kind, ext, rows))


@FUZZ
@given(data=st.data(), ext=fmt)
def test_fuzzed_tasks_file_is_one_error_line(data, ext):
    kind, rows = data.draw(broken_tasks(ext))
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        assume(write(d / f"tasks{ext}", rows))
        write(d / "rewards.jsonl", good_rewards())
        assert_refused(*run_train(d / "rewards.jsonl", d / f"tasks{ext}", d / "out"), d / "out", (kind, ext, rows))


@FUZZ
@given(content=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode)),
       which=st.sampled_from(["rewards", "tasks"]), ext=st.sampled_from([".jsonl", ".csv", ".parquet", ".txt", ""]))
def test_random_bytes_as_a_file_is_one_error_line(content, which, ext):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        write(d / "rewards.jsonl", good_rewards())
        write(d / "tasks.jsonl", good_tasks())
        bad = d / f"{which}_fuzz{ext}"
        bad.write_bytes(content)
        r, t = (bad, d / "tasks.jsonl") if which == "rewards" else (d / "rewards.jsonl", bad)
        assert_refused(*run_train(r, t, d / "out"), d / "out", (which, ext, content))


@FUZZ
@given(split=st.text(max_size=12).filter(lambda s: s not in ("test", "validation")))
def test_unknown_held_out_split_is_one_error_line(split):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        write(d / "rewards.jsonl", good_rewards())
        write(d / "tasks.jsonl", good_tasks())
        assert_refused(*run_train(d / "rewards.jsonl", d / "tasks.jsonl", d / "out", split), d / "out", split)


@pytest.mark.slow
def test_the_unbroken_files_train():
    """The fuzz's starting point is valid: every refusal above is owed to the one thing broken."""
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        for ext in (".jsonl", ".csv", ".parquet"):
            write(d / f"rewards{ext}", good_rewards())
            write(d / f"tasks{ext}", good_tasks())
            rc, err, std = run_train(d / f"rewards{ext}", d / f"tasks{ext}", d / f"out{ext}")
            assert rc == 0, err
            assert math.isfinite(json.loads(std)["head"])
