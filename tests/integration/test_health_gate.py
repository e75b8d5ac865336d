"""`train` runs the passive health checks before it launches (commands/train/gate.py): a node
with a CRITICAL finding stops the launch, named with its code; --exclude-unhealthy launches on
the other nodes (the launcher's hostfile without it); --no-health-gate launches anyway."""

from __future__ import annotations

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import TrainOptions


def _train(lab, settings, capfd, **kw) -> tuple[int, str]:
    code = api.train(
        TrainOptions(
            inventory=str(lab.inventory),
            limit="worker-[0-2]",
            launcher="deepspeed",
            payload="health",
            timeout=240,
            **kw,
        ),
        settings,
    )
    out = capfd.readouterr()
    return code, out.out + out.err


def test_the_gate_refuses_then_leaves_the_node_out(provisioned, lab, lab_settings, capfd):
    labmod.limit_shm(lab, 1, "64m")  # Docker's default /dev/shm on worker-1
    try:
        code, out = _train(lab, lab_settings, capfd)
        assert code == 1, out
        assert (
            "health gate: not launching on unhealthy nodes" in out and "worker-1: SHM_SMALL" in out
        ), out
        assert "train: job" not in out  # nothing launched
        code, out = _train(lab, lab_settings, capfd, exclude_unhealthy=True)
        assert code == 0, out
        assert "health gate: left out worker-1 (worker-1 SHM_SMALL)" in out, out
        assert "on 2 node(s)" in out and "[worker-1" not in out, out  # the job ran without it
    finally:
        labmod.limit_shm(lab, 1, None)


def test_no_health_gate_launches_anyway(provisioned, lab, lab_settings, capfd):
    labmod.limit_shm(lab, 2, "64m")
    try:
        code, out = _train(lab, lab_settings, capfd, health_gate=False)
    finally:
        labmod.limit_shm(lab, 2, None)
    assert "health gate" not in out and "[worker-2" in out, out
