"""How many tasks a new agent is asked per source when it is measured on a sample (`collection.new_agent_sample`):
one rule for the collection that draws them (`sampling.choose_sample`) and the forecast that counts them before any
call (`forecast`); it has no imports so both can use it."""
from __future__ import annotations

MIN_PER_SOURCE = 2  # a source's sample is never smaller (an estimate per source needs more than one answer)


def sample_size(n_tasks: int, fraction: float) -> int:
    """round(fraction x n_tasks), at least MIN_PER_SOURCE, at most all."""
    return min(int(n_tasks), max(MIN_PER_SOURCE, int(round(fraction * n_tasks))))
