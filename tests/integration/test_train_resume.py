"""`train --restarts` on a shared-home lab, as HPC clusters have it (issue 47): a user's script
in the shape of pytorch/examples' DDP tutorial (scripts/resume/snapshot_ddp.py: snapshot.pt
beside itself, resumed when found) under torchrun, deepspeed and mpirun. A node made silent
mid-run (blackhole routes) is quarantined, the spare is provisioned, checked for parity and
joins, and the run finishes its epochs resumed from the snapshot the silent node's peers saw
(the log shows the resume, not a second start). Without a spare the job goes on with fewer
nodes (--min-nodes). A script that raises is not retried; Ctrl-C while a restart is under way
ends everything within 3 s. After each: nothing of any job running on any answering node.

Lab "trs" (10.188.0.0/16), 3 nodes, one home bind-mounted into each, holding the site's stack
(copied: its provision verifies rather than installs)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import ProvisionOptions, RunsOptions, TrainOptions
from nodeprep.ops.train import quarantine, rundir

from .conftest import ssh_argv

NAME, SUBNET = "trs", 188
ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "resume" / "snapshot_ddp.py"
EPOCHS = ["8", "1", "--sleep", "0.25"]  # 8 epochs, a snapshot after each, ~2 s an epoch


@pytest.fixture(scope="module")
def shared(tmp_path_factory, own_settings, site_copy):
    base = tmp_path_factory.mktemp("resume")
    settings = own_settings(base, lock_wait=60)
    labmod.down(NAME, settings, log=lambda m: None)
    info = labmod.up(
        3,
        NAME,
        settings,
        labmod.UpOptions(inventory_dir=base / "inv", subnet=SUBNET, shared_home=True),
        log=lambda m: None,
    )
    site_copy(info.nodes[0].home.resolve())
    code = api.provision(ProvisionOptions(inventory=str(info.inventory)), settings)
    assert code == 0
    yield info, settings
    labmod.down(NAME, settings, log=lambda m: None)


def _snapshot(info) -> Path:
    return info.nodes[0].home.resolve() / ".nodeprep" / "jobs" / "resume" / "snapshot.pt"


def _leftovers(info, settings, indexes=(0, 1, 2)) -> list[str]:
    """Processes of any nodeprep job alive on nodes INDEXES (zombies excluded)."""
    left = []
    for node in [info.nodes[i] for i in indexes]:
        r = subprocess.run(
            ssh_argv(
                info,
                node,
                settings,
                "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | "
                'grep -q ^PYTHON_NODEPREP_JOB= && [ "$(readlink $p/ns/net)" = '
                "\"$(readlink /proc/self/ns/net)\" ] && ! grep -q '^State:.*Z' $p/status "
                "&& tr '\\0' ' ' < $p/cmdline && echo; done; true",
            ),
            capture_output=True,
            text=True,
            timeout=30,
        )
        left += [f"{node.name}: {ln}" for ln in r.stdout.splitlines() if ln.strip()]
    return left


@pytest.fixture
def fresh(shared):
    """Each test from no snapshot, every node answering and released; after it, the silent node
    healed, the runs' processes there stopped, nothing of any job left anywhere."""
    info, settings = shared
    _snapshot(info).unlink(missing_ok=True)
    quarantine.release(settings.state, ["*"])
    before = set(rundir.runs_of(settings.runs))
    yield info, settings
    for i in range(len(info.nodes)):
        labmod.silence_node(info, i, silent=False)
    quarantine.release(settings.state, ["*"])
    for run in [r for r in rundir.runs_of(settings.runs) if r not in before]:
        api.train_stop(RunsOptions(run=run.name[len(rundir.PREFIX) :]), settings)
    assert _leftovers(info, settings) == []


def _opts(info, launcher: str, limit: str, args, **kw) -> TrainOptions:
    return TrainOptions(
        inventory=str(info.inventory),
        limit=limit,
        launcher=launcher,
        payload=str(SCRIPT),
        args=tuple(args),
        timeout=240,
        **kw,
    )


def _epoch_done(settings, before: set, node: str) -> bool:
    runs = [r for r in rundir.runs_of(settings.runs) if r not in before]
    return bool(runs) and any(
        " epoch 0 done" in p.read_text() for p in (runs[-1] / "nodes" / node).glob("r*.out")
    )


