"""RateLog: throttled progress lines with rate and ETA (embedding, collection)."""
from pipeline.core.progress import RateLog


def test_rate_and_eta_lines_are_throttled_and_final_line_always_shows():
    now = [100.0]
    lines: list[str] = []
    p = RateLog("embedding", "prompts", lines.append, every_s=5.0, clock=lambda: now[0])
    now[0] = 102.0
    p(200, 1000)  # first tick: shown
    now[0] = 104.0
    p(400, 1000)  # 2 s after the last line: throttled
    now[0] = 110.0
    p(1000, 1000)  # the end: always shown
    assert lines == ["embedding: 200/1,000 prompts, 100.0 prompts/s, ETA 8 s",
                     "embedding: 1,000/1,000 prompts, 100.0 prompts/s, in 10 s"]


def test_long_eta_reads_in_minutes():
    p = RateLog("collect", "calls", lambda s: None, clock=lambda: 10.0)
    p.t0 = 0.0
    assert p.line(100, 100_000) == "collect: 100/100,000 calls, 10.0 calls/s, ETA 2 h 46 min"
    assert p.line(0, 10) == "collect: 0/10 calls"


def test_run_prints_and_stores_stage_times(tmp_path, capsys):
    import json

    from cli.main import print_stage_times

    times = {"stages": {"collection": 12.5, "router": 30.25}, "steps": {"prompt_embeddings": 20.0}, "total_s": 44.0}
    print_stage_times(times, str(tmp_path))
    out = capsys.readouterr().out
    assert "total 44.0" in out and "router" in out and "prompt_embeddings 20.0" in out
    assert json.loads((tmp_path / "reports" / "stage_times.json").read_text()) == times
