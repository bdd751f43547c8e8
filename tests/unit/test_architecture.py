"""The house rules of tuner/, checked on its source: one-way imports, small modules, a map.

- no import cycle among tuner's modules (every import counts: top level, inside functions,
  under TYPE_CHECKING);
- the product core never imports the simulator (`tuner.sim` is a test double and a demo);
- no module over 500 lines;
- every module is named in docs/architecture.md, so the map stays true.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "tuner"
MAX_LINES = 500


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, known: set[str]) -> set[str]:
    """tuner modules `path` imports (resolving `from tuner.x import y` to tuner.x.y if a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if name in known:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    """Module -> the tuner modules it imports. Importing tuner.x.y runs tuner.x's __init__, so
    it is an edge to tuner.x too; a package's __init__ re-exporting its own modules is not a
    cycle a reader trips on, so those edges are left out."""
    mods = modules()
    known = set(mods)
    g: dict[str, set[str]] = {}
    for m, path in mods.items():
        deps = imports_of(path, known)
        for d in list(deps):
            parent = d.rsplit(".", 1)[0]
            while parent in known and parent != "tuner":
                deps.add(parent)
                parent = parent.rsplit(".", 1)[0]
        if path.name == "__init__.py":
            deps = {d for d in deps if not d.startswith(m + ".")}
        g[m] = deps - {m} - {p for p in known if m.startswith(p + ".")}
    return g


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
    """A cycle as a list of modules, or None (depth-first search with colours)."""
    colour: dict[str, int] = dict.fromkeys(g, 0)
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        colour[m] = 1
        stack.append(m)
        for d in sorted(g[m]):
            if colour[d] == 1:
                return [*stack[stack.index(d) :], d]
            if colour[d] == 0 and (found := visit(d)):
                return found
        stack.pop()
        colour[m] = 2
        return None

    for m in sorted(g):
        if colour[m] == 0 and (found := visit(m)):
            return found
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle() -> None:
    assert find_cycle(graph()) is None


def test_the_core_never_imports_the_simulator() -> None:
    bad = {
        m: sorted(d for d in deps if d.startswith("tuner.sim"))
        for m, deps in graph().items()
        # `tuner sim` runs the simulator; `tuner tune --virtual` runs a study on its engine
        if not m.startswith("tuner.sim")
        and m not in ("tuner.commands.sim", "tuner.commands.tune", "tuner.cli")
    }
    assert {m: d for m, d in bad.items() if d} == {}


def test_no_module_over_500_lines() -> None:
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    assert {m: n for m, n in sizes.items() if n > MAX_LINES} == {}


def test_every_module_is_on_the_map() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    missing = [
        str(p.relative_to(REPO))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "__init__.py" and str(p.relative_to(PACKAGE)) not in text
    ]
    assert missing == []
