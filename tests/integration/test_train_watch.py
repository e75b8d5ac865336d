"""The rank watch on the lab, for every launcher: a rank that exits 1 with no collective after
it, a rank killed with SIGKILL, a node that stops, a rank that hangs. Every case: exit 1, the
summary's first line names the right node and rank, nothing of the job left on any node.
Then detached runs (status, logs, stop from a second process), stale jobs, one prefix per line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import RunsOptions, TrainOptions
from nodeprep.ops.train import rundir

NODES = "worker-[0-1]"
LONG = ["--epochs", "100", "--steps-per-epoch", "40", "--sleep-per-step", "0.1"]
# (launcher, DeepSpeed's multinode launcher)
LAUNCHER_PAIRS = [
    ("deepspeed", "pdsh"),
    ("deepspeed", "openmpi"),
    ("torchrun", "pdsh"),
    ("mpirun", "pdsh"),
]
IDS = ["deepspeed-pdsh", "deepspeed-openmpi", "torchrun", "mpirun"]


def train(lab, settings, capfd, launcher, args, ds="pdsh", **kw):
    # a fresh snapshot each run: ddp resumes from an existing one (past the step that fails)
    args = list(args) + ["--snapshot", f"w-{uuid.uuid4().hex[:8]}.pt"]
    t0 = time.monotonic()
    code = api.train(
        TrainOptions(
            inventory=str(lab.inventory),
            limit=NODES,
            launcher=launcher,
            payload="ddp",
            args=tuple(args),
            ds_launcher=ds,
            **{"timeout": 240, **kw},
        ),
        settings,
    )
    out = capfd.readouterr()
    return code, out.out + out.err, time.monotonic() - t0


def summary(out: str) -> str:
    """The summary's first line."""
    return next(ln for ln in out.splitlines() if ln.startswith("train: job "))


def leftovers(lab_ssh, lab) -> list[str]:
    """Processes of any nodeprep job alive on the nodes (zombies excluded)."""
    left = []
    for node in lab.nodes[:2]:
        r = lab_ssh(
            node,
            "for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | "
            'grep -q ^PYTHON_NODEPREP_JOB= && [ "$(readlink $p/ns/net)" = '
            "\"$(readlink /proc/self/ns/net)\" ] && ! grep -q '^State:.*Z' $p/status "
            "&& tr '\\0' ' ' < $p/cmdline && echo; done; true",
        )
        left += [f"{node.name}: {ln}" for ln in r.stdout.splitlines() if ln.strip()]
    return left


def last_run(settings) -> Path:
    return rundir.runs_of(settings.runs)[-1]


@pytest.mark.parametrize("launcher,ds", LAUNCHER_PAIRS, ids=IDS)
def test_rank_exit_without_collective_stops_every_rank(
    provisioned, lab, lab_settings, lab_ssh, capfd, launcher, ds
):
    code, out, took = train(
        lab,
        lab_settings,
        capfd,
        launcher,
        LONG + ["--no-sync", "--fail-at-step", "3", "--fail-rank", "1"],
        ds,
    )
    assert code == 1, out
    assert summary(out).endswith("FAILED: worker-1 r1 exited with status 1"), out
    assert "rank 1 failing on purpose at step 3" in out  # its last lines
    assert "class: user (the script's own error)" in out, out
    assert "0 processes left on 2 node(s)" in out
    assert leftovers(lab_ssh, lab) == []
    gone = float(re.search(r"every rank gone ([\d.]+)s after", out).group(1))
    assert gone < 10, out
    exits = json.loads((last_run(lab_settings) / "exits.json").read_text())
    assert exits["worker-1 r1"]["how"] == "failed" and exits["worker-1 r1"]["rc"] == 1
    assert all(v["how"] in ("stopped", "failed") for v in exits.values())


@pytest.mark.parametrize("launcher,ds", LAUNCHER_PAIRS, ids=IDS)
def test_rank_killed_with_sigkill(provisioned, lab, lab_settings, lab_ssh, capfd, launcher, ds):
    code, out, _ = train(
        lab,
        lab_settings,
        capfd,
        launcher,
        LONG + ["--fail-at-step", "3", "--fail-rank", "1", "--fail-signal", "9"],
        ds,
    )
    assert code == 1, out
    assert summary(out).endswith("FAILED: worker-1 r1 was killed by SIGKILL"), out
    assert "class: killed (a rank killed by a signal, not by its script)" in out, out
    assert "0 processes left on 2 node(s)" in out and leftovers(lab_ssh, lab) == []


