"""Imports in pipeline/ run one way (docs/architecture.md, "Layout"): down the stage order of pipeline/STAGES, core <
tasks < collect < embed < route < report, serve (report and serve, side by side, do not import each other), with the
modules directly in pipeline/ (profile.py,
standin.py) above every stage; no import circle joins files of different stages, and none joins two modules of
pipeline/ at all (`circles`). No function of pipeline/ assets/ cli/ resources/ is longer than
MAX_FUNCTION_LINES.

Every `import` counts, module level or inside a function: a lazy import is still a dependency."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def stage_order(root: Path) -> dict[str, int]:
    """pipeline/STAGES: one stage a line, lowest first; stages on one line are peers."""
    lines = [ln.split("#")[0].split() for ln in (root / "pipeline" / "STAGES").read_text().splitlines()]
    return {name: level for level, names in enumerate(x for x in lines if x) for name in names}


STAGES = stage_order(ROOT)
TOP = max(STAGES.values()) + 1  # pipeline/<module>.py: above every stage


def _module(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """The pipeline modules an import statement names (`from pipeline.route import fit` names pipeline.route.fit)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolve against this module's package
        pkg = module.split(".") if is_package else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([base] if base else []))
    return [base] + [f"{base}.{a.name}" for a in node.names]


def _stage(module: str) -> str | None:
    """The stage of a pipeline module: its sub-package, "top" for pipeline/<module>.py, None for `pipeline` itself."""
    parts = module.split(".")
    if len(parts) < 2:
        return None
    return parts[1] if len(parts) > 2 or parts[1] in STAGES else "top"


def _rank(stage: str) -> int:
    return TOP if stage == "top" else STAGES[stage]


def graph(root: Path, packages: tuple[str, ...] = ("pipeline",)) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the modules of `packages` it imports, the modules of those packages under root); a target that
    names a function or class (`from pipeline.x.y import f`) is dropped, the module it came from kept."""
    files = {_module(f, root): f for p in packages for f in sorted((root / p).rglob("*.py"))}
    edges: dict[str, set[str]] = {m: set() for m in files}
    for module, f in files.items():
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            for target in _targets(node, module, f.name == "__init__.py"):
                if target in files and target != module:
                    edges[module].add(target)
    return edges, sorted(files)


def violations(root: Path) -> list[str]:
    edges, modules = graph(root)
    bad = [f"{m}: pipeline/{m.split('.')[1]}/ is no known stage; add it to the order (STAGES, docs/architecture.md)"
           for m in modules if _stage(m) not in (None, "top", *STAGES)]
    if bad:
        return bad
    for src in modules:
        s = _stage(src)
        for dst in sorted(edges[src]):
            d = _stage(dst)
            if s is None or d is None or d == s:
                continue
            if _rank(d) > _rank(s) or (_rank(d) == _rank(s) and d != s):
                bad.append(f"{src} imports {dst} ({s} -> {d}: against the stage order)")
    # circles: strongly connected components spanning more than one stage
    bad += ["import circle across stages: " + ", ".join(comp) for comp in components(edges, modules)
            if len({_stage(m) for m in comp}) > 1]
    return bad


def components(edges: dict, modules) -> list[list[str]]:
    """The strongly connected components (Tarjan) of the import graph `edges` over `modules`, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            found.append(sorted(comp))

    for v in modules:
        if v not in index:
            visit(v)
    return found


def circles(root: Path, packages: tuple[str, ...] = ("pipeline",)) -> list[list[str]]:
    """The import circles between modules of `packages` under root (strongly connected components of more than one
    module of `graph`: every import counts, lazy ones too), each sorted."""
    edges, modules = graph(root, packages)
    return [comp for comp in components(edges, modules) if len(comp) > 1]


def test_no_import_circle_between_modules_of_pipeline():
    assert circles(ROOT) == []


def test_no_import_circle_anywhere_in_the_project():
    """Beyond pipeline/: the Dagster wiring, the resources and the command line (a subcommand module importing
    cli.main, which imports it back, was one)."""
    assert circles(ROOT, ("pipeline", "assets", "resources", "cli")) == []


def test_the_circle_check_finds_one_inside_a_stage_through_a_lazy_import(tmp_path):
    root = _tree(tmp_path, {"pipeline/route/routers.py": "def builtins():\n    import pipeline.route.head\n",
                            "pipeline/route/head.py": "from pipeline.route.routers import builtins\n",
                            "pipeline/route/knn.py": "from pipeline.route import routers\n"})
    assert circles(root) == [["pipeline.route.head", "pipeline.route.routers"]]


MAX_FUNCTION_LINES = 60
LONG_FUNCTIONS: set[str] = set()  # none left; a name here needs a reason beside it


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """`path:name (lines)` of every function (methods and nested ones too) of pipeline/ assets/ cli/ resources/
    longer than `limit` lines, decorators and docstring included."""
    out = []
    for pkg in ("pipeline", "assets", "cli", "resources"):
        for f in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                    if node.end_lineno - first + 1 > limit:
                        out.append(f"{f.relative_to(root).as_posix()}:{node.name} ({node.end_lineno - first + 1})")
    return out


