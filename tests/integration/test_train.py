"""`train` on 2 lab nodes through real sshd, the real DeepSpeed runner with pdsh, torchrun and
Open MPI (gloo on CPU): payloads run to completion, a failing rank stops every rank on every
node, nothing is left running."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from nodeprep import api

NODES = "worker-[0-1]"
JOB_DIR = ".nodeprep/jobs/payloads"


@pytest.fixture(scope="module")
def provisioned(lab, lab_settings, lab_up, tmp_path_factory):
    lab_up()
    ctl = tmp_path_factory.mktemp("ctl")
    code = api.provision(str(lab.inventory), None, None, False, False, False, False,
                         [f"controller_key={ctl}/id", f"controller_ssh_config={ctl}/config"], lab_settings)
    assert code == 0


def train(lab, settings, capfd, launcher, payload, args=(), **kw):
    code = api.train(str(lab.inventory), NODES, launcher, payload, list(args), settings=settings, **kw)
    out = capfd.readouterr()
    return code, out.out + out.err


def job_processes(lab_ssh, lab) -> list[str]:
    """Payload processes still alive on any node (zombies excluded)."""
    left = []
    for node in lab.nodes[:2]:
        r = lab_ssh(node, "ps -u nodeprep -o stat=,args= | awk '$1 !~ /^Z/' | grep -E "
                          "'payloads/(ddp|health)|deepspeed|torch.distributed' | grep -v grep || true")
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
    code, out = train(lab, lab_settings, capfd, launcher, "ddp",
                      ["--epochs", "2", "--steps-per-epoch", "3", "--snapshot", snap.name], timeout=180)
    assert code == 0, out
    assert "ddp: done epochs=2" in out and snap.exists()
    assert "rank 0 " in out and "rank 1 " in out


def test_failing_rank_stops_everything_fast(provisioned, lab, lab_settings, lab_ssh, capfd):
    t0 = time.monotonic()
    code, out = train(lab, lab_settings, capfd, "torchrun", "ddp",
                      ["--epochs", "50", "--steps-per-epoch", "20", "--sleep-per-step", "0.2",
                       "--fail-at-step", "5", "--fail-rank", "1", "--snapshot", "fail.pt"], timeout=300)
    assert code != 0
    assert time.monotonic() - t0 < 30 + 15     # within 30 s of the failure (plus start-up)
    assert "FAILED" in out and "last lines from" in out
    assert job_processes(lab_ssh, lab) == []


def test_timeout_stops_every_rank(provisioned, lab, lab_settings, lab_ssh, capfd):
    code, out = train(lab, lab_settings, capfd, "deepspeed", "ddp",
                      ["--epochs", "100", "--steps-per-epoch", "50", "--sleep-per-step", "0.2",
                       "--snapshot", "long.pt"], timeout=25)
    assert code != 0 and "--timeout 25s reached" in out
    assert job_processes(lab_ssh, lab) == []


def test_dry_run_and_srun_command(provisioned, lab, lab_settings, capfd):
    code, out = train(lab, lab_settings, capfd, "srun", "health", dry_run=True)
    assert code == 0
    assert "srun --nodes 2" in out and "PYTHON_NODEPREP_JOB=" in out
    code, out = train(lab, lab_settings, capfd, "srun", "health")
    assert code == 1 and "srun not found on worker-0" in out


def test_bad_launcher_and_payload_are_input_errors(lab, lab_settings, capfd):
    code, out = train(lab, lab_settings, capfd, "ray", "health")
    assert code == 2 and "--launcher 'ray'" in out
    code, out = train(lab, lab_settings, capfd, "torchrun", "/no/such/script.py")
    assert code == 2 and "not a builtin" in out