@pytest.mark.parametrize("launcher,ds", LAUNCHER_PAIRS, ids=IDS)
def test_hang_dumps_stacks_and_names_the_hung_rank(
    provisioned, lab, lab_settings, lab_ssh, capfd, launcher, ds
):
    code, out, took = train(
        lab,
        lab_settings,
        capfd,
        launcher,
        LONG + ["--hang-at-step", "4", "--fail-rank", "1"],
        ds,
        hang_timeout=10,
    )
    assert code == 1, out
    first = summary(out)
    assert (
        "FAILED: worker-1 r1" in first and "no rank wrote output or a heartbeat for 10s" in first
    ), out
    assert "class: hang (no progress for --hang-timeout)" in out, out
    assert "0 processes left on 2 node(s)" in out and leftovers(lab_ssh, lab) == []
    stack = (last_run(lab_settings) / "nodes" / "worker-1" / "r1.stack").read_text()
    assert "inject_fault" in stack and "ddp.py" in stack  # the hung rank's own frame
    assert (last_run(lab_settings) / "nodes" / "worker-0" / "r0.stack").read_text().strip()


def _lose_worker_1(lab, lab_settings, capfd, launcher, ds, lose, heal) -> tuple:
    """Train on worker-[0-1], LOSE(lab, 1) once rank 1 has written a line, HEAL(); returns
    (code, output, seconds from the loss to the end of the run, the run's directory)."""
    result = {}
    before = set(rundir.runs_of(lab_settings.runs))

    def go():
        result["r"] = train(lab, lab_settings, capfd, launcher, LONG, ds)

    t = threading.Thread(target=go)
    t.start()
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # this run's rank 1 has written a line
            runs = [r for r in rundir.runs_of(lab_settings.runs) if r not in before]
            if runs and (runs[-1] / "nodes" / "worker-1" / "r1.out").exists():
                break
            time.sleep(0.3)
        time.sleep(1)
        lose(lab, 1)
        lost = time.monotonic()
        t.join(120)
        ended = time.monotonic()
    finally:
        heal()
    code, out, _ = result["r"]
    return (
        code,
        out,
        ended - lost,
        [r for r in rundir.runs_of(lab_settings.runs) if r not in before][-1],
    )


@pytest.mark.parametrize("launcher,ds", LAUNCHER_PAIRS, ids=IDS)
def test_node_loss_stops_the_other_nodes(
    provisioned, lab, lab_settings, lab_ssh, capfd, lab_up, launcher, ds
):
    code, out, _took, _run = _lose_worker_1(
        lab, lab_settings, capfd, launcher, ds, labmod.stop_node, lab_up
    )
    assert code == 1, out
    assert "FAILED: worker-1 stopped answering" in summary(out), out
    assert "class: node on worker-1 (a node lost or unreachable)" in out, out
    assert leftovers(lab_ssh, lab) == []


def test_one_prefix_per_line_and_rank_filter(provisioned, lab, lab_settings, capfd):
    code, out, _ = train(
        lab, lab_settings, capfd, "deepspeed", ["--epochs", "1", "--steps-per-epoch", "2"]
    )
    assert code == 0, out
    lines = [ln for ln in out.splitlines() if ln.startswith("[")]
    assert any(ln.startswith("[worker-1 r1] rank 1 epoch 0") for ln in lines), out
    # never pdsh's `worker-1: ` after nodeprep's prefix
    assert not [ln for ln in lines if re.match(r"\[[^]]+\] worker-\d+: ", ln)], out
    code, out, _ = train(
        lab,
        lab_settings,
        capfd,
        "torchrun",
        ["--epochs", "1", "--steps-per-epoch", "2"],
        ranks=(0,),
    )
    assert code == 0 and "[worker-0 r0] rank 0 epoch 0" in out and " r1] " not in out, out
    logged = (last_run(lab_settings) / "nodes" / "worker-1" / "r1.out").read_text()
    assert "rank 1 epoch 0" in logged


def invoke(lab_settings, *args, timeout=120) -> subprocess.CompletedProcess:
    """A second shell: the tasks through the invoke program, with the test's settings."""
    env = {
        "INVOKE_NODEPREP_STATE_DIR": lab_settings.state_dir,
        "INVOKE_NODEPREP_LAB_ROOT": lab_settings.lab_root,
        "PATH": "/usr/bin:/bin",
        "HOME": str(Path.home()),
    }
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [str(Path(sys.executable).parent / "invoke"), *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_detached_run_survives_its_controller_and_is_stopped_from_another_shell(
    provisioned, lab, lab_settings, lab_ssh
):
    p = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "invoke"),
            "train",
            "--inventory",
            str(lab.inventory),
            "--limit",
            NODES,
            "--launcher",
            "torchrun",
            "--payload",
            "ddp",
            "--detach",
            "--",
            *LONG,
        ],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            "INVOKE_NODEPREP_STATE_DIR": lab_settings.state_dir,
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
        },
    )
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 0, out
    job = re.search(r"run id (\S+)", out).group(1)
    time.sleep(4)
    st = invoke(lab_settings, "train.status", job)
    assert st.returncode == 0 and f"run {job}: running" in st.stdout, st.stdout + st.stderr
    assert re.search(r"worker-1\s+ranks 1/1 alive", st.stdout), st.stdout
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = invoke(lab_settings, "train.logs", job, "--rank", "1")
        if "[worker-1 r1] rank 1 epoch 0 step 1" in logs.stdout:
            break
        time.sleep(2)
    assert "[worker-1 r1] rank 1 epoch 0 step 1" in logs.stdout, logs.stdout + logs.stderr
    assert "[worker-0 r0]" not in logs.stdout
    follow = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "invoke"),
            "train.logs",
            job,
            "-f",
            "--node",
            "worker-0",
        ],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            "INVOKE_NODEPREP_STATE_DIR": lab_settings.state_dir,
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
        },
    )
    time.sleep(3)
    assert follow.poll() is None, "train.logs -f must keep following a running job"
    stop = invoke(lab_settings, "train.stop", job)
    assert stop.returncode == 0 and "the supervisor stopped the job" in stop.stdout, (
        stop.stdout + stop.stderr
    )
    followed, _ = follow.communicate(timeout=30)  # -f ends with the run
    assert follow.returncode == 0 and "[worker-0 r0] rank 0 epoch 0 step 1" in followed, followed
    assert "[worker-1" not in followed
    st = invoke(lab_settings, "train.status", job)
    assert f"run {job}: stopped" in st.stdout and "processes now: 0" in st.stdout, st.stdout
    assert leftovers(lab_ssh, lab) == []


