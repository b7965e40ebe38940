"""The README's value section is the generator's output from the committed router_value.json (no hand-typed
figure can drift)."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_value_section_is_generated():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import readme_value
    finally:
        sys.path.pop(0)
    assert readme_value.main(["--check"]) == 0