def test_no_function_is_longer_than_a_reader_can_hold():
    long = [f for f in long_functions(ROOT) if f.split(" (")[0] not in LONG_FUNCTIONS]
    assert long == [], f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_the_length_check_counts_every_function(tmp_path):
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    root = _tree(tmp_path, {"assets/a.py": f"@decorator\ndef long():\n{body}\n\ndef short():\n    pass\n",
                            "cli/b.py": f"class C:\n    def method(self):\n{body.replace('    ', '        ')}"})
    assert long_functions(root) == ["assets/a.py:long (62)", "cli/b.py:method (61)"]


MAX_PARAMETERS = 8
# Dagster names an asset's inputs and resources as its parameters: those may be many
ASSET_DECORATORS = {"asset", "multi_asset", "asset_check", "multi_asset_check", "graph_asset", "graph_multi_asset",
                    "op", "sensor", "schedule"}


def _decorator_name(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def wide_functions(root: Path, limit: int = MAX_PARAMETERS) -> list[str]:
    """`path:name (parameters)` of every function of pipeline/ assets/ cli/ resources/ with more than `limit`
    parameters (positional and keyword-only; self, cls, *args and **kwargs not counted), asset functions excepted:
    the data that travels together travels as one bundle."""
    out = []
    for pkg in ("pipeline", "assets", "cli", "resources"):
        for f in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                a = node.args
                n = sum(p.arg not in ("self", "cls") for p in [*a.posonlyargs, *a.args, *a.kwonlyargs])
                if n > limit and not {_decorator_name(d) for d in node.decorator_list} & ASSET_DECORATORS:
                    out.append(f"{f.relative_to(root).as_posix()}:{node.name} ({n})")
    return out


# each needs a reason beside it
WIDE_FUNCTIONS: set[str] = set()  # none left; a name here needs a reason beside it


def test_no_function_takes_more_parameters_than_a_reader_can_hold():
    wide = [f for f in wide_functions(ROOT) if f.split(" (")[0] not in WIDE_FUNCTIONS]
    assert wide == [], f"functions over {MAX_PARAMETERS} parameters: {wide}"


def test_the_parameter_check_counts_every_kind_and_spares_assets(tmp_path):
    nine = ", ".join(f"a{i}" for i in range(8))
    root = _tree(tmp_path, {"pipeline/a.py": f"def wide({nine}, *, k):\n    pass\n\n\n"
                                             f"def ok(self, {nine}, *rest, **kw):\n    pass\n",
                            "cli/b.py": f"class C:\n    def __init__(self, {nine}, z=1):\n        pass\n",
                            "assets/c.py": f"@asset(group_name='x')\ndef big({nine}, r):\n    pass\n\n\n"
                                           f"@other\ndef helper({nine}, r):\n    pass\n"})
    assert wide_functions(root) == ["pipeline/a.py:wide (9)", "assets/c.py:helper (9)", "cli/b.py:__init__ (9)"]


def test_pipeline_imports_run_down_the_stages_without_cross_stage_circles():
    edges, modules = graph(ROOT)
    assert len(modules) > 50 and sum(map(len, edges.values())) > 100  # the walk sees the tree
    assert violations(ROOT) == []


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in {"pipeline/__init__.py": "", **files}.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        init = p.parent / "__init__.py"
        if not init.exists():
            init.write_text("")
    return tmp_path


@pytest.mark.parametrize("files, found", [
    ({"pipeline/core/a.py": "def f():\n    from pipeline.route.b import g\n", "pipeline/route/b.py": ""},
     "pipeline.core.a imports pipeline.route.b (core -> route"),
    ({"pipeline/report/a.py": "from pipeline.serve import b\n", "pipeline/serve/b.py": ""},
     "pipeline.report.a imports pipeline.serve.b (report -> serve"),
    ({"pipeline/collect/a.py": "from pipeline import profile\n", "pipeline/profile.py": ""},
     "pipeline.collect.a imports pipeline.profile (collect -> top"),
    ({"pipeline/route/a.py": "from ..report import b\n", "pipeline/report/b.py": ""},
     "pipeline.route.a imports pipeline.report.b"),
    ({"pipeline/route/a.py": "import pipeline.report.b\n",
      "pipeline/report/b.py": "from pipeline.route.a import x\n"}, "import circle across stages: pipeline.report.b, "
                                                                  "pipeline.route.a"),
    ({"pipeline/extra/a.py": ""}, "pipeline/extra/ is no known stage"),
])
def test_the_check_finds_an_upward_import_and_a_cross_stage_circle(tmp_path, files, found):
    bad = violations(_tree(tmp_path, files))
    assert any(found in b for b in bad), bad


def test_the_check_allows_downward_imports_and_a_circle_inside_one_stage(tmp_path):
    root = _tree(tmp_path, {
        "pipeline/core/a.py": "", "pipeline/route/routers.py": "def builtins():\n    import pipeline.route.head\n",
        "pipeline/route/head.py": "from pipeline.route.routers import builtins\nfrom pipeline.core import a\n",
        "pipeline/report/r.py": "from pipeline.route.head import builtins\n",
        "pipeline/profile.py": "from pipeline.route import head\n"})
    assert violations(root) == []


PACKAGES = {"pipeline": 0, "resources": 1, "assets": 2, "cli": 3}  # the top-level packages, bottom to top


def package_violations(root: Path) -> list[str]:
    """Imports from a lower top-level package to a higher one (pipeline < resources < assets < cli)."""
    bad = []
    for pkg, level in PACKAGES.items():
        for path in sorted((root / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                for name in names:
                    top = name.split(".")[0]
                    if PACKAGES.get(top, -1) > level:
                        bad.append(f"{path.relative_to(root)} imports {name} ({pkg} -> {top})")
    return bad


def test_top_level_packages_import_downwards_only():
    assert package_violations(ROOT) == []


def test_the_package_check_finds_an_upward_import(tmp_path):
    root = _tree(tmp_path, {"assets/a.py": "def f():\n    from cli.run import run_lineage\n", "cli/run.py": "",
                            "pipeline/x.py": "", "resources/y.py": ""})
    assert package_violations(root) == ["assets/a.py imports cli.run (assets -> cli)"]


def layout_entries(root: Path) -> dict[str, str]:
    """docs/architecture.md's layout block ("Layout: `pipeline/` by stage") as {"route/": its text, ...}: an entry
    starts at a line indented 0-2 spaces with its name, continuation lines are indented further."""
    text = (root / "docs" / "architecture.md").read_text()
    start = text.index("```", text.index("## Layout: `pipeline/` by stage")) + 3
    entries, current = {}, None
    for line in text[start:text.index("```", start)].splitlines():
        m = re.match(r"^ {0,2}([\w.]+/?)(\s|$)", line)
        if m and not line.startswith("   "):
            current = m.group(1)
            entries[current] = line[m.end():]
        elif current:
            entries[current] += " " + line.strip()
    return entries


def test_architecture_layout_names_every_module():
    """Every module of every package (pipeline's stages, cli, assets, resources) is named in its package's entry."""
    entries = layout_entries(ROOT)
    packages = [p for p in sorted((ROOT / "pipeline").iterdir()) if (p / "__init__.py").exists()]
    packages += [ROOT / "cli", ROOT / "assets", ROOT / "resources"]
    missing = [f"{pkg.relative_to(ROOT)}/{f.name}" for pkg in packages for f in sorted(pkg.glob("*.py"))
               if f.stem != "__init__" and not re.search(rf"\b{f.stem}\b", entries.get(pkg.name + "/", ""))]
    assert not missing, f"docs/architecture.md's layout does not name: {missing}"


def test_bench_and_scripts_read_the_lineage_through_dagster():
    """bench/, scripts/ and the CLI read materialised assets with cli/lineage.py (Dagster's IO managers), never by a
    file path: a path read times or reports a copy of the lineage that the lineage itself may no longer produce."""
    hand_reads = [f"{f.relative_to(ROOT)}:{n}" for d in ("bench", "scripts", "cli")
                  for f in sorted((ROOT / d).rglob("*.py"))
                  for n, line in enumerate(f.read_text().splitlines(), 1)
                  if re.search(r"\basset_path\(|[\"']assets[\"']\s*/|/\s*[\"']assets[\"']", line)]
    assert not hand_reads, hand_reads


def test_bench_takes_only_the_lineage_helper_from_the_cli():
    """bench/ reaches the CLI's code only through cli/lineage.py (the lineage's runs and IO managers) or drives the
    command line itself (cli.main, as a user would): a bench that imports pipeline logic from cli/ times or measures
    the CLI's copy, not the lineage."""
    taken = []
    for f in sorted((ROOT / "bench").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if isinstance(node, ast.ImportFrom) and node.module == "cli":
                names = [f"cli.{a.name}" for a in node.names]
            taken += [f"{f.relative_to(ROOT)}: {n}" for n in names
                      if n.startswith("cli") and n not in ("cli.lineage", "cli.main")]
    assert not taken, taken


TRACKER = re.compile(r"\b[Ii]ssues? #?\d+\b")


def test_code_and_tests_cite_no_tracker_numbers():
    """A reader of the code or of a test meets what it does and why, not a tracker number to look up elsewhere."""
    cited = [f"{f.relative_to(ROOT)}:{i}" for d in (*PACKAGES, "tests") for f in sorted((ROOT / d).rglob("*.py"))
             for i, line in enumerate(f.read_text().splitlines(), 1) if TRACKER.search(line)]
    assert cited == []
