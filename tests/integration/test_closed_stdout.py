"""The main job through the invoke program with nobody reading its stdout, against the lab:
facts, provision (a second run: nothing to change), verify-parity, train (the health payload),
train.status and train.logs. Each one's stdout is a pipe whose read end is closed before it
starts (every write gets EPIPE, the remote lines Fabric streams included) or, for train, read
for one line and then closed (`| head -1` while the job runs). Each must finish its work with
its own exit code and write no traceback (cli/__init__.py, cli/stdio.py)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from nodeprep.ops.train import rundir

ROOT = Path(__file__).resolve().parents[2]
INVOKE = str(Path(sys.executable).with_name("invoke"))
NODES = "worker-[0-1]"
BAD = ("Traceback", "Exception ignored", "BrokenPipeError")


def _env(settings) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("INVOKE_") and k != "PYTHONUNBUFFERED"
    }
    env.update(
        INVOKE_NODEPREP_STATE_DIR=settings.state_dir,
        INVOKE_NODEPREP_LAB_ROOT=settings.lab_root,
        INVOKE_NODEPREP_LOCK_WAIT=str(int(settings.lock_wait)),
        TERM="dumb",
    )
    return env


def closed(settings, *args, timeout=300) -> tuple[int, str]:
    """`invoke ARGS` with stdout into a pipe nobody reads: (exit code, stderr)."""
    r, w = os.pipe()
    os.close(r)
    try:
        p = subprocess.run(
            [INVOKE, *args],
            cwd=ROOT,
            env=_env(settings),
            stdout=w,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=timeout,
        )
    finally:
        os.close(w)
    assert not any(b in p.stderr for b in BAD), p.stderr
    return p.returncode, p.stderr


def head1(settings, *args, timeout=300) -> tuple[int, str, str]:
    """`invoke ARGS | head -1`: (exit code, the one line read, stderr)."""
    p = subprocess.Popen(
        [INVOKE, *args],
        cwd=ROOT,
        env=_env(settings),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    first = p.stdout.readline().decode()
    p.stdout.close()
    try:
        err = p.communicate(timeout=timeout)[1].decode()
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    assert not any(b in err for b in BAD), err
    return p.returncode, first, err


def latest_report(settings, task: str) -> dict:
    runs = [p for p in Path(settings.runs).glob(f"*-{task}-*") if (p / "report.json").exists()]
    return json.loads(
        max(runs, key=lambda p: p.stat().st_mtime).joinpath("report.json").read_text()
    )


def test_main_job_with_stdout_closed(provisioned, lab, lab_settings):
    inv = str(lab.inventory)
    code, err = closed(lab_settings, "facts", "-i", inv)
    assert code == 0, err
    assert latest_report(lab_settings, "facts")["unreachable"] == 0
    code, err = closed(lab_settings, "facts", "-i", inv, "--json")
    assert code == 0, err

    sets = [a for s in provisioned for a in ("--set", s)]
    code, err = closed(lab_settings, "provision", "-i", inv, *sets)
    assert code == 0, err
    rep = latest_report(lab_settings, "provision")
    assert (rep["changed"], rep["failed"], rep["unreachable"]) == (0, 0, 0), rep

    code, err = closed(lab_settings, "verify-parity", "-i", inv)
    assert code == 0, err
    code, err = closed(lab_settings, "verify-parity", "-i", inv, "--json")
    assert code == 0, err


def test_train_with_stdout_closed_runs_to_its_end(provisioned, lab, lab_settings):
    inv = str(lab.inventory)
    code, err = closed(
        lab_settings,
        "train",
        "-i",
        inv,
        "--limit",
        NODES,
        "--launcher",
        "deepspeed",
        "--payload",
        "health",
        "--timeout",
        "120",
    )
    assert code == 0, err
    run = rundir.runs_of(Path(lab_settings.runs))[-1]
    assert rundir.read_json(run / "state.json")["state"] == "finished", err
    logged = "".join(f.read_text(errors="replace") for f in rundir.log_files(run))
    assert "health: OK world_size=2" in logged  # the ranks' lines went to the run, not lost
    job = run.name[len(rundir.PREFIX) :]

    code, err = closed(lab_settings, "train.status", job)
    assert code == 0, err
    code, err = closed(lab_settings, "train.status", job, "--json")
    assert code == 0, err
    code, err = closed(lab_settings, "train.logs", job)
    assert code == 0, err
    code, first, err = head1(lab_settings, "train.logs", job)
    assert code == 0 and re.match(r"\[worker-\d", first), (first, err)


def test_train_reader_leaving_mid_run(provisioned, lab, lab_settings):
    """`invoke train ... | head -1`: the reader leaves after the first line, the job goes on."""
    code, first, err = head1(
        lab_settings,
        "train",
        "-i",
        str(lab.inventory),
        "--limit",
        NODES,
        "--launcher",
        "torchrun",
        "--payload",
        "health",
        "--timeout",
        "120",
    )
    assert code == 0 and first.strip(), (first, err)
    run = rundir.runs_of(Path(lab_settings.runs))[-1]
    assert rundir.read_json(run / "state.json")["state"] == "finished", err
