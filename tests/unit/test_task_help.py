"""Every task answers `invoke TASK --help` (and `invoke --help TASK`) with its help and exit 0,
tested over what `invoke --list` lists: Invoke takes a `--help` that follows a task with a
positional argument as that argument's value (`torch-plan --help` once answered "--torch:
expected a release like 2.5.1, got '--help'")."""
from __future__ import annotations

import subprocess

import pytest

from tests.unit.test_closed_stdout import INVOKE, ROOT, listed_tasks

TASKS = listed_tasks()


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("where", ["after", "before"])
def test_every_task_answers_help(task, where):
    name = task.split(" ")[0]
    argv = [INVOKE, name, "--help"] if where == "after" else [INVOKE, "--help", name]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"Usage: inv[oke] [--core-opts] {name} "), r.stdout[:300]
    assert "error:" not in r.stdout + r.stderr and "Traceback" not in r.stderr
