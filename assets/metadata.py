"""Metadata as people read it in the UI: floats rounded to 4 decimals, DataFrames as Dagster tables."""
from __future__ import annotations

import math
import re

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


def cell(value) -> str:
    """A Markdown table cell: `|` escaped (it would end the cell), line breaks as <br>."""
    return str(value).replace("|", "\\|").replace("\r\n", "\n").replace("\n", "<br>")


# the answer formats of a cascade plan as Plan.describe joins them: "integer: ... | other formats: ..."
_PLAN_PART = re.compile(r" \| (?=(?:[A-Za-z_][\w.-]*|other formats): )")


def plan_lines(plan: str) -> list[str]:
    """A cascade plan as table cells, one per answer format."""
    return [cell(part) for part in _PLAN_PART.split(str(plan))]


def md_table(df: pd.DataFrame, plans: tuple[str, ...] = ("plan",), **to_markdown) -> MetadataValue:
    """A DataFrame as a Markdown entry whose text cells cannot break the table (`cell`). A column in `plans` takes one
    table row per answer format, the row's other cells on its first line only: Dagster's Markdown drops `<br>`, so
    line breaks inside a cell would fuse the formats."""
    rows = []
    for rec in df.to_dict("records"):
        lines = {c: plan_lines(v) for c, v in rec.items() if c in plans and isinstance(v, str)}
        for i in range(max((len(v) for v in lines.values()), default=1)):
            rows.append({c: (lines[c][i] if i < len(lines[c]) else None) if c in lines
                         else (cell(v) if isinstance(v, str) else v) if i == 0 else None for c, v in rec.items()})
    shown = pd.DataFrame(rows, columns=df.columns, dtype=object)
    return MetadataValue.md(shown.to_markdown(index=False, **to_markdown))


_PLACEHOLDER = re.compile(r"(`[^`]*`)|([\w./-]*(?:<[^<>\s]+>[\w./-]*)+)")


def ui_text(text: str) -> str:
    """Text the UI renders as Markdown (asset descriptions): a word with `<placeholder>`s goes in backticks, so the
    UI shows it instead of taking it for an HTML tag."""
    def quoted(m) -> str:
        if m.group(1):
            return m.group(1)
        word = m.group(2).rstrip(".")
        return f"`{word}`" + m.group(2)[len(word):]

    return _PLACEHOLDER.sub(quoted, text)
