"""Partition definitions: built from the active profile by the definitions factory (assets/definitions.py), so a
profile with one source shows one `source_tasks` partition and its sources × repetitions `graded_calls` partitions.

The module-level defaults (every seed source × 3 repetitions) serve the asset modules loaded on their own, e.g. a
test materialising any source's tasks."""
from dagster import MultiPartitionsDefinition, StaticPartitionsDefinition

from pipeline.core.errors import RouterLiteError
from pipeline.profile import MAX_REPETITIONS
from pipeline.tasks.sources import SOURCES


def source_partitions_for(sources) -> StaticPartitionsDefinition:
    return StaticPartitionsDefinition(list(sources))


def collection_partitions_for(sources, repetitions: int) -> MultiPartitionsDefinition:
    """source × repetition (keys `"<repetition>|<source>"`: Dagster orders the dimensions by name)."""
    if not 1 <= repetitions <= MAX_REPETITIONS:
        raise RouterLiteError(f"collection.repetitions must be 1..{MAX_REPETITIONS}, got {repetitions}")
    return MultiPartitionsDefinition({"source": source_partitions_for(sources),
                                      "repetition": StaticPartitionsDefinition([str(r) for r in range(repetitions)])})


source_partitions = source_partitions_for(SOURCES)
collection_partitions = collection_partitions_for(SOURCES, MAX_REPETITIONS)