def _silenced_mid_run(info, settings, capfd, index: int, opts: TrainOptions):
    """Train OPTS; once a rank on node INDEX has finished an epoch, that node goes silent.
    (exit code, the output, the runs this made, in order)."""
    before = set(rundir.runs_of(settings.runs))
    got = {}
    t = threading.Thread(target=lambda: got.update(code=api.train(opts, settings)))
    t.start()
    deadline = time.monotonic() + 120
    node = info.nodes[index].name
    while time.monotonic() < deadline and not _epoch_done(settings, before, node):
        time.sleep(0.3)
    labmod.silence_node(info, index)
    t.join(400)
    out = capfd.readouterr()
    return (
        got.get("code"),
        out.out + out.err,
        [r for r in rundir.runs_of(settings.runs) if r not in before],
    )


def _resumed_not_restarted(text: str) -> None:
    """One start from nothing (the first attempt), every rank of the relaunch resumed from a
    snapshot saved by the first, and the job's epochs finished."""
    assert text.count("[rank 0] no snapshot.pt: starting at epoch 0") == 1, text
    resumed = re.findall(r"\[rank (\d)\] resuming from snapshot.pt at epoch (\d)", text)
    assert sorted(r for r, _ in resumed) == ["0", "1"] and int(resumed[0][1]) >= 1, text
    assert re.search(r"\[rank 1\] local 0 epoch 7 done \(restart 1\)", text), text
    assert "snapshot_ddp: done 8 epochs" in text, text


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "mpirun"])
def test_a_spare_takes_the_silent_nodes_place_and_the_run_resumes_from_the_snapshot(
    fresh, capfd, launcher, tmp_path
):
    info, settings = fresh
    png = tmp_path / "timeline.png"  # the job's timeline, drawn at its end
    opts = _opts(
        info, launcher, "worker-[0-1]", EPOCHS, restarts=1, spares="worker-2", png=str(png)
    )
    code, text, runs = _silenced_mid_run(info, settings, capfd, 1, opts)
    assert code == 0, text
    assert "quarantined worker-1; spare worker-2 provisioned in " in text, text
    assert "parity OK; relaunching on worker-0, worker-2" in text, text
    assert "left the job and its home is its own" not in text  # one home: no warning
    _resumed_not_restarted(text)
    attempts = json.loads((runs[-1] / "attempts.json").read_text())
    assert [a["nodes"] for a in attempts] == [["worker-0", "worker-1"], ["worker-0", "worker-2"]]
    assert attempts[0]["cause"]["klass"] == "node" and attempts[0]["cause"]["node"] == "worker-1"
    assert list(quarantine.load(settings.state)) == ["worker-1"]
    assert f"timeline: {png}" in text and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_a_spare_the_run_goes_on_with_fewer_nodes(fresh, capfd):
    info, settings = fresh
    opts = _opts(info, "torchrun", "worker-[0-2]", EPOCHS, restarts=1, min_nodes=2)
    code, text, runs = _silenced_mid_run(info, settings, capfd, 2, opts)
    assert code == 0, text
    assert "quarantined worker-2; relaunching on worker-0, worker-1" in text, text
    _resumed_not_restarted(text)
    assert json.loads((runs[-1] / "attempts.json").read_text())[-1]["nodes"] == [
        "worker-0",
        "worker-1",
    ]


def test_a_script_that_raises_is_not_retried(fresh, capfd):
    """RuntimeError at epoch 1 on every rank: one attempt, exit 1, the exception named in the
    class line, within seconds of the raise."""
    info, settings = fresh
    opts = _opts(info, "torchrun", "worker-[0-1]", [*EPOCHS, "--raise-at-epoch", "1"], restarts=2)
    t0 = time.monotonic()
    code = api.train(opts, settings)
    took = time.monotonic() - t0
    out = capfd.readouterr()
    text = out.out + out.err
    assert code == 1, text
    assert re.search(r"class: user \(the script's own error\): .*RuntimeError: bad batch", text)
    assert "no further attempt: user is not retried (--retry-on user retries it)" in text, text
    assert "attempt 2/" not in text and quarantine.load(settings.state) == {}
    assert took < 60, took


