"""`train` on 2 lab nodes through real sshd, the real DeepSpeed runner with pdsh, torchrun and
Open MPI (gloo on CPU): payloads run to completion, a failing rank stops every rank on every
node, nothing is left running."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep.commands.options import TrainOptions

NODES = "worker-[0-1]"
JOB_DIR = ".nodeprep/jobs/payloads"


def train(lab, settings, capfd, launcher, payload, args=(), **kw):
    code = api.train(
        TrainOptions(
            inventory=str(lab.inventory),
            limit=NODES,
            launcher=launcher,
            payload=payload,
            args=tuple(args),
            **kw,
        ),
        settings,
    )
    out = capfd.readouterr()
    return code, out.out + out.err


def job_processes(lab_ssh, lab) -> list[str]:
    """Payload processes still alive on any node (zombies excluded)."""
    left = []
    for node in lab.nodes[:2]:
        r = lab_ssh(
            node,
            "ps -u nodeprep -o stat=,args= | awk '$1 !~ /^Z/' | grep -E "
            "'payloads/(ddp|health)|deepspeed|torch.distributed' | grep -v grep || true",
        )
        left += [f"{node.name}: {ln}" for ln in r.stdout.splitlines() if ln.strip()]
    return left


@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun", "mpirun"])
def test_health_reports_every_rank(provisioned, lab, lab_settings, lab_ssh, capfd, launcher):
    code, out = train(lab, lab_settings, capfd, launcher, "health", timeout=120)
    assert code == 0, out
    assert "health: OK world_size=2" in out
    for host in ("worker-0", "worker-1"):
        assert f"host={host}" in out
    assert job_processes(lab_ssh, lab) == []


@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun", "mpirun"])
def test_ddp_runs_to_completion_with_snapshot(provisioned, lab, lab_settings, capfd, launcher):
    snap = Path(lab.nodes[0].home) / JOB_DIR / f"snap-{launcher}.pt"
    snap.unlink(missing_ok=True)
    code, out = train(
        lab,
        lab_settings,
        capfd,
        launcher,
        "ddp",
        ["--epochs", "2", "--steps-per-epoch", "3", "--snapshot", snap.name],
        timeout=180,
    )
    assert code == 0, out
    assert "ddp: done epochs=2" in out and snap.exists()
    assert "rank 0 " in out and "rank 1 " in out


@pytest.mark.parametrize("launcher", ["deepspeed", "mpirun"])
def test_a_login_the_launcher_needs_is_refused_by_the_preflight(
    provisioned, lab, lab_settings, lab_ssh, capfd, launcher
):
    """worker-1 stops accepting the cluster key behind nodeprep's back: the preflight's mesh
    (run beside the master-port check) names head -> worker-1, and nothing is launched."""
    home1 = Path(lab.nodes[1].home)
    keys = home1 / ".ssh" / "authorized_keys"
    cluster = (home1 / ".ssh" / "nodeprep_cluster_ed25519.pub").read_text().split()[1]
    before = keys.read_bytes()
    keys.write_text("".join(ln for ln in before.decode().splitlines(True) if cluster not in ln))
    try:
        code, out = train(lab, lab_settings, capfd, launcher, "health", timeout=120)
    finally:
        keys.write_bytes(before)
    assert code == 1 and "preflight failed" in out, out
    assert "worker-0 -> worker-1: ssh fails" in out and "Traceback" not in out, out
    assert "health: OK" not in out and job_processes(lab_ssh, lab) == []


def test_failing_rank_stops_everything_fast(provisioned, lab, lab_settings, lab_ssh, capfd):
    t0 = time.monotonic()
    code, out = train(
        lab,
        lab_settings,
        capfd,
        "torchrun",
        "ddp",
        [
            "--epochs",
            "50",
            "--steps-per-epoch",
            "20",
            "--sleep-per-step",
            "0.2",
            "--fail-at-step",
            "5",
            "--fail-rank",
            "1",
            "--snapshot",
            "fail.pt",
        ],
        timeout=300,
    )
    assert code != 0
    assert time.monotonic() - t0 < 30 + 15  # within 30 s of the failure (plus start-up)
    assert "FAILED" in out and "last lines from" in out
    assert job_processes(lab_ssh, lab) == []


def test_timeout_stops_every_rank(provisioned, lab, lab_settings, lab_ssh, capfd):
    code, out = train(
        lab,
        lab_settings,
        capfd,
        "deepspeed",
        "ddp",
        [
            "--epochs",
            "100",
            "--steps-per-epoch",
            "50",
            "--sleep-per-step",
            "0.2",
            "--snapshot",
            "long.pt",
        ],
        timeout=25,
    )
    assert code != 0 and "--timeout 25s reached" in out
    assert job_processes(lab_ssh, lab) == []


def test_dry_run_and_srun_command(provisioned, lab, lab_settings, capfd):
    code, out = train(lab, lab_settings, capfd, "srun", "health", dry_run=True)
    assert code == 0
    assert "srun --nodes 2" in out and "PYTHON_NODEPREP_JOB=" in out
    code, out = train(lab, lab_settings, capfd, "srun", "health")
    # srun is installed (bootstrap) but this lab runs no Slurm: named, not a hang or a traceback
    assert code == 1 and (
        "Slurm is not usable from worker-0" in out or "srun not found on worker-0" in out
    )


@pytest.fixture
def slurm(provisioned, lab_up):
    """The lab with a real Slurm (slurmctld + munged on the host, slurmd in each node)."""
    from nodeprep.lab import slurm as lab_slurm

    if not lab_slurm.cgroup_controllers():  # runs here; a cgroup-v2-only host cannot host it
        pytest.skip(
            "this host mounts no cgroup v1 controllers: "
            "Slurm 22.05's slurmd cannot start in the lab"
        )
    lab_up(slurm=True)
    yield
    lab_up(slurm=False)


def test_srun_through_real_slurm(slurm, lab, lab_settings, lab_ssh, capfd):
    """srun allocates worker-[0-1] from slurmctld, slurmd starts one rank on each; then a
    failing rank ends the step on every node (--kill-on-bad-exit) and nothing is left."""
    code, out = train(lab, lab_settings, capfd, "srun", "health", timeout=120)
    assert code == 0, out
    assert "health: OK world_size=2" in out
    assert "host=worker-0" in out and "host=worker-1" in out
    # each line under its node and global rank (srun's block layout: task t on node t // per)
    assert (
        "[worker-0 r0] rank 0/2 host=worker-0" in out
        and "[worker-1 r1] rank 1/2 host=worker-1" in out
    )
    t0 = time.monotonic()
    code, out = train(
        lab,
        lab_settings,
        capfd,
        "srun",
        "ddp",
        [
            "--epochs",
            "50",
            "--steps-per-epoch",
            "20",
            "--sleep-per-step",
            "0.2",
            "--no-sync",
            "--fail-at-step",
            "5",
            "--fail-rank",
            "1",
            "--snapshot",
            f"srunfail-{time.time()}.pt",
        ],
        timeout=300,
    )
    assert code != 0, out
    assert time.monotonic() - t0 < 60, out
    # root cause first: the rank that failed (by the nodes' clocks), not srun's own report
    assert "FAILED: worker-1 r1 exited with status 1" in out, out
    assert "0 processes left on 2 node(s)" in out
    assert job_processes(lab_ssh, lab) == []


def test_bad_launcher_and_payload_are_input_errors(lab, lab_settings, capfd):
    code, out = train(lab, lab_settings, capfd, "ray", "health")
    assert code == 2 and "--launcher 'ray'" in out
    code, out = train(lab, lab_settings, capfd, "torchrun", "/no/such/script.py")
    assert code == 2 and "not a builtin" in out


def test_deepspeed_openmpi_launcher(provisioned, lab, lab_settings, lab_ssh, capfd):
    code, out = train(
        lab, lab_settings, capfd, "deepspeed", "health", ds_launcher="openmpi", timeout=120
    )
    assert code == 0, out
    assert "health: OK world_size=2" in out and "mpirun" in out
    for host in ("worker-0", "worker-1"):
        assert f"host={host}" in out
    assert job_processes(lab_ssh, lab) == []


@pytest.mark.parametrize("launcher", ["deepspeed", "torchrun", "mpirun"])
def test_emulate_two_nodes_on_one_machine(provisioned, lab, lab_settings, lab_ssh, capfd, launcher):
    """worker-0 alone pretends to be 2 nodes (emu-0, emu-1): ssh aliases to itself checked
    against its own pinned host key, one process per emulated node (CPU), world size 2."""
    code = api.train(
        TrainOptions(
            inventory=str(lab.inventory),
            limit="worker-0",
            launcher=launcher,
            payload="health",
            timeout=120,
            emulate=2,
        ),
        lab_settings,
    )
    cap = capfd.readouterr()
    out = cap.out + cap.err
    assert code == 0, out
    assert "health: OK world_size=2" in out
    assert "rank 0/2 host=worker-0" in out and "rank 1/2 host=worker-0" in out
    assert "emulating 2 nodes on worker-0" in out
    if launcher == "torchrun":  # one torchrun per emulated node, output prefixed by alias and rank
        assert "[emu-0 r" in out and "[emu-1 r" in out
    config = (Path(lab.nodes[0].home) / ".ssh" / "config").read_text()
    assert "# BEGIN nodeprep emulated nodes" in config and "Host emu-0 emu-1" in config
    assert "HostKeyAlias worker-0" in config and "StrictHostKeyChecking no" not in config
    assert job_processes(lab_ssh, lab) == []


def test_emulate_input_errors(provisioned, lab, lab_settings, capfd):
    code, out = train(lab, lab_settings, capfd, "deepspeed", "health", emulate=2)
    assert code == 2 and "--emulate makes ONE machine look like 2 nodes" in out and "--limit" in out
    code = api.train(
        TrainOptions(
            inventory=str(lab.inventory),
            limit="worker-0",
            launcher="srun",
            payload="health",
            emulate=2,
        ),
        lab_settings,
    )
    out = capfd.readouterr()
    assert code == 2 and "--emulate with srun" in out.out + out.err


def test_torchrun_restart_after_sigkill_resumes_from_snapshot(
    provisioned, lab, lab_settings, capfd
):
    import os
    import signal
    import subprocess
    import threading

    snap = Path(lab.nodes[0].home) / JOB_DIR / "restart.pt"
    snap.unlink(missing_ok=True)
    result = {}

    def go():
        result["code"] = api.train(
            TrainOptions(
                inventory=str(lab.inventory),
                limit=NODES,
                launcher="torchrun",
                payload="ddp",
                args=(
                    "--epochs",
                    "6",
                    "--steps-per-epoch",
                    "5",
                    "--sleep-per-step",
                    "0.3",
                    "--snapshot",
                    snap.name,
                ),
                timeout=240,
                max_restarts=1,
            ),
            lab_settings,
        )

    t = threading.Thread(target=go)
    t.start()
    deadline = time.monotonic() + 120
    while not snap.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert snap.exists(), "no snapshot after the first epoch"
    # The rank (not the torchrun agent) inside worker-1's network namespace.
    pids = subprocess.run(
        ["ip", "netns", "pids", lab.nodes[1].netns], capture_output=True, text=True
    ).stdout.split()
    ranks = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        # the rank itself: rank.py --exec ddp.py (its wrapper records how it ends)
        if "--exec ddp.py" in cmd and "torch.distributed.run" not in cmd and state != "Z":
            ranks.append(int(pid))
    assert len(ranks) == 1, ranks
    os.kill(ranks[0], signal.SIGKILL)
    t.join(300)
    out = capfd.readouterr()
    text = out.out + out.err
    worker1 = "\n".join(
        ln for ln in text.splitlines() if ln.startswith("[worker-1") and "socket.cpp" not in ln
    )
    assert result.get("code") == 0, worker1[-4000:] + "\n...\n" + text[-1500:]
    assert "resumed from epoch" in text and "ddp: done epochs=6" in text
