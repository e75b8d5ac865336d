"""Every task, run for real as `invoke ...` subprocesses, with a reader that goes away: no
traceback, no "Exception ignored ... BrokenPipeError", and the exit code the same command has
when its output is read (cli/__init__.py: the command goes on, its output discarded).

Each case runs five ways: read normally (the reference exit code and output); stdout a pipe
whose read end is already closed (every write gets EPIPE), block-buffered as a user's python
is and again with PYTHONUNBUFFERED=1; `| head -1` (one line read, then the pipe closed); and
stdout and stderr both into the closed pipe (`2>&1 | head`).

No lab is needed: nodes are 127.0.0.1 port 1 (refused at once), the state directory (runs,
known_hosts), lab root and HOME are temporary, and a finished training run is faked in the
runs directory for train.status/logs/stop. lab.up, lab.down, demo and test are only asked for
their --help: run for real they would start or tear down a lab (or the whole test suite).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INVOKE = str(Path(sys.executable).with_name("invoke"))
RUN_ID = "20260101-000000-abcd"
HOSTS_Q = ("q1", "q2", "q3")  # quarantined (not inventory hosts: train leaves nothing out)

HOSTS = """\
vars:
  user: nobody
hosts:
  n1: {address: 127.0.0.1, port: 1}
  n2: {address: 127.0.0.1, port: 1}
  n3: {address: 127.0.0.1, port: 1}