def _invoke_train(info, settings):
    """A real `invoke train` process with --restarts 2 --min-nodes 2 on worker-[0-2], worker-2
    silenced once an epoch is done; returns (the process, its lines so far) once it says it
    relaunches (the backoff, the relaunch's probe under way)."""
    env = dict(
        os.environ,
        INVOKE_NODEPREP_STATE_DIR=settings.state_dir,
        INVOKE_NODEPREP_LAB_ROOT=settings.lab_root,
        PYTHONUNBUFFERED="1",
    )
    argv = [str(ROOT / ".venv" / "bin" / "invoke"), "train", "--inventory", str(info.inventory)]
    argv += ["--limit", "worker-[0-2]", "--launcher", "torchrun", "--payload", str(SCRIPT)]
    argv += ["--restarts", "2", "--min-nodes", "2", "--", *EPOCHS]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(proc.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any(" epoch 0 done" in ln for ln in seen):
        time.sleep(0.2)
    labmod.silence_node(info, 2)
    while time.monotonic() < deadline + 60 and not any("attempt 2/3" in ln for ln in seen):
        time.sleep(0.1)
    assert any("attempt 2/3" in ln for ln in seen), "".join(seen)[-3000:]
    return proc, seen, reader


def test_ctrl_c_while_a_restart_is_under_way_ends_everything_within_3s(fresh):
    """SIGINT once the job has said it relaunches: exit 130 within 3 s, the attempts so far in
    the summary, nothing of either attempt left on the answering nodes."""
    info, settings = fresh
    proc, seen, reader = _invoke_train(info, settings)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    took = time.monotonic() - t0
    reader.join(5)
    text = "".join(seen)
    assert proc.returncode == 130 and took < 3, (took, text[-3000:])
    assert "interrupted (Ctrl-C)" in text, text[-3000:]
    assert _leftovers(info, settings, (0, 1)) == [], text[-3000:]  # the answering nodes


def test_train_stop_between_attempts_ends_the_loop(fresh):
    """`train.stop` of the first attempt's run once the job relaunches: the loop (this
    attached process) is told, and the job ends with no further attempt; nothing left."""
    info, settings = fresh
    before = set(rundir.runs_of(settings.runs))
    proc, seen, reader = _invoke_train(info, settings)
    first = [r for r in rundir.runs_of(settings.runs) if r not in before][0]
    assert api.train_stop(RunsOptions(run=first.name[len(rundir.PREFIX) :]), settings) == 0
    proc.wait(60)
    reader.join(5)
    text = "".join(seen)
    assert proc.returncode == 130, text[-3000:]
    assert "attempt 3/3" not in text and "snapshot_ddp: done" not in text, text[-3000:]
    assert rundir.loop_pid(first) is None
    assert _leftovers(info, settings, (0, 1)) == [], text[-3000:]


def test_a_detached_job_goes_on_after_a_lost_node(fresh):
    """--detach with --restarts: the first attempt prepared here, the detached supervisor runs
    it and then the restart loop; worker-1 silenced, the spare joins, the job finishes resumed.
    train.status of the first run lists both attempts; the loop's lines are in its log."""
    info, settings = fresh
    before = set(rundir.runs_of(settings.runs))
    opts = _opts(info, "deepspeed", "worker-[0-1]", EPOCHS, restarts=1, spares="worker-2")
    assert api.train(dataclasses.replace(opts, detach=True), settings) == 0
    first = [r for r in rundir.runs_of(settings.runs) if r not in before][0]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _epoch_done(settings, before, "worker-1"):
        time.sleep(0.3)
    labmod.silence_node(info, 1)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and (
        rundir.loop_pid(first) or not (first / "attempts.json").exists()
    ):
        time.sleep(1)
    log = (first / "supervisor.log").read_text()
    attempts = json.loads((first / "attempts.json").read_text())
    assert [a["nodes"] for a in attempts] == [["worker-0", "worker-1"], ["worker-0", "worker-2"]]
    assert attempts[0]["cause"]["node"] == "worker-1" and attempts[1]["cause"] is None, log
    assert "quarantined worker-1; spare worker-2 provisioned in " in log, log
    second = rundir.run_path(settings.runs, attempts[1]["job_id"])
    _resumed_not_restarted((first / "output.log").read_text() + (second / "output.log").read_text())
    st = api.train_status(RunsOptions(run=first.name[len(rundir.PREFIX) :], json=True), settings)
    assert st == 0
