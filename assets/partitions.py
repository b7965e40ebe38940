"""Partition definitions: built from the profile by the definitions factory (assets/definitions.py `build_assets`),
so a profile with one source shows one `source_tasks` partition and its sources × repetitions `graded_calls`
partitions. There are no module-level defaults: the partitioned assets exist only as the factory builds them."""
from dagster import DailyPartitionsDefinition, MultiPartitionsDefinition, StaticPartitionsDefinition

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


TRAFFIC_START = "2026-01-01"  # the first day a `traffic` partition can have (the traffic log began with this version)


def traffic_partitions(start: str = TRAFFIC_START) -> DailyPartitionsDefinition:
    """One `traffic` partition per UTC day, today's (the open day) included: the sensor materialises it as it grows."""
    return DailyPartitionsDefinition(start_date=start, end_offset=1, timezone="UTC")
