"""cli/lineage.py: the one helper through which bench/, scripts/ and the CLI read, write and run the lineage."""
from __future__ import annotations

import pandas as pd
import pytest

from cli import lineage
from pipeline.core.errors import RouterLiteError


@pytest.fixture(scope="module")
def defs(tmp_path_factory):
    return lineage.definitions("smoke", str(tmp_path_factory.mktemp("home")))


def test_the_refresh_runs_from_the_rewards_on_with_the_pool_report(defs):
    """`start`: the refresh bench's run takes the assets from the rewards on (read upstream as materialised), the
    pool report and both fits included (and the served decisions it reads whether a cascade pays off), nothing of
    the collection; the explored traffic's rows, which the head learns from, are read again from the rewards on."""
    from cli.run import stages_of

    keys = [k for _, ks, _ in stages_of(defs, ["registered_head", "registered_cascade", "pool_report"],
                                        start=["reward_matrix", "agent_answers"]) for k in ks]
    assert set(keys) == {"reward_matrix", "agent_answers", "router_head", "cascade_router", "registered_head",
                         "registered_cascade", "served_decisions", "pool_report", "traffic_rewards", "traffic_tasks"}
    assert keys.index("cascade_router") < keys.index("pool_report")


def test_a_partition_stored_through_the_io_manager_loads_back(defs):
    pk = lineage.partitions(defs, "graded_calls")[0]
    with pytest.raises(RouterLiteError, match="graded_calls"):
        lineage.load("graded_calls", partition=pk, defs=defs)
    assert lineage.load("graded_calls", partition=pk, defs=defs, default=None) is None
    calls = pd.DataFrame({"task_id": ["mmlu_pro/a", "mmlu_pro/b"], "correct": [True, False]})
    lineage.store(defs, "graded_calls", calls, pk)
    assert lineage.load("graded_calls", partition=pk, defs=defs).equals(calls)
