"""README.md is the generator's output (scripts/readme.py: docs/README.template.md, the value section from the
committed router_value.json), and so is docs/training.md's TrainConfig table: no hand-typed figure can drift. The
README stays short and opens with the two commands a fresh machine runs."""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
try:
    import readme
finally:
    sys.path.pop(0)


def test_readme_and_generated_blocks_are_the_generators_output(capsys):
    assert readme.main(["--check"]) == 0, capsys.readouterr().err


def test_readme_is_at_most_130_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 130


def test_readme_opens_with_the_two_commands_and_make_has_them():
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S)
    assert text.startswith("# BenchGen Router Lite\n\n```bash\n") and first_block
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make run", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run", "test", "docs", "docs-check"):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target


def test_a_changed_readme_or_block_is_reported_with_a_diff(tmp_path):
    expected = readme.outputs()
    for rel, text in expected.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert readme.differences(expected, tmp_path) == ""
    edited = expected[readme.README].replace("**Pool verdict:", "**Pool verdict (edited by hand):", 1)
    assert edited != expected[readme.README]  # a generated line the edit changes, whatever the figures
    (tmp_path / readme.README).write_text(edited)
    table = expected[readme.TRAINING].replace("| `generations` | 60 |", "| `generations` | 61 |")
    (tmp_path / readme.TRAINING).write_text(table)
    diff = readme.differences(expected, tmp_path)
    assert "-" + "| `generations` | 61 |" in diff and "+| `generations` | 60 |" in diff
    assert "edited by hand" in diff and "README.md (make docs)" in diff


def test_the_value_section_is_the_committed_router_value():
    import json

    rv = json.loads((ROOT / readme.COPY).read_text())
    text = (ROOT / "README.md").read_text()
    assert readme.render_value(rv) in text + "\n"
    assert f"{rv['routers'][rv['best_router']]['aiq_test']:.4f}" in text


def test_the_readme_stars_the_router_served_only():
    """One ★, the router served (`served`, written by the promotion), even where validation prefers another kind;
    the prompt kinds' choice is '(chosen)'; a copy written before the promotion named it stars no row."""
    import json

    rv = json.loads((ROOT / readme.COPY).read_text())
    assert "cascade:combined" in rv["routers"] and rv["best_router"] != "cascade:combined"
    served = {"router": "cascade:combined", "name": "cascade-x", "label": "combined (cascade + prompt router)",
              "kind": "cascade", "target": "quality>=0.98", "promoted_by": "gate",
              "held_out": {"quality_ratio": 0.989, "cost_ratio": 0.64}}
    text = readme.render_value({**rv, "served": served})
    starred = [x.split("|")[1].strip() for x in text.splitlines() if x.startswith("| ") and "★" in x]
    assert starred == ["combined (cascade + prompt router) ★"], starred
    assert ("★ Served (`router-lite serve`): **combined (cascade + prompt router)** `cascade-x`, promoted by "
            "gate") in text
    assert "★ = the router served (cascade-x, promoted by gate)" in text
    before = readme.render_value({**rv, "served": None})
    assert not [x for x in before.splitlines() if x.startswith("| ") and "★" in x]
    assert "no ★ yet: the `promotion` asset names the router served" in before
