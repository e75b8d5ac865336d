"""The package's shape, read from the source with ast (docs/architecture.md):

  inventory -> engine -> operations (ops) -> commands -> cli -> tasks.py

A module may import its own layer and the layers below it, never one above; the lab is
imported by the cli alone; there is no import cycle anywhere (function-level imports count
too); printing happens in the cli (and the lab's own progress, and the payload scripts that
run on the nodes); modules, functions and parameter lists stay small."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PKG = SRC / "nodeprep"
BASE = {"nodeprep", "nodeprep.errors", "nodeprep.settings", "nodeprep.redact"}
LAYERS = {"nodeside": 0, "inventory": 1, "engine": 2, "ops": 3, "lab": 3, "commands": 4, "cli": 5}
PAYLOADS = "nodeprep.nodeside."      # scripts shipped to the nodes, run there standalone


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Modules of the package that NAME imports (anywhere in it, lazily or not)."""
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rpartition(".")[0]
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[:len(here.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        deps |= {t for t in targets if t in MODULES and t != name}
    return deps


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def layer(module: str) -> int:
    if module in BASE:
        return 0
    return LAYERS[module.split(".")[1]]


def test_every_module_has_a_layer():
    assert all(layer(m) >= 0 for m in MODULES)


def test_no_import_goes_up_a_layer():
    bad = [f"{m} ({layer(m)}) imports {d} ({layer(d)})" for m, deps in GRAPH.items() for d in deps
           if layer(d) > layer(m)]
    assert bad == []


def test_only_the_cli_imports_the_lab():
    bad = [f"{m} imports {d}" for m, deps in GRAPH.items() for d in deps
           if d.split(".")[:2] == ["nodeprep", "lab"] and m.split(".")[1] not in ("cli", "lab")]
    assert bad == []


def test_the_lab_imports_nothing_above_the_engine():
    bad = [f"{m} imports {d}" for m, deps in GRAPH.items() if m.startswith("nodeprep.lab")
           for d in deps if d not in BASE and d.split(".")[1] not in ("engine", "lab")]
    assert bad == []


def test_no_import_cycle():
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        for d in sorted(GRAPH[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2
    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_the_checker_sees_cycles_and_upward_imports():
    """The graph is real: known edges are found (a checker that sees nothing passes anything)."""
    assert "nodeprep.engine.fleet" in GRAPH["nodeprep.commands.verify"]
    assert "nodeprep.engine.facts.probe" in GRAPH["nodeprep.engine.facts.gpus"]
    assert "nodeprep.lab" in GRAPH["nodeprep.cli"]          # a lazy, function-level import


def _functions():
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield name, node


def test_no_print_outside_the_cli_and_the_lab():
    bad = []
    for name, path in MODULES.items():
        if name.split(".")[1:2] in (["cli"], ["lab"]) or name.startswith(PAYLOADS):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                bad.append(f"{name}:{node.lineno}")
    assert bad == []


@pytest.mark.parametrize("limit", [400])
def test_modules_stay_small(limit):
    assert [f"{m}: {len(p.read_text().splitlines())}" for m, p in MODULES.items()
            if len(p.read_text().splitlines()) > limit] == []


def test_functions_stay_short_and_take_few_parameters():
    long, wide = [], []
    for name, fn in _functions():
        if fn.end_lineno - fn.lineno + 1 > 60:
            long.append(f"{name}.{fn.name}")
        a = fn.args
        n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
        if a.args and a.args[0].arg in ("self", "cls"):
            n -= 1
        if n > 6:
            wide.append(f"{name}.{fn.name} ({n})")
    assert (long, wide) == ([], [])
