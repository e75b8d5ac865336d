"""The package's shape, read from the source with ast (docs/architecture.md):

  inventory -> engine -> operations (ops) -> commands -> cli -> tasks.py

A module may import its own layer and the layers below it, never one above; the lab is
imported by the cli alone; there is no import cycle anywhere (function-level imports count
too); the packages of ops import each other one way only; nodeside (the programs that run ON
the nodes) imports only the standard library and is never imported by controller code except
for the paths of its files; roles (roles/<name>/role.py, outside the package) stand on the
engine and ops, never on commands or the cli; printing happens in the cli (and the lab's own
progress, and nodeside); modules, functions and parameter lists stay small, roles included;
every package's __init__ docstring is a map naming each of its modules."""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
PKG = SRC / "nodeprep"
ROLES = ROOT / "roles"
BASE = {"nodeprep", "nodeprep.errors", "nodeprep.settings", "nodeprep.redact"}
LAYERS = {"nodeside": 0, "inventory": 1, "engine": 2, "ops": 3, "lab": 3, "commands": 4, "cli": 5}
NODESIDE = "nodeprep.nodeside"
# What nodeside may import besides the standard library and its own modules: torch, for the
# programs that run in the nodes' provisioned venv only: the training payloads and the deep
# health tier's GPU program.
NODESIDE_EXTRA = {"torch"}
TORCH_PROGRAMS = (".payloads.", "nodeprep.nodeside.gpudeep")
MAX_LINES, MAX_FUNCTION, MAX_PARAMS = 400, 60, 6


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


MODULES = _modules()
ROLE_FILES = {f"roles.{p.parent.name}": p for p in sorted(ROLES.glob("*/role.py"))}


def _imported(tree: ast.AST, here: str) -> list[str]:
    """Every name imported anywhere in TREE (absolute; relative imports resolved from HERE)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out += [
                f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names
            ]
    return out


def _imports(name: str, path: Path) -> set[str]:
    """Modules of the package that NAME imports (anywhere in it, lazily or not)."""
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return {t for t in _imported(ast.parse(path.read_text()), here) if t in MODULES and t != name}


@functools.cache
def graph() -> dict[str, set[str]]:
    """The package's import graph, parsed once per process when a test first asks for it
    (not at import: every xdist worker collects this module)."""
    return {name: _imports(name, path) for name, path in MODULES.items()}


@functools.cache
def role_graph() -> dict[str, set[str]]:
    return {name: _imports(name, path) for name, path in ROLE_FILES.items()}


def layer(module: str) -> int:
    return 0 if module in BASE else LAYERS[module.split(".")[1]]


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first walk of GRAPH meets, as `a -> b -> a`."""
    state: dict[str, int] = {}
    found = []

    def visit(m, stack):
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                found.append(" -> ".join(stack[stack.index(d) :] + [d]))
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def ops_packages() -> dict[str, set[str]]:
    """The import graph between the packages of ops (provision, torchplan, ...)."""
    out: dict[str, set[str]] = {}
    for m, deps in graph().items():
        if m.startswith("nodeprep.ops.") and len(m.split(".")) > 3:
            own = m.split(".")[2]
            out.setdefault(own, set()).update(
                d.split(".")[2]
                for d in deps
                if d.startswith("nodeprep.ops.") and d.split(".")[2] != own
            )
    return out


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m not in BASE and m.split(".")[1] not in LAYERS] == []


def test_no_import_goes_up_a_layer():
    bad = [
        f"{m} ({layer(m)}) imports {d} ({layer(d)})"
        for m, deps in graph().items()
        for d in deps
        if layer(d) > layer(m)
    ]
    assert bad == []


def test_only_the_cli_imports_the_lab():
    bad = [
        f"{m} imports {d}"
        for m, deps in graph().items()
        for d in deps
        if d.split(".")[:2] == ["nodeprep", "lab"] and m.split(".")[1] not in ("cli", "lab")
    ]
    assert bad == []


def test_the_lab_imports_nothing_above_the_engine():
    # nodeprep.nodeside itself is only the paths of the node-side programs (gpu_standin)
    bad = [
        f"{m} imports {d}"
        for m, deps in graph().items()
        if m.startswith("nodeprep.lab")
        for d in deps
        if d not in BASE and d.split(".")[1] not in ("engine", "lab") and d != "nodeprep.nodeside"
    ]
    assert bad == []


def test_no_import_cycle():
    assert cycles(graph()) == []


def test_ops_is_packages_that_import_each_other_one_way():
    flat = [
        m
        for m in MODULES
        if m.startswith("nodeprep.ops.")
        and len(m.split(".")) == 3
        and MODULES[m].name != "__init__.py"
    ]
    assert flat == [], "every module of ops lives in the package of its concern"
    assert cycles(ops_packages()) == []


