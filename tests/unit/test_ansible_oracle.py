"""The oracle server (tests/ansible_oracle.py) is the reference ansible-inventory: a run forked
from it gives what a real `ansible-inventory` process gives, byte for byte (exit code, stdout,
stderr), in the same environment and working directory, for each kind of corpus entry and for a
working directory Ansible reads group_vars/ from; a run leaves its working directory and the
session's home as they were (nothing is cached between runs); a run past its time limit is
killed as subprocess.run kills one, and the next run runs.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests import ansible_oracle
from tests.unit.test_inventory_differential import (
    ANSIBLE_INVENTORY,
    CORPUS,
    RUN_ENV,
    TIMEOUT,
    is_script_output,
    output_script,
    require_ansible,
)

# entry -> whether Ansible reads it
KINDS = {
    "yaml_docs_basic.yml": True,
    "ini_docs_basic.ini": True,
    "dir_deepops": True,  # several sources, group_vars/; Ansible warns on stderr
    "script_host_calls.sh": True,  # an inventory script, asked --list and --host
    "script_output_groups.json": True,  # saved script output, printed by output_script
    "bad_ini_children_undefined_group.ini": False,
    "bad_script_output_children_loop.json": False,
}


@pytest.fixture(scope="module")
def session():
    """A session of this module's own, so its home holds this module's runs only."""
    require_ansible()
    s = ansible_oracle.Session(ANSIBLE_INVENTORY, RUN_ENV)
    yield s
    s.close()


def _argv(session: ansible_oracle.Session, entry: str) -> tuple[list[str], Path]:
    cwd = session.new_cwd()
    source = CORPUS / entry
    source = output_script(source, cwd) if is_script_output(entry) else source
    return [str(ANSIBLE_INVENTORY), "-i", str(source), "--list"], cwd


@pytest.fixture(scope="module", autouse=True)
def home_at_start(session) -> set[str]:
    """What the session's home holds once the server has started, before any run (the
    server's own controller temp directory among it)."""
    return set(os.listdir(session.home))


def _home_holds_no_more(session: ansible_oracle.Session, at_start: set[str]) -> None:
    """Nothing in Ansible's home but what it held at start and the runs' own directories."""
    now = set(os.listdir(session.home)) - at_start
    stray = sorted(p for p in now if not p.startswith(("out-", "cwd-")))
    assert not stray, f"the runs left these in Ansible's home {session.home}: {stray}"


def _forked_and_real(session, argv: list[str], cwd: Path) -> ansible_oracle.Result:
    """The forked run of ARGV in CWD, once it is found equal to the real one."""
    forked = session.oracle.run(argv, cwd, TIMEOUT)
    real = subprocess.run(
        argv,
        cwd=cwd,
        env=session.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=TIMEOUT,
    )
    said = f"$ {' '.join(argv)}\n--- real stderr ---\n{real.stderr.decode(errors='replace')}"
    assert forked.rc == real.returncode, said
    assert forked.stderr == real.stderr, said
    assert forked.stdout == real.stdout, said
    return forked


@pytest.mark.slow(reason="one real ansible-inventory process per entry")
@pytest.mark.parametrize("entry", KINDS)
def test_a_forked_run_is_a_real_run(session, home_at_start, entry):
    argv, cwd = _argv(session, entry)
    before = sorted(os.listdir(cwd))
    forked = _forked_and_real(session, argv, cwd)
    assert (forked.rc == 0) is KINDS[entry], forked
    assert sorted(os.listdir(cwd)) == before
    _home_holds_no_more(session, home_at_start)


@pytest.mark.slow(reason="one real ansible-inventory process")
def test_a_forked_run_reads_its_own_working_directory(session):
    """Ansible reads group_vars/ from its working directory too: the child's is the request's."""
    argv, cwd = _argv(session, "ini_docs_basic.ini")
    (cwd / "group_vars").mkdir()
    (cwd / "group_vars" / "all.yml").write_text("from_the_working_directory: 1\n")
    forked = _forked_and_real(session, argv, cwd)
    assert forked.rc == 0 and b"from_the_working_directory" in forked.stdout, forked


@pytest.mark.slow(reason="starts the oracle server (imports Ansible)")
def test_a_run_past_its_time_is_killed_and_the_next_one_runs(session):
    argv, cwd = _argv(session, "ini_docs_basic.ini")
    sleeper = cwd / "sleeper.sh"
    sleeper.write_text("#!/bin/sh\nexec sleep 5\n")
    sleeper.chmod(0o755)
    with pytest.raises(subprocess.TimeoutExpired):
        session.oracle.run([argv[0], "-i", str(sleeper), "--list"], cwd, 1)
    after = session.oracle.run(argv, cwd, TIMEOUT)
    assert after.rc == 0 and b"one.example.com" in after.stdout, after
