"""RateLog: throttled progress lines with rate and ETA (embedding, collection)."""
import pytest

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


class _SlowClock:
    """A clock that moves `step` seconds on every reading: each step of a phase looks slow."""

    def __init__(self, step: float):
        self.t, self.step = 1000.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


def _kind_selection(_):
    import numpy as np

    from pipeline.route.select import crossfit_picks
    from pipeline.route.train import PromptRows, Selection

    rng = np.random.default_rng(0)
    X, R = rng.normal(size=(200, 4)).astype(np.float32), (rng.random((200, 3)) < 0.5).astype(float)
    split = np.arange(200) % 3
    crossfit_picks(["knn"], None, ["a", "b", "c"], PromptRows(X, R), split == 0, split == 1, Selection("crossfit", 12))


def _operating_points(_):
    import numpy as np

    from pipeline.route.targets import PathRows, operating_path

    rng = np.random.default_rng(0)
    R, C = rng.random((60, 3)), np.tile([0.01, 0.002, 0.001], (60, 1))
    operating_path(PathRows(R + rng.normal(0, 0.1, R.shape), np.zeros(60, np.int64), R, C), C.mean(axis=0), 0,
                   ["a", "b", "c"], lambdas=np.linspace(0, 50, 40))


def _cascade_search(synthetic_cascade):
    from pipeline.route.cascade_fit import Rows, fit_cascades
    from pipeline.route.train import Selection

    R, C, E, g, masks = synthetic_cascade(450)
    fit_cascades(Rows(R, C, E, None, g), masks, 0, ["strong", "cheap1", "cheap2"], ["parity"],
                 selection=Selection("crossfit", 6))


def _pool_report(_):
    import numpy as np

    from pipeline.report.pool_report import routable_headroom

    rng = np.random.default_rng(0)
    X, R = rng.normal(size=(240, 4)), (rng.random((240, 3)) < 0.5).astype(float)
    routable_headroom(X, R, np.array(["x", "y"] * 120, dtype=object), folds=12)


PHASES = {"kind selection": ("pipeline.route.select", _kind_selection),  # the phase's logger, a long run of it
          "operating points": ("pipeline.route.targets", _operating_points),
          "cascade search": ("pipeline.route.cascade_fit", _cascade_search),
          "pool report": ("pipeline.report.pool_report", _pool_report)}


@pytest.mark.parametrize("phase", list(PHASES))
def test_a_slow_phase_says_how_far_it_is_every_interval_not_more(phase, monkeypatch, synthetic_cascade):
    """Every phase that can take more than a few seconds logs `done/total, rate, ETA` on its `pipeline.*` logger
    (what Dagster's run log and the console show), and at most one line per PHASE_EVERY_S."""
    import logging
    import types

    from pipeline.core import progress
    from pipeline.core.progress import PHASE_EVERY_S

    clock = _SlowClock(PHASE_EVERY_S / 3)  # each step reads the clock once: a line every third step at most
    # the progress lines' clock only: other threads of the test session (servers, grading workers) reading
    # time.monotonic must not move it between a line's decision and its record here
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=clock))
    seen: list[tuple[float, str]] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append((clock.t, record.getMessage()))

    name, run = PHASES[phase]
    logger, handler = logging.getLogger(name), Keep(level=logging.INFO)
    logger.addHandler(handler)
    # setLevel, not the attribute: it clears the loggers' isEnabledFor cache, which an earlier test of the session
    # may have filled at WARNING (the lines were then dropped before any handler saw them)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        run(synthetic_cascade)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = [(t, m) for t, m in seen if "/" in m and ("ETA" in m or " in " in m)]
    assert len(lines) >= 2, seen
    assert all(b[0] - a[0] >= PHASE_EVERY_S for a, b in zip(lines, lines[1:])), lines
    assert any("ETA" in m for _, m in lines)


