"""The fast rows of the attack suite (bench/attack.py): each attack gets its
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


def test_every_attack_of_the_first_suite_has_a_fast_row():
    # bench/attack.py's items 1..13 and "n": its first attack suite
    assert {str(i) for i in range(1, 14)} | {"n"} <= {r.item for r in FAST}


def test_every_serving_attack_has_a_fast_row():
    # bench/attack.py's items 25.2 deadlines and cancellation, 25.3 bursts, 25.4 the LOW rows
    assert {"25.2", "25.3", "25.4"} <= {r.item for r in FAST}
