"""The map in docs/architecture.md is the code's: every import of every project module (function-level
imports included) is one its package's row allows, every module has a row, there is no import cycle,
the library never imports Prefect, and no library module grows past the limit without saying why.

Reads source with `ast` only: nothing of the project is imported, so this runs in either environment.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGES = ("eagleflow", "tasks", "flows", "infra", "deployments", "cli")
LONG_LIMIT = 500  # lines; a longer module says "Long because" in its docstring's first lines
MAP = ROOT / "docs" / "architecture.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def resolve(name: str) -> str | None:
    """The project module an import name lands in (a name inside a module counts as the module)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(mod: str) -> set[str]:
    """Project modules `mod` imports, anywhere in it."""
    path = MODULES[mod]
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            # `from eagleflow import jobs` imports the module eagleflow.hosts.jobs, not eagleflow's __init__ alone
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for n in names:
            r = resolve(n)
            if r is not None and r != mod:
                found.add(r)
    return found


def read_map() -> list[tuple[list[str], list[str]]]:
    """(packages of the row, what they may import) for each row of the map's table."""
    rows = []
    for line in MAP.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        owners = re.findall(r"`([\w.]+)`", cells[0])
        allowed = [] if cells[2] == "nothing" else re.findall(r"`([\w.]+)`", cells[2])
        if cells[2] == "every row above":
            allowed = [o for r in rows for o in r[0]]
        rows.append((owners, allowed))
    return rows


ROWS = read_map()


def row_of(mod: str) -> tuple[str, list[str]]:
    """(the most specific owner on the map that `mod` falls under, what it may import)."""
    best: tuple[str, list[str]] | None = None
    for owners, allowed in ROWS:
        for owner in owners:
            exact_only = owner == "eagleflow"  # the root row is the package's __init__ only
            if mod == owner or (not exact_only and mod.startswith(owner + ".")):
                if best is None or len(owner) > len(best[0]):
                    best = (owner, allowed)
    if best is None:
        raise AssertionError(f"{mod} has no row in {MAP.relative_to(ROOT)}: add its package to the map")
    return best


def permitted(target: str, owner: str, allowed: list[str]) -> bool:
    if target == owner or target.startswith(owner + "."):
        return True  # its own package
    return any(target == a or (a != "eagleflow" and target.startswith(a + ".")) for a in allowed)


def test_the_map_has_rows():
    assert len(ROWS) >= 10 and any("eagleflow.stages" in o for o, _ in ROWS)


@pytest.mark.parametrize("mod", sorted(MODULES))
def test_every_import_is_on_the_map(mod):
    owner, allowed = row_of(mod)
    bad = sorted(t for t in imports_of(mod) if not permitted(t, owner, allowed))
    assert not bad, f"{mod} (row {owner}) imports {bad}; the map allows {allowed or 'nothing'}"


def test_a_stage_imports_no_other_stage():
    for mod in MODULES:
        if mod.startswith("eagleflow.stages.") and mod != "eagleflow.stages.common":
            others = {t for t in imports_of(mod) if t.startswith("eagleflow.stages.")} - {"eagleflow.stages.common"}
            assert not others, f"{mod} imports {sorted(others)}: what two stages share belongs below them"


def test_no_import_cycles():
    graph = {m: imports_of(m) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
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
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    # A package's __init__ importing its own submodules (its face) is not a cycle worth naming.
    real = [c for c in cycles if not all(x == c[0] or x.startswith(c[0] + ".") for x in c)]
    assert not real, f"import cycles: {real}"


def test_the_library_never_imports_prefect():
    for mod, path in MODULES.items():
        if mod.startswith("eagleflow"):
            text = path.read_text()
            assert not re.search(r"^\s*(from|import) prefect\b", text, re.M), f"{path} imports prefect"


def test_modules_stay_short_or_say_why():
    for path in MODULES.values():
        n = len(path.read_text().splitlines())
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        why = "Long because" in "\n".join(doc.splitlines()[:4])
        assert n <= LONG_LIMIT or why, (
            f"{path} has {n} lines; split it by job, or say why in its docstring's first lines"
        )


def test_nothing_loose_at_the_library_root():
    loose = sorted(p.name for p in (ROOT / "eagleflow").glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules at eagleflow/'s root: {loose}; each belongs in the package of what it serves"


BUILTIN_ERRORS = {n for n in dir(__builtins__ if isinstance(__builtins__, dict) else __builtins__.__dict__)}
BUILTIN_ERRORS = {n for n in BUILTIN_ERRORS if n.endswith(("Error", "Exception")) or n == "Exception"}


def test_every_error_class_derives_from_the_root_error():
    """A caller that catches `eagleflow.EagleflowError` catches every error eagleflow raises on purpose: an
    exception class that derives from a built-in one must also name the root (or derive from a project error)."""
    bad = []
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                if any(b in BUILTIN_ERRORS for b in bases) and "EagleflowError" not in bases:
                    bad.append(f"{mod}.{node.name}({', '.join(bases)})")
    assert not bad, f"exception classes outside the root: {bad}"
