"""Partition definitions: built from the profile by the definitions factory (assets/definitions.py `build_assets`),
so a profile with one source shows one `source_tasks` partition and its sources × repetitions `graded_calls`
partitions. There are no module-level defaults: the partitioned assets exist only as the factory builds them."""
from dagster import MultiPartitionsDefinition, StaticPartitionsDefinition

from pipeline.core.errors import RouterLiteError
from pipeline.profile import MAX_REPETITIONS


def source_partitions_for(sources) -> StaticPartitionsDefinition:
    return StaticPartitionsDefinition(list(sources))


def collection_partitions_for(sources, repetitions: int) -> MultiPartitionsDefinition:
    """source × repetition (keys `"<repetition>|<source>"`: Dagster orders the dimensions by name)."""
    if not 1 <= repetitions <= MAX_REPETITIONS:
        raise RouterLiteError(f"collection.repetitions must be 1..{MAX_REPETITIONS}, got {repetitions}")
    return MultiPartitionsDefinition({"source": source_partitions_for(sources),
                                      "repetition": StaticPartitionsDefinition([str(r) for r in range(repetitions)])})
