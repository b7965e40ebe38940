"""The fast rows of the attack suite (bench/attack.py; issues 20 and 25, the residues of issue 12): each attack gets its
documented answer. `python bench/attack.py` runs every row (the slow ones too) and prints the held/failed table."""
import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("attack", Path(__file__).resolve().parents[1] / "bench" / "attack.py")
attack = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("attack", attack)  # its dataclasses look their module up
_spec.loader.exec_module(attack)

FAST = [r for r in attack.ROWS if r.fast]


@pytest.mark.parametrize("row", FAST, ids=[f"{r.number}-item{r.item}-{r.fn.__name__}" for r in FAST])
def test_attack_row_holds(row, tmp_path):
    row.fn(tmp_path)


def test_every_issue_20_item_has_a_fast_row():
    assert {str(i) for i in range(1, 14)} | {"n"} <= {r.item for r in FAST}


def test_every_issue_25_item_of_serving_has_a_fast_row():
    # 25.2 deadlines and cancellation, 25.3 bursts, 25.4 the LOW rows (bench/attack.py, "issue 25")
    assert {"25.2", "25.3", "25.4"} <= {r.item for r in FAST}
