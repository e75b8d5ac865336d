"""Every task answers `invoke TASK --help` (and `invoke --help TASK`) with its help and exit 0,
tested over what `invoke --list` lists: Invoke takes a `--help` that follows a task with a
positional argument as that argument's value (`torch-plan --help` once answered "--torch:
expected a release like 2.5.1, got '--help'"). `invoke --list` shows each task's first
docstring line: a whole sentence (it once cut "TCP bandwidth ... where every node sends and");
no task has a short flag `-` (`--, --kill-stale` beside the `--` before train's payload
arguments) or `-h` (`TASK -h` is help)."""

from __future__ import annotations

import re
import subprocess

import pytest
from invoke import Program

from tests.unit.test_closed_stdout import INVOKE, ROOT, listed_tasks

TASKS = listed_tasks()


def run_invoke(capsys, *argv: str) -> tuple[Program, str]:
    """Invoke's own Program over tasks.py, in this process: (the program, what it printed)."""
    program = Program()
    program.run([INVOKE, "-r", str(ROOT), *argv], exit=False)
    return program, capsys.readouterr().out


def summaries(listing: str) -> dict[str, str]:
    """`invoke --list`'s text -> {task: its summary, wrapped lines joined}."""
    out: dict[str, str] = {}
    name = None
    for line in listing.splitlines():
        m = re.match(r"  (\S+)(?: \(\S+\))?\s{2,}(\S.*)$", line)
        if m:
            name, out[m.group(1)] = m.group(1), m.group(2)
        elif name and line.startswith("    ") and line.strip():
            out[name] += " " + line.strip()
    return out


def test_every_task_is_listed_with_a_whole_sentence(capsys):
    """The summary is the docstring's whole first paragraph (one line: Invoke lists only the
    first), a sentence that ends with a period."""
    program, listing = run_invoke(capsys, "--list")
    listed = summaries(listing)
    assert sorted(listed) == sorted(t.split(" ")[0] for t in TASKS)
    bad = []
    for name, summary in sorted(listed.items()):
        first = " ".join(program.collection[name].__doc__.strip().split("\n\n")[0].split())
        if summary != first or not summary.endswith("."):
            bad.append(f"{name}: lists {summary!r}; its docstring's first paragraph: {first!r}")
    assert bad == [], "\n".join(bad)


def test_no_task_has_a_short_flag_that_reads_as_the_separator_or_help(capsys):
    """The flags Invoke's parser takes for each task: no `--` as a short flag (the `-` a dashed
    name gave `--kill-stale`) and no `-h`; `invoke --help TASK` shows neither."""
    program, _ = run_invoke(capsys, "--list")
    contexts = program.parser.contexts
    assert len(contexts) >= 15
    for name, context in contexts.items():
        confusing = {"--", "-", "-h"} & {*context.flags.keys(), *context.flags.aliases.keys()}
        assert not confusing, f"{name} has the flag(s) {sorted(confusing)}"
        _, shown = run_invoke(capsys, "--help", name)
        options = shown.split("Options:", 1)[-1]
        assert not re.search(r"^\s+(--[=,\s]|-h[\s,])", options, re.M), shown


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("where", ["after", "before"])
def test_every_task_answers_help(task, where):
    name = task.split(" ")[0]
    argv = [INVOKE, name, "--help"] if where == "after" else [INVOKE, "--help", name]
    r = subprocess.run(
        argv, cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"Usage: inv[oke] [--core-opts] {name} "), r.stdout[:300]
    assert "error:" not in r.stdout + r.stderr and "Traceback" not in r.stderr
