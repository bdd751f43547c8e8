"""Extract SGLang's complete launch-flag table from its source, as data (SGLang is not imported).

Regenerate (a developer step; the JSON it writes is committed, the tuner never runs this):

    pip download --no-deps sglang==0.5.23 -d /tmp/sgl && unzip -q /tmp/sgl/sglang-0.5.23-*.whl \\
        'sglang/*' -d /tmp/sgl/0.5.23
    python -m tuner.sglang.extract /tmp/sgl/0.5.23 0.5.23    # -> tuner/sglang/data/flags-0.5.23.json

A new release: the same, then add it to `tables.VERSIONS` (oldest first) and, for each flag it
dropped in favour of others, a line in `tables.REPLACED`; `pytest tests/fidelity` states the
facts worth re-checking. Each record also gives the ServerArgs fields with their defaults
(what `/server_info` reports) and every flag's declaring line (`src`).

The extractor reads `sglang/srt/server_args.py` with `ast` and replays, as facts, what SGLang's
`ServerArgs.add_cli_args` registers on its argparse parser: each `parser.add_argument(...)` call
(0.5.6.post2 and earlier), and from 0.5.23 on also the annotated namespace fields that
`add_cli_args_from_dataclass` turns into arguments (`A[T, Arg(...)]` in `arg_groups/fields/`,
in `POSITIONAL_FIELD_ORDER` then namespace order; bool -> store_true, `Literal` -> choices,
`list[X]` -> nargs "+", no default -> required). Names (constants, `ServerArgs.x` defaults,
imported choice lists) are evaluated from module-level assignments, following `from` imports
inside the package; what cannot be evaluated statically (a choice list computed at run time) is
recorded under `unresolved` and left open (None). A `type` is kept as its source text (`int`,
`json.loads`, `human_readable_int`); `tuner.sglang.tables` maps the names to parsers.
"""

from __future__ import annotations

import ast
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).with_name("data")
SERVER_ARGS = "sglang.srt.server_args"
_MISSING = object()
FIELD_CALLS = ("field", "dataclasses.field", "msgspec.field")


class Unevaluable(Exception):
    """An expression whose value only exists when SGLang runs."""


@dataclass
class _Module:
    """One parsed source file: its module-level names, imports, classes and functions."""

    name: str
    path: Path
    tree: ast.Module
    assigns: dict[str, ast.expr] = field(default_factory=dict)
    imports: dict[str, tuple[str, str]] = field(default_factory=dict)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)


class Source:
    """An unpacked SGLang package tree (the directory that holds `sglang/`)."""

    def __init__(self, root: Path):
        self.root = root
        self._modules: dict[str, _Module] = {}

    def module(self, name: str) -> _Module | None:
        if name in self._modules:
            return self._modules[name]
        base = self.root / Path(*name.split("."))
        path = next(
            (p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()), None
        )
        if path is None:
            return None
        tree = ast.parse(path.read_text(), str(path))
        mod = _Module(name, path, tree)
        for node in tree.body:
            _index(mod, node)
        self._modules[name] = mod
        return mod

    def rel(self, mod: _Module) -> str:
        """The file's path in SGLang's repository (the wheel's `sglang/` is `python/sglang/`)."""
        return "python/" + mod.path.relative_to(self.root).as_posix()


def _scope(mod: _Module, body: list[ast.stmt]) -> _Module:
    """`mod` seen from inside a class or function body: its local names shadow the module's."""
    inner = _Module(mod.name, mod.path, mod.tree, dict(mod.assigns), dict(mod.imports))
    inner.classes = mod.classes
    for node in body:
        _index(inner, node)
    return inner


def _index(mod: _Module, node: ast.stmt) -> None:
    """Record a module-level statement; `if`/`try` bodies count (conditional imports)."""
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Name):
                mod.assigns[target.id] = node.value
    elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
        mod.assigns[node.target.id] = node.value
    elif isinstance(node, ast.ImportFrom) and node.module:
        for alias in node.names:
            mod.imports[alias.asname or alias.name] = (node.module, alias.name)
    elif isinstance(node, ast.ClassDef):
        mod.classes[node.name] = node
    elif isinstance(node, (ast.If, ast.Try)):
        for sub in [*node.body, *getattr(node, "orelse", [])]:
            _index(mod, sub)


