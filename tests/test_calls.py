"""Durable call log: keys, torn trailing line, resume, error rows never count as done."""
from __future__ import annotations

import json

import pytest

from pipeline.collect.call_log import CALL_FIELDS, CallLog, call_key
from pipeline.core.errors import RouterLiteError


def row(agent="a", task="mmlu_pro/test/000001", rep=0, status="ok", **kw):
    k = call_key(agent, task, rep, "s1")
    base = {"call_key": k, "agent": agent, "model": "m", "task_id": task, "repetition": rep, "settings_hash": "s1",
            "status": status, "error_kind": "" if status != "error" else "timeout",
            "response_text": None if status == "error" else "The answer is (A).", "extracted": None,
            "correct": None if status == "error" else True, "prompt_tokens": 10, "completion_tokens": 5,
            "cost_usd": 0.001, "latency_ms": 12.0, "finish_reason": "stop", "ts": "2025-01-01T00:00:00Z"}
    base.update(kw)
    return base


def test_call_key_format_and_validation():
    assert call_key("frontier_a", "mmlu_pro/test/000007", 2, "abc") == "frontier_a|mmlu_pro/test/000007|2|abc"
    with pytest.raises(RouterLiteError, match="agent"):
        call_key("a|b", "t", 0, "s")
    with pytest.raises(RouterLiteError, match="repetition"):
        call_key("a", "t", -1, "s")


def test_append_read_keys_one_file_per_agent(tmp_path):
    log = CallLog(tmp_path / "calls")
    assert log.keys() == set() and log.read().empty and list(log.read().columns) == CALL_FIELDS
    log.append(row("a", "t/1"))
    log.append(row("b", "t/1", status="empty", correct=False))
    log.append(row("a", "t/2", status="error"))
    assert sorted(p.name for p in log.files()) == ["a.jsonl", "b.jsonl"]
    assert log.keys() == {call_key("a", "t/1", 0, "s1"), call_key("b", "t/1", 0, "s1")}  # the error is not done
    df = log.read()
    assert len(df) == 3 and list(df.columns)[: len(CALL_FIELDS)] == CALL_FIELDS
    assert df.loc[df.status == "error", "correct"].isna().all()
    # a fresh reader sees the same (nothing is cached in memory only)
    assert CallLog(tmp_path / "calls").keys() == log.keys()


def test_torn_trailing_line_is_ignored_then_repaired(tmp_path):
    log = CallLog(tmp_path)
    log.append(row("a", "t/1"))
    log.close()
    path = tmp_path / "a.jsonl"
    full = json.dumps(row("a", "t/2"))
    with open(path, "ab") as fh:  # a crash in the middle of a write: no newline at the end
        fh.write(full[: len(full) // 2].encode())
    reader = CallLog(tmp_path)
    assert reader.keys() == {call_key("a", "t/1", 0, "s1")}
    assert len(reader.read()) == 1
    # the next writer cuts the torn tail before appending, so the log stays line-aligned
    writer = CallLog(tmp_path)
    writer.append(row("a", "t/3"))
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and all(json.loads(x) for x in lines[:-1])
    assert writer.keys() == {call_key("a", "t/1", 0, "s1"), call_key("a", "t/3", 0, "s1")}


def test_complete_json_without_newline_is_not_acknowledged(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(row(task="t/1")) + "\n" + json.dumps(row(task="t/2")))
    assert CallLog(tmp_path).keys() == {call_key("a", "t/1", 0, "s1")}


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    (tmp_path / "a.jsonl").write_text(json.dumps(row()) + "\n{not json\n" + json.dumps(row(task="t/9")) + "\n")
    with pytest.raises(RouterLiteError, match=r"a\.jsonl:2"):
        CallLog(tmp_path).read()


def test_resume_error_then_ok_latest_prefers_done(tmp_path):
    log = CallLog(tmp_path)
    log.append(row("a", "t/1", status="error"))
    assert call_key("a", "t/1", 0, "s1") not in log.keys()
    log.append(row("a", "t/1", status="ok"))
    log.append(row("a", "t/2", status="error", error_kind="rate_limit"))
    log.append(row("a", "t/2", status="error", error_kind="timeout"))
    latest = log.latest().set_index("call_key")
    assert latest.loc[call_key("a", "t/1", 0, "s1"), "status"] == "ok"
    assert latest.loc[call_key("a", "t/2", 0, "s1"), "error_kind"] == "timeout"
    assert len(log.read()) == 4 and len(latest) == 2


def test_bad_rows_rejected(tmp_path):
    log = CallLog(tmp_path)
    with pytest.raises(RouterLiteError, match="status"):
        log.append(row(status="wrong"))
    with pytest.raises(RouterLiteError, match="call_key"):
        log.append({"agent": "a", "status": "ok"})
    assert log.read().empty


def test_append_many_group_commit_and_nan(tmp_path):
    log = CallLog(tmp_path)
    log.append_many([row("a", f"t/{i}", cost_usd=float("nan")) for i in range(5)] + [row("b", "t/0")])
    df = log.read()
    assert len(df) == 6 and df["cost_usd"].isna().sum() == 5
