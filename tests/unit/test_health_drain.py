"""`invoke health --drain / --undrain` decisions (ops/health/drain.py) as data: Slurm's view
parsed, who owns a drain, what is done to each node; and the head's script (scontrol, then
`sudo -n` when Slurm refuses the user) run by sh against stand-in programs. The refusal text
is the one Slurm 22.05's scontrol printed for a non-operator on the lab (`slurm_update error:
Invalid user id`); the lab test (tests/integration/test_health_drain.py) runs the real one."""

from __future__ import annotations

import os
import subprocess

import pytest

from nodeprep.ops.health import drain
from nodeprep.ops.health.drain import Action, SlurmNode

# `sinfo -h -N -o '%N|%T|%E'` as Slurm 22.05 printed it on the lab (worker-1 drained by
# nodeprep, worker-2 by an admin), with worker-0 in a second partition and a reason holding
# the separator.
SINFO = """worker-0|idle|none
worker-1|drained|nodeprep: SHM_SMALL (invoke health)
worker-2|drained|disk replacement | ticket 42
worker-0|idle|none
worker-3|down*|Not responding
worker-4|draining|nodeprep: XID_HW (invoke health)
"""
NODES = ["worker-0", "worker-1", "worker-2", "worker-3", "worker-4"]
NAMES = {n: n for n in NODES}


def test_parse_state():
    st = drain.parse_state(SINFO)
    assert list(st) == NODES
    assert st["worker-2"] == SlurmNode("drained", "disk replacement | ticket 42")
    assert st["worker-1"].drained and st["worker-1"].ours
    assert st["worker-2"].drained and not st["worker-2"].ours
    assert st["worker-4"].drained and not st["worker-0"].drained and not st["worker-3"].drained


def test_reason_is_ours_and_sorted():
    assert (
        drain.reason(["XID_HW", "DISK_FULL", "XID_HW"])
        == "nodeprep: DISK_FULL,XID_HW (invoke health)"
    )


def ops(actions):
    return {a.node: a.op for a in actions}


def test_drain_only_critical_and_never_over_another_reason():
    critical = {
        "worker-0": ["DISK_FULL"],
        "worker-2": ["XID_HW"],
        "worker-3": ["NODE_UNREACHABLE"],
        "worker-1": ["SHM_SMALL"],
    }
    acts = drain.actions_for(
        critical, NODES, NAMES, drain.parse_state(SINFO), drain=True, undrain=False
    )
    assert ops(acts) == {
        "worker-0": "drain",
        "worker-1": "keep",
        "worker-2": "keep",
        "worker-3": "drain",
    }
    by = {a.node: a for a in acts}
    assert by["worker-0"].reason == "nodeprep: DISK_FULL (invoke health)"
    assert "someone else" in by["worker-2"].why and "same codes" in by["worker-1"].why
    # new codes on a node nodeprep drained: the reason follows
    acts = drain.actions_for(
        {"worker-1": ["XID_HW"]}, NODES, NAMES, drain.parse_state(SINFO), True, False
    )
    assert ops(acts) == {"worker-1": "drain"} and "XID_HW" in acts[0].reason
    # without --drain nothing is planned, whatever the verdicts
    assert drain.actions_for(critical, NODES, NAMES, drain.parse_state(SINFO), False, False) == []


def test_undrain_only_our_drains_of_healthy_nodes():
    critical = {"worker-4": ["XID_HW"]}
    acts = drain.actions_for(
        critical, NODES, NAMES, drain.parse_state(SINFO), drain=False, undrain=True
    )
    assert ops(acts) == {"worker-1": "resume", "worker-2": "keep", "worker-4": "keep"}
    assert "never undrained" in {a.node: a for a in acts}["worker-2"].why


def test_a_node_slurm_does_not_list_is_said_so():
    acts = drain.actions_for(
        {"gpu-9": ["DISK_FULL"]},
        ["gpu-9", "worker-0"],
        {"worker-0": "worker-0"},
        drain.parse_state(SINFO),
        True,
        False,
    )
    assert [(a.node, a.op) for a in acts] == [("gpu-9", "keep")] and "does not list" in acts[0].why


def test_the_inventory_name_and_the_slurm_name_differ():
    acts = drain.actions_for(
        {"gpu0.example": ["DISK_FULL"]},
        ["gpu0.example"],
        {"gpu0.example": "worker-0"},
        drain.parse_state(SINFO),
        True,
        False,
    )
    assert acts[0].slurm == "worker-0" and "NodeName=worker-0 " in acts[0].command()


def test_commands_are_literal():
    a = Action("n", "odd;name", "drain", why="", reason=drain.reason(["DISK_FULL"]))
    assert a.command() == (
        "scontrol update NodeName='odd;name' State=DRAIN "
        "Reason='nodeprep: DISK_FULL (invoke health)'"
    )
    assert (
        Action("n", "w1", "resume", why="").command() == "scontrol update NodeName=w1 State=RESUME"
    )


@pytest.fixture
def stand_ins(tmp_path):
    """PATH with a scontrol that answers as told and a sudo that records and runs it as root."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log = tmp_path / "log"

    def make(scontrol_says: str, scontrol_rc: int, sudo_rc: int = 0):
        (bin_ / "scontrol").write_text(
            f'#!/bin/sh\necho "scontrol $*" >> {log}\n'
            f"[ \"$AS_ROOT\" = 1 ] && exit 0\necho '{scontrol_says}' >&2\nexit {scontrol_rc}\n"
        )
        (bin_ / "sudo").write_text(
            f'#!/bin/sh\necho "sudo $*" >> {log}\n[ {sudo_rc} = 0 ] || '
            "{ echo 'sudo: a password is required' >&2; exit 1; }\n"
            'shift; AS_ROOT=1 exec "$@"\n'
        )
        for p in bin_.iterdir():
            p.chmod(0o755)
        return {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"}

    return make, log


def _run(script: str, env) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=10)


def test_script_falls_back_to_sudo_only_when_slurm_refuses_the_user(stand_ins):
    make, log = stand_ins
    a = Action("w1", "worker-1", "drain", why="", reason=drain.reason(["DISK_FULL"]))
    r = _run(drain.script(a), make("slurm_update error: Invalid user id", 1))
    assert r.returncode == 0, r.stderr
    lines = log.read_text().splitlines()
    assert (
        lines[0] == "scontrol update NodeName=worker-1 State=DRAIN "
        "Reason=nodeprep: DISK_FULL (invoke health)"
    )
    assert (
        lines[1].startswith("sudo -n scontrol update NodeName=worker-1 State=DRAIN")
        and len(lines) == 3
    )


def test_script_reports_another_failure_without_sudo(stand_ins):
    make, log = stand_ins
    r = _run(
        drain.script(Action("w1", "worker-9", "resume", why="")),
        make("slurm_update error: Invalid node name specified", 1),
    )
    assert r.returncode == 1 and "Invalid node name" in r.stderr
    assert not any(ln.startswith("sudo") for ln in log.read_text().splitlines())


def test_script_when_sudo_is_refused_too(stand_ins):
    make, _log = stand_ins
    r = _run(
        drain.script(Action("w1", "worker-1", "resume", why="")),
        make("slurm_update error: Invalid user id", 1, sudo_rc=1),
    )
    assert r.returncode == 1 and "password is required" in r.stderr
