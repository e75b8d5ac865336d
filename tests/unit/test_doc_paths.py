"""Every module path the prose names exists: a docstring, a comment or a page that still names
a module by the path it had before it moved (to `engine/transports/`, to a package of `ops/`)
is a wrong map (issue 43).

Read: README.md, docs/*.md, roles/*/README.md, tests/**/README.md, and the docstrings and
comments (not the code) of every .py under src/, roles/, tests/, bench/ and tasks.py. A path
counts when it starts with one of the repo's own folders (PREFIXES) right after a space, a
quote or a bracket: `~/.nodeprep/venv`, `/etc/ssh/...`, `<venv>/bin` and URLs are paths
elsewhere and never start that way. It resolves against the package (src/nodeprep) or one of
its packages, the repo root, src/ or roles/, as written, as a .py module or as a package folder;
`engine/remote.stamp_from_list` and `nodeprep.ops.health.gpu` are read as a module and the names
in it. Not paths here: placeholders (`<name>`, `NAME`, `*`), what runs write in git-ignored
folders (`bench/results/`, `inventory/local/`) and a user's own inventory
(`inventory/mycluster/hosts.yml`)."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "nodeprep"
PACKAGES = sorted(init.parent for init in PKG.rglob("__init__.py"))
BASES = (PKG, ROOT, ROOT / "src", ROOT / "roles", *PACKAGES)
PREFIXES = (
    "engine",
    "ops",
    "commands",
    "cli",
    "inventory",
    "lab",
    "nodeside",
    "nodeprep",
    "roles",
    "tests",
    "docs",
    "bench",
    "requirements",
)
# and the package's inner packages, written from their parent (`payloads/health.py`,
# `verify/checks`, `train/payload`); not ssh: `ssh/config` is a dotfile's path in prose
PREFIXES += tuple(sorted({p.name for p in PACKAGES} - set(PREFIXES) - {"ssh"}))
_HEAD = r"(?<![\w./~$@:<>{}-])"
SLASHED = re.compile(_HEAD + r"((?:%s)/[\w./<>*{}-]*[\w>*}])" % "|".join(PREFIXES))
MODULES = (
    "engine",
    "ops",
    "commands",
    "cli",
    "inventory",
    "lab",
    "nodeside",
    "errors",
    "settings",
    "redact",
)
# nodeprep.width and the like are invoke.yaml's settings, not modules
DOTTED = re.compile(_HEAD + r"(nodeprep\.(?:%s)\b(?:\.\w+)*)" % "|".join(MODULES))
PLACEHOLDER = re.compile(r"[<>*{}]|(?:^|/)[A-Z][A-Z_]*(?:/|$)")
IGNORED = tuple(
    line.strip()
    for line in (ROOT / ".gitignore").read_text().splitlines()
    if "/" in line.strip().rstrip("/")
)
USER_INVENTORY = re.compile(r"inventory/[\w-]+/hosts\.yml")
PAGES = ["README.md", "docs/*.md", "roles/*/README.md", "tests/**/README.md"]
SOURCES = ["src/**/*.py", "roles/**/*.py", "tests/**/*.py", "bench/**/*.py", "tasks.py"]


def _statements(body: list):
    """Every statement, nested ones included (a string statement is prose: a docstring or
    a comment written as a string); expressions are not walked (ast.walk took seconds)."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from _statements(getattr(node, field, None) or [])


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of PATH's docstrings and comments; a page is prose throughout."""
    text = path.read_text()
    if path.suffix != ".py":
        return list(enumerate(text.splitlines(), 1))
    out = []
    # tokenize is slow (~20 ms a file): only where the text after a `#` names a path
    if any(
        SLASHED.search(line, line.find("#")) or DOTTED.search(line, line.find("#"))
        for line in text.splitlines()
        if "#" in line
    ):
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string))
    for node in _statements(ast.parse(text).body):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            lines = node.value.value.splitlines()
            out += [(node.lineno + i, line) for i, line in enumerate(lines)]
    return out


def _exists(rel: str) -> bool:
    rel = rel.rstrip("/")
    return any((base / rel).exists() or (base / (rel + ".py")).exists() for base in BASES)


def _module(rel: str) -> bool:
    return any((base / (rel + ".py")).is_file() for base in BASES)


def resolves(ref: str) -> bool:
    """REF (a/b/c, a/b.py, a/b.name.attr, nodeprep.a.b.name) is a file, a module or a package,
    or a module followed by names in it."""
    if DOTTED.fullmatch(ref):
        parts = ref.split(".")[1:]
        return _exists("/".join(parts)) or any(
            _module("/".join(parts[:n])) for n in range(1, len(parts))
        )
    if _exists(ref):
        return True
    head, _, tail = ref.rpartition("/")
    names = tail.split(".")
    return any(_module(f"{head}/{'.'.join(names[:n])}") for n in range(1, len(names)))


def references(line: str) -> list[str]:
    refs = [m.group(1).rstrip(".") for m in SLASHED.finditer(line)]
    refs += [m.group(1).rstrip(".") for m in DOTTED.finditer(line)]
    return [
        r
        for r in refs
        if not PLACEHOLDER.search(r)
        and not USER_INVENTORY.fullmatch(r)
        and not (r + "/").startswith(IGNORED)
    ]


def _files() -> list[Path]:
    seen = {p for pattern in PAGES + SOURCES for p in ROOT.glob(pattern)}
    return sorted(p for p in seen if "__pycache__" not in p.parts)


def test_reference_forms():
    assert references("see `engine/remote.stamp_from_list` and ops/train/rankwatch.py.") == [
        "engine/remote.stamp_from_list",
        "ops/train/rankwatch.py",
    ]
    assert references("nodeprep.ops.health.gpu, roles/<name>/role.py, inventory/NAME") == [
        "nodeprep.ops.health.gpu"
    ]
    assert references("nodeprep.width, inventory/local/hosts.yml, bench/results/x.json") == []
    assert references("~/.nodeprep/venv /home/u/lab/x https://x.org/docs/env.html <v>/ops/x") == []
    assert resolves("engine/remote.stamp_from_list") and resolves("nodeprep.ops.health.gpu")
    assert resolves("ops/train") and resolves("roles/site.yml") and resolves("tests/unit")
    assert (
        resolves("payloads/health.py") and resolves("verify/checks") and resolves("train/payload")
    )
    assert not resolves("engine/slurmrun") and not resolves("nodeprep.ops.rankwatch")
    assert not resolves("payloads/watch.py")


def test_every_named_module_exists():
    stale = []
    for path in _files():
        for lineno, line in _prose(path):
            stale += [
                f"{path.relative_to(ROOT)}:{lineno}: {ref}"
                for ref in references(line)
                if not resolves(ref)
            ]
    assert not stale, "paths that name no file or module:\n" + "\n".join(stale)
