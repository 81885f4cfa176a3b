"""The package's import graph: no cycles, and no module imports another
module's private names (each folder stays understandable on its own)."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "pcbatch"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imports(name: str) -> list[tuple[str, list[str], int]]:
    """(imported pcbatch module, names taken from it, line) for every import in
    the module, function-level imports included (they are cycles too, only later)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.startswith("pcbatch")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if not base.startswith("pcbatch"):
                continue
            names = [a.name for a in node.names]
            submodules = [n for n in names if f"{base}.{n}" in MODULES]
            out += [(f"{base}.{n}", [], node.lineno) for n in submodules]
            if len(submodules) < len(names):
                out.append((base, [n for n in names if n not in submodules], node.lineno))
    # A module's own ancestor packages are initialised before it anyway: no edge.
    return [(m, names, line) for m, names, line in out if m in MODULES and not name.startswith(m + ".")]


@functools.cache
def graph() -> dict[str, list[tuple[str, list[str], int]]]:
    # Built when a test asks, not at collection: every xdist worker collects this file.
    return {name: imports(name) for name in MODULES}


def test_the_graph_is_not_empty():
    assert len(MODULES) > 30 and sum(map(len, graph().values())) > 50


def test_no_import_cycles():
    # A cycle through a package's __init__ (which re-exports) is an
    # import-order hazard too.
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        path.append(name)
        for target, _, _ in graph()[name]:
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target)
        path.pop()
        state[name] = 2

    for name in sorted(MODULES):
        if name not in state:
            visit(name)


def test_no_private_names_imported_from_other_modules():
    offenders = [f"{MODULES[name].relative_to(ROOT.parent)}:{line} imports {n} from {target}"
                 for name, edges in graph().items() for target, names, line in edges
                 for n in names if n.startswith("_") and not n.startswith("__") and target != name]
    assert not offenders, "\n".join(offenders)