def test_nodeside_imports_only_the_standard_library():
    own = {p.stem for p in (PKG / "nodeside").rglob("*.py")}
    allowed = set(sys.stdlib_module_names) | own | NODESIDE_EXTRA
    bad = []
    for name, path in MODULES.items():
        if name == NODESIDE or not name.startswith(NODESIDE + "."):
            continue
        for imp in _imported(ast.parse(path.read_text()), name.rpartition(".")[0]):
            top = imp.split(".")[0]
            if top not in allowed or (
                top == "torch" and not any(t in name for t in TORCH_PROGRAMS)
            ):
                bad.append(f"{name} imports {imp}")
    assert bad == []


def test_controller_code_never_imports_a_nodeside_program():
    """Only the paths of nodeside's files (nodeprep.nodeside itself) are imported; the
    programs are shipped as files or text, never run on the controller."""
    bad = [
        f"{m} imports {d}"
        for m, deps in {**graph(), **role_graph()}.items()
        for d in deps
        if d.startswith(NODESIDE + ".") and not m.startswith(NODESIDE)
    ]
    assert bad == []


def test_roles_stand_on_the_engine_and_ops_only():
    assert ROLE_FILES, "no roles/*/role.py found"
    bad = [
        f"{r} imports {d}"
        for r, deps in role_graph().items()
        for d in deps
        if d not in BASE and d.split(".")[1] not in ("inventory", "engine", "ops")
    ]
    assert bad == []


def test_the_checker_sees_cycles_and_upward_imports():
    """The graph is real: known edges are found (a checker that sees nothing passes anything),
    and the cycle finder finds a cycle it is given."""
    assert "nodeprep.engine.fleet" in graph()["nodeprep.commands.verify"]
    assert "nodeprep.engine.facts.probe" in graph()["nodeprep.engine.facts.gpus"]
    assert "nodeprep.lab" in graph()["nodeprep.cli"]  # a lazy, function-level import
    assert "nodeprep.ops.pystack" in role_graph()["roles.venv"]
    assert {"provision", "torchplan"} <= ops_packages()["pystack"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]
    assert cycles({"a": {"b"}, "b": set()}) == []


def _functions(files: dict[str, Path]):
    for name, path in files.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield name, node


def test_no_print_outside_the_cli_and_the_lab():
    bad = []
    for name, path in {**MODULES, **ROLE_FILES}.items():
        if name.split(".")[1:2] in (["cli"], ["lab"], ["nodeside"]):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                bad.append(f"{name}:{node.lineno}")
    assert bad == []


def test_modules_stay_small():
    sizes = {m: len(p.read_text().splitlines()) for m, p in {**MODULES, **ROLE_FILES}.items()}
    assert len(sizes) > len(ROLE_FILES) > 0
    assert [f"{m}: {n}" for m, n in sizes.items() if n > MAX_LINES] == []


def _too_long_or_wide(files: dict[str, Path]) -> tuple[list[str], list[str]]:
    long, wide = [], []
    for name, fn in _functions(files):
        if fn.end_lineno - fn.lineno + 1 > MAX_FUNCTION:
            long.append(f"{name}.{fn.name}")
        a = fn.args
        n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
        if a.args and a.args[0].arg in ("self", "cls"):
            n -= 1
        if n > MAX_PARAMS:
            wide.append(f"{name}.{fn.name} ({n})")
    return long, wide


@pytest.mark.parametrize("what", ["package", "roles"])
def test_functions_stay_short_and_take_few_parameters(what):
    files = MODULES if what == "package" else ROLE_FILES
    assert files
    assert _too_long_or_wide(files) == ([], [])


def test_the_size_checker_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    f = tmp_path / "big.py"
    f.write_text(f"def big(a, b, c, d, e, f, g):\n{body}\n")
    assert _too_long_or_wide({"big": f}) == (["big.big"], ["big.big (7)"])


def test_every_package_docstring_names_its_modules():
    """An __init__ docstring is the package's map: one line per module (or subpackage)."""
    missing = []
    for init in sorted(PKG.rglob("__init__.py")):
        pkg = init.parent
        if pkg == PKG:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        parts = [p.name for p in pkg.glob("*.py") if p.name != "__init__.py"]
        parts += [p.name + "/" for p in pkg.iterdir() if (p / "__init__.py").is_file()]
        missing += [
            f"{pkg.relative_to(SRC)}: {p}"
            for p in sorted(parts)
            if not re.search(rf"(?<![\w/]){re.escape(p.removesuffix('.py').rstrip('/'))}\b", doc)
        ]
    assert missing == []
