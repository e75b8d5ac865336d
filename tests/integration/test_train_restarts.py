"""`train --restarts` on the lab (issue 47): a run that outlives a bad node. The builtin ddp
payload snapshots after every epoch on rank 0's node (worker-0, private homes) and resumes from
it, as pytorch/examples' DDP tutorial does. worker-2 is made silent mid-run (blackhole routes:
a power loss as the others see it): the attempt is classed `node`, worker-2 quarantined, and
the job relaunched on worker-0 and worker-1 (--min-nodes 2), which resume from the snapshot and
finish; with a spare (worker-2 for a job on worker-0 and worker-1) the spare is provisioned,
checked for parity and takes the silent node's place. A script's own error is not retried.
After each: the silent node healed and released, the first attempt's processes there stopped,
nothing of any job left on any node."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import RunsOptions, TrainOptions
from nodeprep.ops.train import quarantine, rundir

from .test_train_watch import leftovers

NODES = "worker-[0-2]"
EPOCHS = ["--epochs", "8", "--steps-per-epoch", "20", "--sleep-per-step", "0.1"]


def _train(lab, settings, launcher: str, args, limit=NODES, **kw) -> int:
    return api.train(
        TrainOptions(
            inventory=str(lab.inventory),
            limit=limit,
            launcher=launcher,
            payload="ddp",
            args=tuple(args) + ("--snapshot", f"r-{uuid.uuid4().hex[:8]}.pt"),
            timeout=240,
            **kw,
        ),
        settings,
    )


def _epoch_seen(settings, before: set, node: str) -> bool:
    """A rank on NODE of the newest run started after BEFORE has finished an epoch."""
    runs = [r for r in rundir.runs_of(settings.runs) if r not in before]
    if not runs:
        return False
    return any("epoch 1 " in p.read_text() for p in (runs[-1] / "nodes" / node).glob("r*.out"))


def _silenced_mid_run(lab, settings, capfd, index: int, launcher: str, limit=NODES, **kw):
    """Train (LAUNCHER, LIMIT, KW); once a rank on worker-INDEX has finished an epoch, that
    node goes silent. (exit code, the output, the runs this made, in order)."""
    before = set(rundir.runs_of(settings.runs))
    got = {}
    t = threading.Thread(
        target=lambda: got.update(code=_train(lab, settings, launcher, EPOCHS, limit, **kw))
    )
    t.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _epoch_seen(settings, before, f"worker-{index}"):
        time.sleep(0.3)
    labmod.silence_node(lab, index)
    t.join(400)
    out = capfd.readouterr()
    runs = [r for r in rundir.runs_of(settings.runs) if r not in before]
    return got.get("code"), out.out + out.err, runs


@pytest.fixture
def restore(lab, lab_settings, lab_up, lab_ssh):
    """After the test: every worker answering again, released, its job processes stopped."""
    yield
    labmod.silence_node(lab, 0, silent=False)
    labmod.silence_node(lab, 1, silent=False)
    labmod.silence_node(lab, 2, silent=False)
    lab_up()
    quarantine.release(lab_settings.state, ["*"])
    for run in rundir.runs_of(lab_settings.runs)[-3:]:
        api.train_stop(RunsOptions(run=run.name[len(rundir.PREFIX) :]), lab_settings)
    assert leftovers(lab_ssh, lab) == []


# torchrun and mpirun: test_train_resume.py, on a shared home
@pytest.mark.parametrize("launcher", ["deepspeed"])
def test_a_silent_node_is_quarantined_and_the_run_resumes_on_the_others(
    provisioned, lab, lab_settings, capfd, restore, launcher
):
    code, text, runs = _silenced_mid_run(
        lab, lab_settings, capfd, 2, launcher, restarts=1, min_nodes=2
    )
    assert code == 0, text
    assert "attempt 2/2" in text and "node on worker-2" in text, text
    assert "quarantined worker-2; relaunching on worker-0, worker-1" in text, text
    # the snapshot, not a second start, in a rank that was told it is the first relaunch
    assert re.search(r"rank 0 resumed from epoch \d+ step \d+ \(relaunch 1\)", text), text
    assert "ddp: done epochs=8" in text, text
    attempts = json.loads((runs[-1] / "attempts.json").read_text())
    assert [a["attempt"] for a in attempts] == [1, 2], attempts
    assert attempts[0]["cause"]["klass"] == "node" and attempts[1]["cause"] is None, attempts
    assert attempts[1]["nodes"] == ["worker-0", "worker-1"], attempts
    held = quarantine.load(lab_settings.state)
    assert list(held) == ["worker-2"] and "a node lost" in held["worker-2"]["reason"], held


def test_a_spare_is_provisioned_checked_and_takes_the_silent_nodes_place(
    provisioned, lab, lab_settings, capfd, restore
):
    """The job on worker-0 and worker-1, worker-2 its spare (--spares; never a first node):
    worker-1 goes silent, worker-2 is provisioned (nothing to change: the site has it) and
    holds parity with worker-0, and the job finishes on worker-0 and worker-2."""
    code, text, runs = _silenced_mid_run(
        lab,
        lab_settings,
        capfd,
        1,
        "deepspeed",
        "worker-[0-1]",
        restarts=1,
        spares="worker-2",
    )
    assert code == 0, text
    assert "quarantined worker-1; spare worker-2 provisioned in " in text, text
    assert "parity OK; relaunching on worker-0, worker-2" in text, text
    assert re.search(r"rank 1 resumed from epoch \d+ step \d+ \(relaunch 1\)", text), text
    assert "ddp: done epochs=8" in text, text
    first = json.loads((runs[0] / "job.json").read_text())
    assert first["nodes"] == ["worker-0", "worker-1"], first  # the spare was not a first node
    attempts = json.loads((runs[-1] / "attempts.json").read_text())
    assert list(attempts[0]["spares"]) == ["worker-2"], attempts
    assert attempts[1]["nodes"] == ["worker-0", "worker-2"] and attempts[1]["cause"] is None
    assert list(quarantine.load(lab_settings.state)) == ["worker-1"]


def test_rank_0s_node_lost_on_private_homes_is_said_and_the_run_starts_over(
    provisioned, lab, lab_settings, capfd, restore
):
    """The head (worker-0, rank 0's node, where the snapshot is) goes silent: the spare takes
    its place, the user is told before the relaunch that the snapshot stayed on worker-0, and
    the documented rule follows: the script runs from its start (no resume) and finishes."""
    code, text, _runs = _silenced_mid_run(
        lab, lab_settings, capfd, 0, "torchrun", "worker-[0-1]", restarts=1, spares="worker-2"
    )
    assert code == 0, text
    assert "node on worker-0" in text and "relaunching on worker-1, worker-2" in text, text
    warned = text.index("warning: worker-0, rank 0's node, left the job and its home is its own")
    assert warned < text.index("ddp: done epochs=8"), text
    assert "resumed from epoch" not in text, text


def test_a_used_up_budget_stops_the_job_with_every_attempts_reason(
    provisioned, lab, lab_settings, capfd, restore
):
    """--retry-on user with a rank failing at step 3, before the first snapshot: every attempt
    fails the same way, the third ends the budget of 2, and the summary gives all three; the
    script's own error blames no node."""
    code = _train(
        lab,
        lab_settings,
        "mpirun",
        EPOCHS + ["--fail-at-step", "3", "--fail-rank", "1"],
        "worker-[0-1]",
        restarts=2,
        retry_on=("user",),
    )
    out = capfd.readouterr()
    text = out.out + out.err
    assert code == 1, text
    assert "attempt 2/3" in text and "attempt 3/3" in text, text
    tried = re.findall(r"attempt (\d) \(job \S+\) on worker-0, worker-1: FAILED, user", text)
    assert tried == ["1", "2", "3"], text
    assert "no further attempt: the restart budget of 2 is used up (3 attempts)" in text, text
    assert quarantine.load(lab_settings.state) == {}


def test_the_scripts_own_error_is_not_retried(provisioned, lab, lab_settings, capfd, restore):
    """A rank that fails on purpose at step 3 (its own exit status 1): one attempt, exit 1
    within seconds, the reason given; no node quarantined."""
    t0 = time.monotonic()
    code = _train(
        lab,
        lab_settings,
        "torchrun",
        EPOCHS + ["--fail-at-step", "3", "--fail-rank", "1"],
        restarts=2,
    )
    took = time.monotonic() - t0
    out = capfd.readouterr()
    text = out.out + out.err
    assert code == 1, text
    assert "class: user (the script's own error)" in text, text
    assert "no further attempt: user is not retried (--retry-on user retries it)" in text, text
    assert "attempt 2/" not in text and quarantine.load(lab_settings.state) == {}
    assert took < 90, took
