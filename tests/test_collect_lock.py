"""One collection at a time per call log: two collections of one partition on one home make no
call twice; a second collector fails at once naming the partition and the holder's pid, or waits when asked."""
import collections
import json
import os
import threading
import time

import pytest

from assets.definitions import build_definitions
from assets.ops import COLLECTION_JOB
from cli.run import user_error
from pipeline.collect.call_log_lock import collection_lock, wait_setting
from pipeline.core.errors import RouterLiteError

pytestmark = pytest.mark.slow  # the smoke_home lineage (make test-fast leaves it out)

PARTITION = "0|mmlu_pro"


def log_rows(home):
    """call_key -> number of rows in the durable call log of repetition 0 (every line is one call made)."""
    counts = collections.Counter()
    for f in (home / "calls").glob("*/mmlu_pro/rep0/*.jsonl"):
        for line in f.read_text().splitlines():
            counts[json.loads(line)["call_key"]] += 1
    return counts


def test_lock_fails_fast_names_partition_and_pid_or_waits(tmp_path):
    with collection_lock(tmp_path / "log", "mmlu_pro repetition 0"):
        with pytest.raises(RouterLiteError,
                           match=rf"collection for mmlu_pro repetition 0 is running \(pid {os.getpid()}\)"), \
                collection_lock(tmp_path / "log", "mmlu_pro repetition 0"):
            pass
        t0 = time.monotonic()
        with pytest.raises(RouterLiteError, match=r"running \(pid \d+\) after waiting 0.5 s"), \
                collection_lock(tmp_path / "log", "mmlu_pro repetition 0", wait=0.5):
            pass
        assert time.monotonic() - t0 >= 0.5
    order = []
    held = threading.Event()

    def first():
        with collection_lock(tmp_path / "log", "p"):
            held.set()
            time.sleep(0.6)
            order.append("first done")

    t = threading.Thread(target=first)
    t.start()
    held.wait(5)
    with collection_lock(tmp_path / "log", "p", wait=None):  # waits for `first`, then holds the lock itself
        order.append("second in")
    t.join()
    assert order == ["first done", "second in"]
    assert wait_setting(None) == 0.0 and wait_setting("true") is None and wait_setting("30") == 30.0
    with pytest.raises(RouterLiteError, match="seconds"):
        wait_setting("soon")


def test_two_concurrent_collections_make_no_call_twice(smoke_home_copy, capsys):
    """Two collection runs of one partition at once on one home (threads, each its own Dagster run), the second
    asked to wait: every call is made exactly once. Without the lock both read the same empty log and call twice."""
    home = smoke_home_copy(drop=("calls",))
    defs = build_definitions(home=str(home), profile="smoke")
    job = defs.resolve_job_def(COLLECTION_JOB)
    results, start = [None, None], threading.Barrier(2)

    def collect(i):
        start.wait()
        results[i] = job.execute_in_process(partition_key=PARTITION, raise_on_error=False, run_config={
            "ops": {"graded_calls": {"config": {"wait_for_collection": "true"}}}})

    threads = [threading.Thread(target=collect, args=(i,)) for i in range(2)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert all(r is not None and r.success for r in results), [user_error(r) for r in results if r]
    rows = log_rows(home)
    twice = sum(n - 1 for n in rows.values() if n > 1)
    new = sorted(r.asset_materializations_for_node("graded_calls")[0].metadata["new_calls"].value for r in results)
    with capsys.disabled():
        print(f"\n[two collectors] {sum(rows.values())} calls made for {len(rows)} call keys; made twice: {twice}; "
              f"new calls per run: {new}; {time.time() - t0:.1f}s")
    assert twice == 0
    assert new == [0, len(rows)] and len(rows) == 300 * 5


def test_second_collector_fails_fast_with_the_same_message_in_the_run(smoke_home_copy):
    """While a collection holds the partition's call log, another run fails at once (no call made); the Dagster
    run's step failure carries the message `router-lite run` prints."""
    home = smoke_home_copy(drop=("calls",))
    defs = build_definitions(home=str(home), profile="smoke")
    log_dir = home / "calls" / "replay" / "mmlu_pro" / "rep0"
    with collection_lock(log_dir, "held by this test"):
        res = defs.resolve_job_def(COLLECTION_JOB).execute_in_process(partition_key=PARTITION, raise_on_error=False)
    assert not res.success
    msg = user_error(res)
    assert msg.startswith(f"collection for mmlu_pro repetition 0 is running (pid {os.getpid()})"), msg
    failure = next(e for e in res.all_events if e.event_type_value == "STEP_FAILURE")
    assert msg in failure.step_failure_data.error.to_string()  # what the UI shows for the step
    assert log_rows(home) == {}
