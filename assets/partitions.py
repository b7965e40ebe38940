"""Partition definitions shared by the asset modules."""
from dagster import StaticPartitionsDefinition

from pipeline.tasks import SOURCES

# the 8 seed sources, always: a profile uses a subset; the others can still be materialised and inspected
source_partitions = StaticPartitionsDefinition(list(SOURCES))