"""

# task (as `invoke --list` names it) -> argument lists; {inv}, {ctl}, {run}, {sshcfg} are filled in.
# A new task needs an entry here (test_every_listed_task_has_cases fails without one).
CASES: dict[str, list[list[str]]] = {
    "facts": [["-i", "{inv}"], ["-i", "{inv}", "--json"]],
    "init": [["--help"], ["x", "--from", "{inv}", "--dry-run"]],
    "inventory": [["-i", "{inv}"], ["-i", "{inv}", "--host", "n1"]],
    "health": [["-i", "{inv}"], ["--list-checks"]],
    "doctor": [["-i", "{inv}", "--set", "controller_ssh_config={sshcfg}"], ["--list-checks"]],
    "ssh.prune": [["--config", "{sshcfg}", "--dry-run"]],
    "bandwidth": [["-i", "{inv}", "--seconds", "0.2"], ["--help"]],
    "provision": [  # --check changes nothing; controller key and ssh config would go to tmp
        [
            "-i",
            "{inv}",
            "--check",
            "--set",
            "controller_key={ctl}/id",
            "--set",
            "controller_ssh_config={ctl}/config",
        ],
        [
            "-i",
            "{inv}",
            "--check",
            "--json",
            "--set",
            "controller_key={ctl}/id",
            "--set",
            "controller_ssh_config={ctl}/config",
        ],
    ],
    "verify-parity": [["-i", "{inv}"], ["-i", "{inv}", "--json"]],
    "stage": [["-i", "{inv}", "{inv}", "/tmp/x"], ["-i", "{inv}", "{inv}", "/tmp/x", "--json"]],
    "torch-plan": [
        ["--torch", "2.5.1", "--node", "a:driver=535.104.05,gpus=8x8.0", "--node", "b:cpu"],
        ["--torch", "2.5.1", "--node", "a:cpu", "--json"],
    ],
    "train.run": [["--help"], ["-i", "{inv}", "--timeout", "5"]],
    "train.status": [["{run}"], ["nope"]],
    "train.logs": [["{run}"], ["{run}", "--follow"]],
    "train.stop": [["{run}"]],
    "train.release": [[]],
    "hosts.forget": [["n[1-3]", "-i", "{inv}"]],
    "lab.status": [[], ["--help"]],
    "lab.up": [["--help"]],  # never for real: it starts a lab
    "lab.down": [["--help"]],  # never for real: it tears a lab down
    "demo": [["--help"]],  # never for real: lab.up and the whole main job
    "test": [["--help"]],  # never for real: the test suite itself
}
# Invoke's own output after tasks.py is loaded (`invoke --help` and `--version` alone print
# before tasks.py is read: Invoke's, not nodeprep's)
INVOKE_OWN = [["--list"]]
# the first case of these also runs unbuffered and with stderr closed too (fewer processes)
THOROUGH = {"facts", "provision", "verify-parity", "train.logs", "torch-plan", ""}

BAD = ("Traceback", "Exception ignored", "BrokenPipeError")


def listed_tasks() -> list[str]:
    out = subprocess.run(
        [INVOKE, "--list"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    # "  name   help" (help lines that wrap are indented further); "train.run (train)"
    return [m.group(1) for m in re.finditer(r"^  (\S+)", out, re.M)]


def test_every_listed_task_has_cases():
    tasks = listed_tasks()
    assert len(tasks) >= 15, tasks
    assert sorted(set(tasks) - set(CASES)) == [], "add the new task to CASES"
    assert sorted(set(CASES) - set(tasks)) == [], "CASES names a task that is gone"


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    base = tmp_path_factory.mktemp("closed")
    (base / "hosts.yml").write_text(HOSTS)
    run = base / "state" / "runs" / f"train-{RUN_ID}"
    (run / "nodes" / "n1").mkdir(parents=True)
    (run / "job.json").write_text(
        json.dumps(
            {
                "job_id": RUN_ID,
                "inventory": str(base / "hosts.yml"),
                "limit": None,
                "nodes": ["n1", "n2"],
                "launcher": "torchrun",
                "where": "n[1-2]",
            }
        )
    )
    (run / "state.json").write_text(
        json.dumps(
            {
                "state": "finished",
                "started": 1.0,
                "updated": 2.0,
                "pid": None,
                "nodes": {"n1": {"alive": 0, "ranks": 1, "last": "done"}},
            }
        )
    )
    (run / "nodes" / "n1" / "r0.log").write_text("".join(f"step {i}\n" for i in range(3000)))
    (base / "state" / "quarantine.json").write_text(  # train.release lists them
        json.dumps({"nodes": {n: {"reason": "test", "since": 1.0, "job": RUN_ID} for n in HOSTS_Q}})
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("INVOKE_") and k != "PYTHONUNBUFFERED"
    }
    env.update(
        HOME=str(base / "home"),
        TERM="dumb",
        INVOKE_NODEPREP_STATE_DIR=str(base / "state"),
        INVOKE_NODEPREP_LAB_ROOT=str(base / "labs"),
        INVOKE_NODEPREP_CONNECT_TIMEOUT="3",
        INVOKE_NODEPREP_CONNECT_RETRIES="0",
    )
    (base / "home").mkdir()
    (base / "sshcfg").write_text(  # three blocks of inventories that are gone: ssh.prune's lines
        "".join(
            f"# BEGIN nodeprep hosts gone{i} (managed: edits inside this block are replaced)\n"
            f"Host g{i}\n"
            f"    HostName 192.0.2.{i}\n# END nodeprep hosts gone{i}\n"
            for i in range(3)
        )
    )
    fill = {
        "{inv}": str(base / "hosts.yml"),
        "{ctl}": str(base / "ctl"),
        "{run}": RUN_ID,
        "{sshcfg}": str(base / "sshcfg"),
    }
    return env, fill


def _argv(task: str, args: list[str], fill: dict) -> list[str]:
    out = []
    for a in args:
        for k, v in fill.items():
            a = a.replace(k, v)
        out.append(a)
    return [INVOKE] + ([task] if task else []) + out


def _normal(argv, env):
    p = subprocess.run(
        argv,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    return p.returncode, p.stdout, p.stderr


def _closed(argv, env, both=False):
    """stdout (and with BOTH stderr too) a pipe nobody reads from: every write gets EPIPE."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(
            argv,
            cwd=ROOT,
            env=env,
            stdout=w,
            stderr=w if both else subprocess.PIPE,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    finally:
        os.close(w)
    return p.returncode, "", p.stderr or ""