class Evaluator:
    """Evaluates the literal part of SGLang's source: enough for choices and defaults."""

    def __init__(self, src: Source):
        self.src = src

    def name(self, mod: _Module, ident: str) -> Any:
        if ident in mod.assigns:
            return self.expr(mod, mod.assigns[ident])
        if ident in mod.imports:
            other, original = mod.imports[ident]
            target = self.src.module(other)
            if target is not None:
                return self.name(target, original)
        if ident in ("True", "False", "None"):
            return {"True": True, "False": False, "None": None}[ident]
        raise Unevaluable(ident)

    def class_attr(self, mod: _Module, cls: str, attr: str) -> Any:
        """`Cls.attr` (a dataclass default, a class constant), in the class's own scope."""
        owner, node = self._class(mod, cls)
        for stmt in node.body:
            value = _class_value(stmt, attr)
            if value is not None:
                return self.field_default(_scope(owner, node.body), value)
        raise Unevaluable(f"{cls}.{attr}")

    def _class(self, mod: _Module, cls: str) -> tuple[_Module, ast.ClassDef]:
        if cls in mod.classes:
            return mod, mod.classes[cls]
        if cls in mod.imports:
            other, original = mod.imports[cls]
            target = self.src.module(other)
            if target is not None:
                return self._class(target, original)
        raise Unevaluable(cls)

    def function_result(self, mod: _Module, name: str) -> Any:
        """What a module function without arguments returns on its last, static, path
        (SGLang's parser-name helpers fall back to a constant list when no plugin loaded)."""
        func = next(
            (n for n in mod.tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None
        )
        returns = [n for n in func.body if isinstance(n, ast.Return)] if func else []
        if not returns or returns[-1].value is None:
            raise Unevaluable(f"{name}()")
        return self.expr(_scope(mod, func.body), returns[-1].value)

    def field_default(self, mod: _Module, node: ast.expr) -> Any:
        """A dataclass default: `x = 1`, `field(default=1)`, `field(default_factory=list)`."""
        if isinstance(node, ast.Call) and _callee(node) in FIELD_CALLS:
            kw = {k.arg: k.value for k in node.keywords}
            if "default" in kw:
                return self.expr(mod, kw["default"])
            factory = kw.get("default_factory")
            if isinstance(factory, ast.Name) and factory.id in ("list", "dict", "set"):
                return {"list": [], "dict": {}, "set": []}[factory.id]
            if isinstance(factory, ast.Lambda):
                return self.expr(mod, factory.body)
            raise Unevaluable(ast.unparse(node))
        return self.expr(mod, node)

    def expr(self, mod: _Module, node: ast.expr) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            return [self.expr(mod, e) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {
                self.expr(mod, k): _try(self, mod, v)
                for k, v in zip(node.keys, node.values, strict=True)
            }
        if isinstance(node, ast.Name):
            return self.name(mod, node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -self.expr(mod, node.operand)
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = self.expr(mod, node.left), self.expr(mod, node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return self.class_attr(mod, node.value.id, node.attr)
        if isinstance(node, ast.Call):
            return self._call(mod, node)
        raise Unevaluable(ast.unparse(node))

    def _call(self, mod: _Module, node: ast.Call) -> Any:
        callee = _callee(node)
        if callee in ("list", "tuple", "sorted", "set", "frozenset") and len(node.args) == 1:
            value = self.expr(mod, node.args[0])
            return sorted(value) if callee == "sorted" else list(value)
        if callee.endswith(".keys") and isinstance(node.func, ast.Attribute):
            return list(self.expr(mod, node.func.value))
        if callee == "float" and len(node.args) == 1:
            return float(self.expr(mod, node.args[0]))
        if callee == "_declared_default" and node.args:
            return ("declared", self.expr(mod, node.args[0]))
        if not node.args and not node.keywords and isinstance(node.func, ast.Name):
            return self.function_result(mod, callee)
        raise Unevaluable(ast.unparse(node))


def _try(ev: Evaluator, mod: _Module, node: ast.expr) -> Any:
    try:
        return ev.expr(mod, node)
    except Unevaluable:
        return None


def _callee(node: ast.Call) -> str:
    return ast.unparse(node.func)


def _class_value(stmt: ast.stmt, attr: str) -> ast.expr | None:
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return stmt.value if stmt.target.id == attr else None
    if isinstance(stmt, ast.Assign):
        names = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        return stmt.value if attr in names else None
    return None


class Table:
    """The flags found so far, in registration order, with what could not be evaluated."""

    def __init__(self, src: Source, ev: Evaluator):
        self.src, self.ev = src, ev
        self.flags: list[dict[str, Any]] = []
        self.unresolved: list[str] = []

    def value(self, mod: _Module, node: ast.expr, what: str) -> Any:
        try:
            return self.ev.expr(mod, node)
        except Unevaluable:
            self.unresolved.append(f"{what}: {ast.unparse(node)}")
            return None

    def add(self, record: dict[str, Any]) -> None:
        """Keep what was given (None is argparse's own default, so it is left out); an
        explicit `nargs=None` matters to an action whose own default is `nargs=0` (0.5.23's
        --monokernel-backend takes a value)."""
        explicit = {"nargs"} if record.get("explicit_nargs") else set()
        record.pop("explicit_nargs", None)
        self.flags.append({k: v for k, v in record.items() if k in explicit or v is not None})


def _call_record(table: Table, mod: _Module, call: ast.Call, defaults: dict[str, Any]) -> None:
    """One `parser.add_argument(...)` call as a record."""
    opts = [a.value for a in call.args if isinstance(a, ast.Constant)]
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    dest = table.ev.expr(mod, kw["dest"]) if "dest" in kw else _dest(opts)
    where = f"--{opts[0].lstrip('-')}"
    rec: dict[str, Any] = {"opts": opts, "dest": dest, "src": f"{table.src.rel(mod)}:{call.lineno}"}
    for key in ("type", "action"):
        if key in kw:
            text = ast.unparse(kw[key])
            rec[key] = table.ev.expr(mod, kw[key]) if isinstance(kw[key], ast.Constant) else text
    for key in ("nargs", "choices", "const", "required", "new_flag", "const_value"):
        if key in kw:
            rec[key] = table.value(mod, kw[key], f"{where} {key}")
    rec["explicit_nargs"] = "nargs" in kw
    if "default" in kw:
        default = table.value(mod, kw["default"], f"{where} default")
        if isinstance(default, tuple) and default[0] == "declared":
            default = defaults.get(default[1])
        rec["default"] = default
    table.add(rec)


def _dest(opts: list[str]) -> str:
    """argparse's dest: the first long option string, dashes to underscores."""
    longs = [o for o in opts if o.startswith("--")] or opts
    return longs[0].lstrip("-").replace("-", "_")


def _add_cli_args(mod: _Module) -> ast.FunctionDef:
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.FunctionDef) and node.name == "add_cli_args":
            return node
    raise SystemExit(f"{mod.path}: no add_cli_args")


def _add_argument_calls(func: ast.FunctionDef) -> list[ast.Call]:
    calls = [
        n
        for n in ast.walk(func)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "add_argument"
    ]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


# --- 0.5.23 and later: annotated namespace fields ------------------------------------------


def _field_specs(src: Source, sa: _Module) -> list[tuple[_Module, ast.AnnAssign]]:
    """Every input field of ServerArgs, in SGLang's order (positional order, then the rest)."""
    namespaces = sa.assigns.get("_INPUT_NAMESPACES")
    if not isinstance(namespaces, ast.List):
        return []
    found: dict[str, tuple[_Module, ast.AnnAssign]] = {}
    for elt in namespaces.elts:
        assert isinstance(elt, ast.Name)
        module_name, cls_name = sa.imports[elt.id]
        mod = src.module(module_name)
        assert mod is not None
        for stmt in mod.classes[cls_name].body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                found.setdefault(stmt.target.id, (mod, stmt))
    order_mod = src.module("sglang.srt.arg_groups.field_order")
    order_node = order_mod.assigns.get("POSITIONAL_FIELD_ORDER") if order_mod else None
    positional = [e.value for e in order_node.elts] if isinstance(order_node, ast.Tuple) else []
    ordered = [n for n in positional if n in found]
    ordered += [n for n in found if n not in set(positional)]
    return [found[n] for n in ordered]


def _unwrap(node: ast.expr, *wrappers: str) -> tuple[ast.expr, bool]:
    """(X, True) for `Wrapper[X]` (Optional, List, ...) or `X | None`; (node, False) else."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if ast.unparse(s) != "None"]
        return (sides[0], True) if len(sides) == 1 else (node, False)
    if isinstance(node, ast.Subscript) and ast.unparse(node.value).split(".")[-1] in wrappers:
        inner = node.slice
        if ast.unparse(node.value).split(".")[-1] == "Union" and isinstance(inner, ast.Tuple):
            rest = [e for e in inner.elts if ast.unparse(e) != "None"]
            return (rest[0], True) if len(rest) == 1 else (node, False)
        return inner, True
    return node, False


def _scalar_type(node: ast.expr) -> str:
    """`_infer_type_func`: str, int and float map to themselves, anything else to str."""
    text = ast.unparse(node)
    return text if text in ("str", "int", "float") else "str"


def _field_record(table: Table, mod: _Module, stmt: ast.AnnAssign) -> None:
    """An `A[T, Arg(...)]` / `A[T, "help"]` field as the argument SGLang derives from it."""
    ann = stmt.annotation
    if not (isinstance(ann, ast.Subscript) and ast.unparse(ann.value) in ("A", "Annotated")):
        return
    assert isinstance(ann.slice, ast.Tuple)
    raw, *meta = ann.slice.elts
    arg: dict[str, ast.expr] | None = None
    for m in meta:
        if isinstance(m, ast.Call) and _callee(m) == "Arg":
            arg = {k.arg: k.value for k in m.keywords if k.arg}
            break
        if isinstance(m, ast.Constant) and isinstance(m.value, str):
            arg = {}
            break
    if arg is None:
        return
    ev = table.ev

    def meta_value(key: str) -> Any:
        return table.value(mod, arg[key], f"{stmt.target.id} {key}") if key in arg else None

    if meta_value("no_cli"):
        return
    name = stmt.target.id  # type: ignore[union-attr]
    cli = meta_value("cli_name") or "--" + name.replace("_", "-")
    default: Any = _MISSING
    if stmt.value is not None:
        try:
            default = ev.field_default(mod, stmt.value)
        except Unevaluable:
            table.unresolved.append(f"{cli} default: {ast.unparse(stmt.value)}")
            default = None
    rec: dict[str, Any] = {
        "opts": [cli, *(meta_value("aliases") or [])],
        "dest": name,
        "src": f"{table.src.rel(mod)}:{stmt.lineno}",
    }
    if default is not _MISSING:
        rec["default"] = default
    choices, nargs, const = meta_value("choices"), meta_value("nargs"), meta_value("const")
    type_parser = ast.unparse(arg["type_parser"]) if "type_parser" in arg else None
    if "action" in arg:
        action = ast.unparse(arg["action"])
        rec["action"] = action.removeprefix("argparse.")
        kwargs = arg.get("action_kwargs")
        if isinstance(kwargs, ast.Dict):
            for k, v in zip(kwargs.keys, kwargs.values, strict=True):
                key = ev.expr(mod, k)  # type: ignore[arg-type]
                rec[key] = ast.unparse(v) if key == "type" else table.value(mod, v, f"{cli} {key}")
        table.add(rec)
        return
    inner, _ = _unwrap(raw, "Optional", "Union")
    literal = isinstance(inner, ast.Subscript) and ast.unparse(inner.value).endswith("Literal")
    listed, is_list = _unwrap(inner, "List", "list")
    if literal:
        values = ev.expr(mod, inner.slice)  # type: ignore[union-attr]
        values = values if isinstance(values, list) else [values]
        rec["type"] = type_parser or _scalar_type(ast.Name(type(values[0]).__name__))
        rec["choices"] = choices or values
        rec["const"] = const
    elif is_list and type_parser is None:
        elem = listed.elts[0] if isinstance(listed, ast.Tuple) else listed
        rec.update(type=_scalar_type(elem), nargs=nargs or "+", choices=choices, const=const)
    elif ast.unparse(inner) == "bool":
        rec["action"] = "store_true"
    else:
        rec.update(type=type_parser or _scalar_type(inner), choices=choices, nargs=nargs)
        rec["const"] = const
        required = meta_value("required")
        if required is True or (required is None and default is _MISSING):
            rec["required"] = True
    table.add(rec)


# --- driver --------------------------------------------------------------------------------


def extract(root: Path) -> dict[str, Any]:
    """The flag table of the SGLang tree at `root` (the directory holding `sglang/`)."""
    src = Source(root)
    sa = src.module(SERVER_ARGS)
    if sa is None:
        raise SystemExit(f"{root}: no sglang/srt/server_args.py")
    table = Table(src, Evaluator(src))
    specs = _field_specs(src, sa)
    for mod, stmt in specs:
        _field_record(table, mod, stmt)
    if not specs:  # 0.5.6.post2: a dataclass whose fields are ServerArgs' own annotations
        specs = [(sa, s) for s in sa.classes["ServerArgs"].body if isinstance(s, ast.AnnAssign)]
    fields: list[dict[str, Any]] = []
    for mod, stmt in specs:
        name = stmt.target.id  # type: ignore[union-attr]
        rec = {"name": name, "src": f"{src.rel(mod)}:{stmt.lineno}"}
        if stmt.value is not None:
            try:
                rec["default"] = table.ev.field_default(mod, stmt.value)
            except Unevaluable:
                table.unresolved.append(f"field {name} default: {ast.unparse(stmt.value)}")
        fields.append(rec)
    defaults = {f["name"]: f.get("default") for f in fields}
    func = _add_cli_args(sa)
    local = _scope(sa, func.body)  # choice lists computed into locals first
    for call in _add_argument_calls(func):
        _call_record(table, local, call, defaults)
    return {"flags": table.flags, "fields": fields, "unresolved": table.unresolved}


def _dump(data: dict[str, Any]) -> str:
    """JSON with one flag or field per line: small, and a new release diffs line by line."""
    parts = []
    for key, value in data.items():
        if isinstance(value, list):
            rows = ",\n".join("  " + json.dumps(v) for v in value)
            parts.append(f"{json.dumps(key)}: [\n{rows}\n ]")
        else:
            parts.append(f"{json.dumps(key)}: {json.dumps(value)}")
    return "{\n " + ",\n ".join(parts) + "\n}\n"


def main(argv: list[str]) -> int:
    """`python -m tuner.sglang.extract SGLANG_TREE VERSION [OUT.json]`."""
    if len(argv) not in (2, 3):
        print(
            "usage: python -m tuner.sglang.extract SGLANG_TREE VERSION [OUT.json]", file=sys.stderr
        )
        return 2
    root, version = Path(argv[0]), argv[1]
    out = Path(argv[2]) if len(argv) == 3 else DATA_DIR / f"flags-{version}.json"
    data = {"version": version, "source": "python/sglang/srt/server_args.py", **extract(root)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(_dump(data))
    n = sum(len(f["opts"]) for f in data["flags"])
    print(
        f"{out}: {len(data['flags'])} flags, {n} option strings, {len(data['fields'])} fields, "
        f"{len(data['unresolved'])} unresolved"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
