"""cardc's modules stand in layers: each imports only from its own layer's group or from the
layers below it, and no import, at the top of a module or inside a function, closes a cycle.
The order is declared here, once; a new module is placed in it by its name's longest prefix,
and one that matches none is an error (declare where it stands)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "cardc"

# Lowest first. Modules of one layer may import each other (without a cycle); groups that share a
# rank (render and lower) may not import each other: both read checked cards, neither needs the other.
LAYERS: list[tuple[int, str, tuple[str, ...]]] = [
    (0, "base", ("cardc.syntax", "cardc.spelling", "cardc.dims", "cardc.names", "cardc.diagnostics",
                 "cardc.types", "cardc.files", "cardc.atomic", "cardc.builtins")),
    (1, "front end", ("cardc.lalr", "cardc.parser", "cardc.library", "cardc.render.text")),
    (2, "checker", ("cardc.checker", "cardc.namecheck", "cardc.presets", "cardc.flops",
                    "cardc.info", "cardc.diff")),
    (3, "render", ("cardc.render", "cardc.highlight")),
    (3, "lower", ("cardc.ir", "cardc.lower", "cardc.codegen", "cardc.linebreak")),
    (3, "interpret", ("cardc.interpret",)),
    (4, "build", ("cardc.build",)),
    (5, "runtime", ("cardc.runtime",)),
    (6, "interop", ("cardc.interop",)),
    (7, "docs", ("cardc.docs",)),
    (8, "application", ("cardc.app",)),
    (8, "language server", ("cardc.lsp",)),
    (9, "command line", ("cardc.cli", "cardc.__main__", "cardc")),
]
PACKAGE = "cardc"  # the package itself: its own layer, not a prefix of every module


def module_names() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The cardc modules `name` imports anywhere in its text: at the top and inside functions.
    `from pkg import x` counts as importing pkg.x where that is a module, else pkg itself."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in mods)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join(package + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods}
            found.update(subs)
            if base in mods and len(subs) < len(node.names):
                found.add(base)  # names taken from the module itself
    found.discard(name)
    return found


def layer_of(name: str) -> tuple[int, str] | None:
    best: tuple[int, int, str] | None = None
    for rank, group, prefixes in LAYERS:
        for prefix in prefixes:
            inside = name.startswith(prefix + ".") and prefix != PACKAGE
            if (name == prefix or inside) and \
                    (best is None or len(prefix) > best[0]):
                best = (len(prefix), rank, group)
    return None if best is None else best[1:]


def graph() -> dict[str, set[str]]:
    mods = module_names()
    return {name: imports(name, path, mods) for name, path in mods.items()}


def test_every_module_has_a_declared_layer():
    undeclared = sorted(name for name in module_names() if layer_of(name) is None)
    assert not undeclared, f"declare the layer of {undeclared} in tests/test_layers.py"


def test_imports_go_down_the_layers():
    wrong = []
    for name, targets in sorted(graph().items()):
        here = layer_of(name)
        for target in sorted(targets):
            there = layer_of(target)
            if here is None or there is None or there[1] == here[1]:
                continue
            if there[0] >= here[0]:
                wrong.append(f"{name} ({here[1]}) imports {target} ({there[1]})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
