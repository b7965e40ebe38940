"""What the UI renders as Markdown: table cells that cannot split the table, a cascade plan one line per answer
format, asset descriptions whose `<placeholders>` stay visible."""
import re

import pandas as pd

from assets.metadata import md_table, plan_cell, ui_text

PLAN = ("integer: ask a + b; accept if 2 of {a, b} agree; else c | math_expression: else a | other formats: ask a; "
        "else b")


def test_a_plan_is_one_line_per_answer_format_in_one_cell():
    assert plan_cell(PLAN).split("<br>") == ["integer: ask a + b; accept if 2 of {a, b} agree; else c",
                                             "math_expression: else a", "other formats: ask a; else b"]
    text = md_table(pd.DataFrame([{"target": "parity", "plan": PLAN, "note": "x | y"}])).value
    header, _, row = text.splitlines()
    assert len(re.findall(r"(?<!\\)\|", row)) == header.count("|") == 4  # 3 cells: the plan is not split
    assert "other formats: ask a; else b" in row and "x \\| y" in row


def test_descriptions_keep_their_placeholders_visible():
    assert ui_text("name <kind>-<backbone>-<hash>, manifest") == "name `<kind>-<backbone>-<hash>`, manifest"
    assert ui_text("to <agent>.jsonl.quarantine.") == "to `<agent>.jsonl.quarantine`."
    assert ui_text("already `<x>` quoted; rate < 5 %") == "already `<x>` quoted; rate < 5 %"


def test_every_asset_description_renders_its_placeholders():
    from assets.definitions import build_definitions

    for spec in build_definitions(profile="demo").resolve_all_asset_specs():
        bare = re.sub(r"`[^`]*`", "", spec.description or "")
        assert not re.search(r"<[^<>\s]+>", bare), (spec.key, spec.description)
