"""What every `invoke` pays before it does anything: tasks.py imports `nodeprep.cli` and
`commands/options.py` for `--list` and `--help` too, so those import only what every task
needs (cli/stdio.py's guard, errors, settings, the display, the options classes); each cli
entry point imports its command and renderers when it runs (docs/architecture.md). Importing
the commands at the top once cost every `invoke` a second of CPU (fabric, paramiko, the
engine, the inventory readers).

Each case runs in a fresh interpreter (sys.modules is the evidence) with this tree's src/ first
on sys.path, and Invoke's Program over tasks.py in that process, as the `invoke` script runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"

# loaded by `import tasks`, and so by every invoke: nothing else of nodeprep
STARTUP = {
    "nodeprep",
    "nodeprep.cli",
    "nodeprep.cli.display",  # rich only when a live table is drawn
    "nodeprep.cli.guard",  # every entry point's wrapper (the standard library only)
    "nodeprep.cli.staging",  # stage's entry point (imports its command when it runs)
    "nodeprep.cli.training",  # train's entry points (the modules here and the standard library)
    "nodeprep.cli.stdio",
    "nodeprep.commands",
    "nodeprep.commands.options",
    "nodeprep.engine",
    "nodeprep.engine.events",  # the Events callbacks the display implements
    "nodeprep.errors",
    "nodeprep.settings",
}
# what only a task that reaches nodes (or draws its live table) may load
HEAVY = ("fabric", "paramiko", "cryptography", "rich", "nodeprep.engine.session")

FIX = "import it in the cli entry point (or validate()) that uses it, not at a module's top"

CHILD = """
import json, sys
sys.path[:0] = [{src!r}, {root!r}]
{body}
import nodeprep
assert nodeprep.__file__.startswith({src!r}), nodeprep.__file__
print("\\nMODULES " + json.dumps(sorted(sys.modules)))
"""
RUN = """
from invoke import Program
Program().run(["invoke", "-r", {root!r}, *{argv!r}], exit=False)
"""


def modules_after(body: str) -> set[str]:
    """The modules loaded once BODY has run in a fresh interpreter."""
    code = CHILD.format(src=str(SRC), root=str(ROOT), body=body)
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0 and "\nMODULES " in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
    return set(json.loads(r.stdout.rsplit("\nMODULES ", 1)[1]))


def heavy(loaded: set[str]) -> list[str]:
    return sorted(m for m in loaded if m.split(".")[0] in HEAVY or m in HEAVY)


def test_import_tasks_loads_only_the_startup_modules():
    loaded = modules_after("import tasks")
    assert heavy(loaded) == [], FIX
    assert {m for m in loaded if m.split(".")[0] == "nodeprep"} == STARTUP, FIX


@pytest.mark.parametrize(
    "argv",
    [
        ["--list"],
        ["--help", "provision"],
        ["inventory", "-i", "tests/inventories/yaml_k3s.yml", "--list", "--json"],
        ["torch-plan", "--torch", "2.5.1", "--node", "a:cpu", "--json"],
    ],
    ids=" ".join,
)
def test_a_task_that_reaches_no_node_loads_no_ssh(argv):
    loaded = modules_after(RUN.format(root=str(ROOT), argv=argv))
    assert "tasks" in loaded
    assert heavy(loaded) == [], FIX


def test_the_check_sees_a_command_that_reaches_nodes():
    """Not vacuous: a command module that reaches nodes brings fabric and paramiko."""
    loaded = modules_after("import tasks\nfrom nodeprep.commands import facts")
    assert {"fabric", "paramiko", "nodeprep.engine.session"} <= set(heavy(loaded))
