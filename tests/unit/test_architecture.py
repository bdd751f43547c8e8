"""The house rules of tuner/, checked on its source: one-way imports, small modules, a map.

- no import cycle among tuner's modules (every import counts: top level, inside functions,
  under TYPE_CHECKING), nor among its packages (the study file's loading, config.load and
  config.validate, stands apart: it judges a file with every package's knowledge);
- the product core never imports the simulator (`tuner.sim` is a test double and a demo);
- a module whose docstring calls it pure imports no I/O library, through any chain;
- no module over 500 lines; at most 8 modules at the top level of tuner/;
- every package says what it owns in its `__init__.py`;
- every module is named in docs/architecture.md, and every function, class and file the page
  names exists, so the map stays true.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "tuner"
MAP = REPO / "docs" / "architecture.md"
MAX_LINES = 500
MAX_TOP_LEVEL = 8
#: the study file's loading: it reads a file and judges it with every package's knowledge
LOADING = ("tuner.config.load", "tuner.config.validate")
#: what a module that calls itself pure never imports, directly or through tuner's modules
IO_LIBRARIES = (
    "aiohttp",
    "asyncio",
    "http.client",
    "optuna.storages",
    "paramiko",
    "psutil",
    "socket",
    "sqlalchemy",
    "subprocess",
    "urllib.request",
)


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
    text = MAP.read_text()
    missing = [
        str(p.relative_to(REPO))
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "__init__.py" and str(p.relative_to(PACKAGE)) not in text
    ]
    assert missing == []


def test_the_top_level_keeps_few_modules() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL, top


def test_every_package_states_what_it_owns() -> None:
    text = MAP.read_text()
    vague = {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        first = doc.strip().split("\n")[0]
        if len(first) < 20 or "TODO" in doc:
            vague[str(init.relative_to(REPO))] = first
    assert vague == {}
    packages = {str(p.parent.relative_to(PACKAGE)) for p in PACKAGE.glob("*/__init__.py")}
    assert {p for p in packages if f"`{p}/`" not in text} == set()


def package_of(module: str) -> str:
    """The node a module counts as in the package graph: its top-level package or module, the
    study file's loading apart."""
    return "config.load" if module in LOADING else module.split(".")[1]


def test_the_package_finder_finds_cycles() -> None:
    g = {"tuner.a.x": {"tuner.b.y"}, "tuner.b.y": {"tuner.c"}, "tuner.c": {"tuner.a.z"}}
    assert find_cycle(package_graph(g)) == ["a", "b", "c", "a"]


def package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in g.items():
        if m == "tuner":
            continue
        node = out.setdefault(package_of(m), set())
        node.update(package_of(d) for d in deps if d != "tuner")
    for node, deps in out.items():
        deps.discard(node)
        for d in deps:
            out.setdefault(d, set())
    return out


def test_packages_import_one_way() -> None:
    assert find_cycle(package_graph(graph())) is None


def runtime_graph() -> dict[str, set[str]]:
    """Module -> the tuner modules importing it runs: its imports, the `__init__` of every
    package on their way, and what those `__init__`s import."""
    mods = modules()
    known = set(mods)
    g: dict[str, set[str]] = {}
    for m, path in mods.items():
        deps = imports_of(path, known)
        for d in [m, *deps]:
            parent = d.rsplit(".", 1)[0]
            while parent in known and parent != "tuner":
                deps.add(parent)
                parent = parent.rsplit(".", 1)[0]
        g[m] = deps - {m}
    return g


def io_imports(path: Path) -> set[str]:
    """The I/O libraries a module imports itself (any import statement, anywhere in it)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            out.update(lib for lib in IO_LIBRARIES if name == lib or name.startswith(lib + "."))
    return out


def test_pure_modules_import_no_io() -> None:
    mods, g = modules(), runtime_graph()
    bad: dict[str, dict[str, list[str]]] = {}
    for m, path in mods.items():
        if not re.search(r"\bPure\b", ast.get_docstring(ast.parse(path.read_text())) or ""):
            continue
        seen, stack = set(), [m]
        while stack:
            x = stack.pop()
            if x not in seen:
                seen.add(x)
                stack.extend(g[x])
        found = {x: sorted(io_imports(mods[x])) for x in sorted(seen) if io_imports(mods[x])}
        if found:
            bad[m] = found
    assert bad == {}


#: a dotted name in backticks: `trial.runner.TrialRunner.run`
DOTTED = re.compile(r"`([a-z_]+(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")
#: file names that look dotted (`config.json`, `best.yaml`)
FILES = (".py", ".json", ".jsonl", ".yaml", ".md", ".html", ".db", ".txt", ".log")
#: a path in backticks: `verdict/tails.py`, `config/`
PATH = re.compile(r"`([a-z_]+(?:/[a-z_<>-]+)*(?:\.py|/))`")


def defined_in(tree: ast.Module) -> dict[str, ast.AST]:
    """Top-level names of a module (or of a class body) -> their node."""
    out: dict[str, ast.AST] = {}
    for n in tree.body:
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out[n.name] = n
        elif isinstance(n, ast.Assign):
            out.update({t.id: n for t in n.targets if isinstance(t, ast.Name)})
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            out[n.target.id] = n
        elif isinstance(n, ast.ImportFrom | ast.Import):
            out.update({(a.asname or a.name).split(".")[0]: n for a in n.names})
    return out


def resolves(dotted: str, mods: dict[str, Path]) -> bool:
    """Does `a.b.c.d` name a module of tuner and, after it, a name defined there (a class's
    method or field after a class)?"""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = "tuner." + ".".join(parts[:i])
        if module in mods:
            node: ast.AST = ast.parse(mods[module].read_text())
            for name in parts[i:]:
                if not isinstance(node, ast.Module | ast.ClassDef):
                    return False
                found = defined_in(node).get(name)  # type: ignore[arg-type]
                if found is None:
                    return False
                node = found
            return True
    return False


def test_the_sample_names_resolve() -> None:
    mods = modules()
    assert resolves("trial.runner.TrialRunner.run", mods)
    assert resolves("study.states.STATE_OF", mods)
    assert not resolves("trial.runner.TrialRunner._learn_failure", mods)
    assert not resolves("trial.runner.nothing_here", mods)


def test_every_name_on_the_map_exists() -> None:
    text, mods = MAP.read_text(), modules()
    roots = {m.split(".")[1] for m in mods if m != "tuner"}
    names = {d for d in DOTTED.findall(text) if d.split(".")[0] in roots and not d.endswith(FILES)}
    assert len(names) > 40  # the decision table names them; a regex gone blind fails here
    assert sorted(d for d in names if not resolves(d, mods)) == []
    paths = set(PATH.findall(text))
    gone = [
        p for p in paths if "<" not in p and not ((PACKAGE / p).exists() or (REPO / p).exists())
    ]
    assert sorted(gone) == []
