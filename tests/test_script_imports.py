"""bench/, scripts/ and data/build/ are not imported by the other tests: every `from pipeline|assets|resources ...
import name` in the tree must still name something that exists (a layout move once left one pointing at the wrong
module)."""
from __future__ import annotations

import ast
import importlib
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _imports():
    files = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for f in files:
        for node in ast.walk(ast.parse((ROOT / f).read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] in ("pipeline", "assets", "resources"):
                yield f, node.lineno, node.module, [a.name for a in node.names]


def test_every_project_import_in_the_tree_resolves():
    found, missing = 0, []
    for f, line, module, names in _imports():
        mod = importlib.import_module(module)
        for name in names:
            found += 1
            if not hasattr(mod, name):
                try:
                    importlib.import_module(f"{module}.{name}")
                except ImportError:
                    missing.append(f"{f}:{line}: {module} has no {name}")
    assert found > 300 and not missing, missing