def test_a_job_whose_supervisor_died_runs_on_and_is_stopped_on_the_nodes(
    provisioned, lab, lab_settings, lab_ssh
):
    import os
    import signal

    p = subprocess.run(
        [
            str(Path(sys.executable).parent / "invoke"),
            "train",
            "--inventory",
            str(lab.inventory),
            "--limit",
            NODES,
            "--launcher",
            "deepspeed",
            "--payload",
            "ddp",
            "--detach",
            "--",
            *LONG,
            "--snapshot",
            f"w-{uuid.uuid4().hex[:8]}.pt",
        ],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "INVOKE_NODEPREP_STATE_DIR": lab_settings.state_dir,
            "PATH": "/usr/bin:/bin",
            "HOME": str(Path.home()),
        },
    )
    assert p.returncode == 0, p.stdout + p.stderr
    job = re.search(r"run id (\S+)", p.stderr + p.stdout).group(1)
    state = last_run(lab_settings) / "state.json"
    os.kill(json.loads(state.read_text())["pid"], signal.SIGKILL)  # the controller side is gone
    time.sleep(3)
    assert leftovers(lab_ssh, lab), "the job must not depend on its supervisor"
    st = invoke(lab_settings, "train.status", job)
    assert f"run {job}: orphaned" in st.stdout, st.stdout + st.stderr
    stop = invoke(lab_settings, "train.stop", job)
    assert stop.returncode == 0 and "stopped on the nodes" in stop.stdout, stop.stdout + stop.stderr
    assert leftovers(lab_ssh, lab) == []


def test_stale_job_refuses_the_launch_until_kill_stale(
    provisioned, lab, lab_settings, lab_ssh, capfd
):
    # a job that outlived its controller: ranks still running, no supervisor
    lab_ssh(1, "PYTHON_NODEPREP_JOB=old-job setsid sleep 300 < /dev/null > /dev/null 2>&1 &")
    code, out, _ = train(
        lab, lab_settings, capfd, "torchrun", ["--epochs", "1", "--steps-per-epoch", "1"]
    )
    assert code == 1 and "processes of an earlier job are still running" in out, out
    assert "worker-1: job old-job still runs" in out and "--kill-stale" in out
    code, out, _ = train(
        lab,
        lab_settings,
        capfd,
        "torchrun",
        ["--epochs", "1", "--steps-per-epoch", "1"],
        kill_stale=True,
    )
    assert code == 0 and "stopped earlier job old-job on worker-1" in out, out
    assert leftovers(lab_ssh, lab) == []


@pytest.mark.parametrize("launcher,ds", LAUNCHER_PAIRS, ids=IDS)
def test_a_silent_node_stops_the_other_nodes(
    provisioned, lab, lab_settings, lab_ssh, capfd, lab_up, launcher, ds
):
    """worker-1 goes silent (blackhole routes: no RST, no answer) in the middle of training:
    the rank watch names it within its deadline and every rank on the other nodes is stopped,
    without waiting for the launcher's own timeout; once it answers again, what the job left
    there is stopped by train.stop."""
    code, out, took, run = _lose_worker_1(
        lab,
        lab_settings,
        capfd,
        launcher,
        ds,
        labmod.silence_node,
        lambda: labmod.silence_node(lab, 1, silent=False),
    )
    assert code == 1, out
    assert "FAILED: worker-1 stopped answering" in summary(out), out
    assert took < 45, took  # not the launcher's own 240 s timeout
    assert "class: node on worker-1 (a node lost or unreachable)" in out, out
    state = json.loads((run / "state.json").read_text())
    assert state["outcome"]["cause"]["klass"] == "node", state["outcome"]
    api.train_stop(RunsOptions(run=run.name[len(rundir.PREFIX) :]), lab_settings)
    assert leftovers(lab_ssh, lab) == []
    lab_up()