def _head1(argv, env):
    """`| head -1`: read one line, then close the pipe while the command may still write."""
    p = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    first = p.stdout.readline()
    p.stdout.close()
    try:
        err = p.communicate(timeout=120)[1]
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    return p.returncode, first.decode(), err.decode()


def _all_ways(argv, env, thorough: bool):
    ways = {
        "normal": _normal(argv, env),
        "closed": _closed(argv, env),
        "head -1": _head1(argv, env),
    }
    if thorough:
        ways["closed, unbuffered"] = _closed(argv, dict(env, PYTHONUNBUFFERED="1"))
        ways["closed stdout and stderr"] = _closed(argv, env, both=True)
    return ways


def _check(name: str, ways: dict) -> list[str]:
    problems = []
    rc = ways["normal"][0]
    if any(b in ways["normal"][2] for b in BAD):
        problems.append(f"{name}: traceback even when read normally:\n{ways['normal'][2]}")
    for way, (code, _out, err) in ways.items():
        if any(b in err for b in BAD):
            problems.append(f"{name} [{way}]: traceback on stderr:\n{err[-2000:]}")
        if code != rc:
            problems.append(f"{name} [{way}]: exit {code}, read normally {rc}\n{err[-1000:]}")
    return problems


@pytest.mark.slow(reason="starts every task's cases as processes, each in several ways (~60 s)")
def test_every_task_survives_a_closed_stdout(sandbox):
    env, fill = sandbox
    jobs = [
        (" ".join([task] + args).strip(), _argv(task, args, fill), task in THOROUGH and i == 0)
        for task, cases in [*CASES.items(), ("", INVOKE_OWN)]
        for i, args in enumerate(cases)
    ]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        ways = pool.map(lambda job: _all_ways(job[1], env, job[2]), jobs)
        results = dict(zip([job[0] for job in jobs], ways))
    problems = [p for name, ways in results.items() for p in _check(name, ways)]
    assert problems == [], "\n\n".join(problems)
    # each task writes several lines to stdout in at least one of its cases (else the closed
    # pipe proves nothing for it)
    lines = {
        t: max(len(results[" ".join([t] + a)]["normal"][1].splitlines()) for a in cases)
        for t, cases in CASES.items()
    }
    assert [t for t, n in lines.items() if n < 3] == [], lines
    # the faked run's 3000 lines are more than a pipe holds: `head -1` leaves mid-stream
    assert results["train.logs {run}"]["head -1"][1] == "[n1 r0] step 0\n"


@pytest.mark.slow(reason="checks what the tasks above left behind: meaningful only after them")
def test_nothing_outside_the_sandbox_changed(sandbox):
    """provision --check wrote no controller key or ssh config (they would be under ctl/)."""
    env, fill = sandbox
    assert not Path(fill["{ctl}"]).exists()
    assert (
        Path(fill["{sshcfg}"]).read_text().count("# BEGIN nodeprep hosts gone") == 3
    )  # prune --dry-run


def test_live_display_on_a_terminal_with_stdout_closed(sandbox):
    """facts --json: rich's live table on stderr (a terminal), the JSON into a closed pipe."""
    import pty

    env, fill = sandbox
    argv = _argv("facts", ["-i", "{inv}", "--json"], fill)
    rc = _normal(argv, env)[0]
    master, slave = pty.openpty()
    r, w = os.pipe()
    os.close(r)
    p = subprocess.Popen(
        argv,
        cwd=ROOT,
        env=dict(env, TERM="xterm"),
        stdout=w,
        stderr=slave,
        stdin=subprocess.DEVNULL,
    )
    os.close(slave)
    os.close(w)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert p.wait(timeout=120) == rc
    text = seen.decode(errors="replace")
    assert "\x1b[" in text and "unreachable" in text, text  # the live table was drawn
    assert not any(b in text for b in BAD), text