def test_the_kind_selection_says_how_far_it_is_after_every_kind_fitted_not_every_fold(monkeypatch):
    """A fold of a 12k-row matrix fits the head, kNN and the cluster router in tens of seconds: the line comes after
    each kind fitted (folds x kinds steps), so no fold is a silent stretch."""
    import logging
    import types

    import numpy as np

    from pipeline.core import progress
    from pipeline.core.progress import PHASE_EVERY_S
    from pipeline.route.select import crossfit_picks
    from pipeline.route.train import PromptRows, Selection

    clock = _SlowClock(PHASE_EVERY_S + 1)  # every step looks slower than the interval: each one may say so
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=clock))
    seen: list[str] = []
    logger = logging.getLogger("pipeline.route.select")
    monkeypatch.setattr(logger, "info", seen.append)
    rng = np.random.default_rng(0)
    X, R = rng.normal(size=(300, 4)).astype(np.float32), (rng.random((300, 3)) < 0.5).astype(float)
    split = np.arange(300) % 3
    crossfit_picks(["knn", "cluster"], None, ["a", "b", "c"], PromptRows(X, R), split == 0, split == 1,
                   Selection("crossfit", 3))
    assert [m.split(", ")[0] for m in seen] == \
        [f"cross-fitting 2 router kind(s) x 3 folds: {i}/6 fits" for i in range(1, 7)], seen


def _beat_lines(monkeypatch, every_s: float = 0.2):
    from pipeline.core import progress

    monkeypatch.setattr(progress._BEAT, "every_s", every_s)
    return progress


def test_a_silent_block_gets_a_heartbeat_line_naming_it_and_none_after_it_ends(monkeypatch):
    import time

    progress = _beat_lines(monkeypatch)
    lines: list[str] = []
    with progress.heartbeat("router head", lines.append):
        time.sleep(1.0)
    n = len(lines)
    time.sleep(0.5)
    assert n >= 2 and len(lines) == n  # the thread stops with the block
    assert lines[0].startswith("router head: still working, ")


def test_the_heartbeat_names_the_inner_step_and_its_running_phase(monkeypatch):
    import logging
    import time

    progress = _beat_lines(monkeypatch)
    outer: list[str] = []
    inner: list[str] = []
    log = logging.getLogger("pipeline.test_heartbeat")
    with progress.heartbeat("stage router", outer.append), progress.heartbeat("cascade search", inner.append):
        steps = progress.PhaseSteps(progress.phase_progress("cascade search", "fits", log), 4)
        steps()
        time.sleep(0.8)
    assert not outer  # the innermost block takes the line
    assert inner and inner[-1].startswith("stage router > cascade search: still working, ")
    assert inner[-1].endswith("; cascade search: 1/4 fits")  # the phase's count (rate and ETA after 1 s)


def test_lines_from_the_pipeline_loggers_keep_the_heartbeat_quiet(monkeypatch):
    import logging
    import time

    progress = _beat_lines(monkeypatch, every_s=0.5)
    lines: list[str] = []
    log = logging.getLogger("pipeline.test_heartbeat")
    old = log.level
    log.setLevel(logging.INFO)
    try:
        with progress.heartbeat("train", lines.append):
            for _ in range(25):
                log.info("a line")
                time.sleep(0.04)
            time.sleep(1.0)
    finally:
        log.setLevel(old)
    assert len(lines) in (1, 2)  # only after the lines stopped


@pytest.mark.slow
def test_each_run_stage_beats_on_the_console_while_it_runs(tmp_path, monkeypatch):
    """`router-lite run`'s stages run under a heartbeat named after the stage (and partition)."""
    from dagster import DagsterInstance

    from assets.definitions import build_definitions
    from cli.run import run_lineage

    _beat_lines(monkeypatch, every_s=0.3)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ROUTER_LITE_HOME", str(tmp_path / "home"))
    lines: list[str] = []
    with DagsterInstance.ephemeral() as instance:
        run_lineage(build_definitions(home=str(tmp_path / "home"), profile="smoke"), "smoke", upto="task_pool",
                    log=lines.append, instance=instance)
    beats = [m for m in lines if ": still working, " in m]
    assert beats and all(m.startswith(("[source tasks] partition ", "[task pool]")) for m in beats), lines
