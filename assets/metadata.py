"""Metadata as people read it in the UI: floats rounded to 4 decimals, DataFrames as Dagster tables."""
from __future__ import annotations

import math

import pandas as pd
from dagster import FloatMetadataValue, MetadataValue, TableColumn, TableRecord, TableSchema

DIGITS = 4


def _round(v):
    return round(v, DIGITS) if isinstance(v, float) and math.isfinite(v) else v


def table(df: pd.DataFrame) -> MetadataValue:
    """A DataFrame as a table entry (rendered inline in the asset page, unlike Markdown), floats rounded."""
    kinds = {"f": "float", "i": "int", "u": "int", "b": "bool"}
    schema = TableSchema(columns=[TableColumn(str(c), kinds.get(df[c].dtype.kind, "string")) for c in df.columns])
    records = [TableRecord({str(k): _round(v.item() if hasattr(v, "item") else v) for k, v in row.items()})
               for row in df.to_dict("records")]
    return MetadataValue.table(records, schema=schema)


def rounded(metadata: dict) -> dict:
    """The same metadata with every float (plain or MetadataValue.float) rounded to 4 decimals."""
    out = {}
    for k, v in metadata.items():
        if isinstance(v, FloatMetadataValue) and v.value is not None:
            v = MetadataValue.float(_round(v.value))
        out[k] = _round(v)
    return out
