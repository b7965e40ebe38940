"""What the UI renders as Markdown: table cells that cannot split the table, a cascade plan one line per answer
format, asset descriptions whose `<placeholders>` stay visible."""
import re

import pandas as pd

from assets.metadata import md_table, plan_lines, ui_text

PLAN = ("integer: ask a + b; accept if 2 of {a, b} agree; else c | math_expression: else a | other formats: ask a; "
        "else b")


def test_a_plan_is_one_table_row_per_answer_format():
    assert plan_lines(PLAN) == ["integer: ask a + b; accept if 2 of {a, b} agree; else c", "math_expression: else a",
                                "other formats: ask a; else b"]
    text = md_table(pd.DataFrame([{"target": "parity", "plan": PLAN, "note": "x | y", "quality": 0.98765}])).value
    header, _, *rows = text.splitlines()
    assert "<br>" not in text and len(rows) == 3  # no HTML line break: Dagster's Markdown drops it
    for row in rows:
        assert len(re.findall(r"(?<!\\)\|", row)) == header.count("|") == 5  # 4 cells: the plan is not split
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    assert [c[1] for c in cells] == plan_lines(PLAN)
    assert cells[0][0] == "parity" and cells[0][2] == "x \\| y" and cells[0][3].startswith("0.98")
    assert all(c[0] == c[2] == c[3] == "" for c in cells[1:])  # the row's other cells once


def test_descriptions_keep_their_placeholders_visible():
    assert ui_text("name <kind>-<backbone>-<hash>, manifest") == "name `<kind>-<backbone>-<hash>`, manifest"
    assert ui_text("to <agent>.jsonl.quarantine.") == "to `<agent>.jsonl.quarantine`."
    assert ui_text("already `<x>` quoted; rate < 5 %") == "already `<x>` quoted; rate < 5 %"


def test_every_asset_description_renders_its_placeholders():
    from assets.definitions import build_definitions

    for spec in build_definitions(profile="demo").resolve_all_asset_specs():
        bare = re.sub(r"`[^`]*`", "", spec.description or "")
        assert not re.search(r"<[^<>\s]+>", bare), (spec.key, spec.description)
