"""`invoke health --drain / --undrain` on the lab's real Slurm (slurmctld here, slurmd in each
node; lab.up --slurm): a CRITICAL node is drained with nodeprep's reason and the others are
not; a second run changes nothing; without --drain nothing changes; a node an admin drained
keeps its reason through --drain and --undrain; --undrain returns only nodeprep's drains of
nodes healthy again. The lab user is no Slurm operator: scontrol refuses it and the drain goes
through the narrow sudo rule the lab gives it (lab/config.py: sudoers_slurm_text), as a site
gives its operators."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import HealthOptions

from .test_train_restarts import restore  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def slurm_lab(lab, lab_up, lab_settings):
    from nodeprep.lab import slurm as lab_slurm

    if not lab_slurm.cgroup_controllers():
        pytest.skip(
            "this host mounts no cgroup v1 controllers: "
            "Slurm 22.05's slurmd cannot start in the lab"
        )
    lab_up(slurm=True)
    conf = Path(lab_settings.lab_root) / lab.name / "slurm" / "slurm.conf"
    env = {**os.environ, "SLURM_CONF": str(conf)}

    def scontrol(*args: str) -> None:  # as the admin (root, here on the controller)
        subprocess.run(["scontrol", *args], env=env, check=True, capture_output=True, timeout=30)

    def states() -> dict[str, tuple[str, str]]:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N|%T|%E"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
        return {
            ln.split("|")[0]: (ln.split("|")[1], ln.split("|", 2)[2]) for ln in out.splitlines()
        }

    yield scontrol, states
    for n in lab.nodes:
        subprocess.run(
            ["scontrol", "update", f"NodeName={n.name}", "State=RESUME"],
            env=env,
            capture_output=True,
            timeout=30,
        )
    lab_up(slurm=False)


def _health(lab, settings, capsys, **kw) -> tuple[int, dict]:
    code = api.health(HealthOptions(inventory=str(lab.inventory), json=True, **kw), settings)
    return code, json.loads(capsys.readouterr().out)


def test_drain_and_undrain(slurm_lab, lab, lab_settings, capsys):
    scontrol, states = slurm_lab
    w0, w1, w2 = (n.name for n in lab.nodes[:3])
    scontrol("update", f"NodeName={w2}", "State=DRAIN", "Reason=disk replacement ticket 42")
    labmod.limit_shm(lab, 1, "64m")
    try:
        before = states()
        code, rep = _health(lab, lab_settings, capsys)  # no --drain: Slurm untouched
        assert code == 1 and rep["unhealthy"] == [w1] and "slurm" not in rep
        assert states() == before

        code, rep = _health(lab, lab_settings, capsys, drain=True)
        assert code == 1, rep
        acts = {a["node"]: (a["action"], a["error"]) for a in rep["slurm"]}
        assert acts == {w1: ("drain", "")}, rep["slurm"]
        now = states()
        assert now[w1] == ("drained", "nodeprep: SHM_SMALL (invoke health)"), now
        assert now[w0][0] in ("idle", "mixed", "allocated") and now[w2] == (
            "drained",
            "disk replacement ticket 42",
        )

        code, rep = _health(lab, lab_settings, capsys, drain=True)  # again: nothing to change
        assert [a["action"] for a in rep["slurm"]] == ["keep"] and states() == now

        code, rep = _health(lab, lab_settings, capsys, undrain=True)  # still CRITICAL: stays
        assert {a["node"]: a["action"] for a in rep["slurm"]} == {w1: "keep", w2: "keep"}
        assert states()[w1][0] == "drained"
    finally:
        labmod.limit_shm(lab, 1, None)
    code, rep = _health(lab, lab_settings, capsys, undrain=True, drain=True)
    assert code == 0, rep
    assert {a["node"]: a["action"] for a in rep["slurm"]} == {w1: "resume", w2: "keep"}
    now = states()
    assert "drain" not in now[w1][0] and now[w2] == ("drained", "disk replacement ticket 42"), now
    # text: what was done to each node, one line each
    assert api.health(HealthOptions(inventory=str(lab.inventory), undrain=True), lab_settings) == 0
    out = capsys.readouterr().out
    assert f"slurm: {w2}: unchanged: drained by someone else" in out


def test_undrain_refuses_via_slurm(slurm_lab, lab, lab_settings, capsys):
    assert (
        api.health(
            HealthOptions(inventory=str(lab.inventory), via="slurm", undrain=True), lab_settings
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--undrain --via slurm" in err and "Traceback" not in err


@pytest.mark.usefixtures("restore")
def test_a_node_train_quarantines_is_drained_until_released(
    provisioned, slurm_lab, lab, lab_settings, capfd
):
    """train --restarts --drain: worker-2 goes silent mid-run, is quarantined and drained in
    Slurm with nodeprep's reason (scontrol on a node of the job that answers), the job goes on
    with the other two; once it answers again and is released, health --undrain returns it."""
    from nodeprep.ops.train import quarantine

    from .test_train_restarts import _silenced_mid_run

    scontrol, states = slurm_lab
    scontrol("update", "NodeName=worker-2", "State=RESUME")  # as test_drain_and_undrain left it
    code, text, _runs = _silenced_mid_run(
        lab, lab_settings, capfd, 2, "torchrun", restarts=1, min_nodes=2, drain=True
    )
    assert code == 0, text
    assert "slurm: drain worker-2: CRITICAL: QUARANTINED" in text, text
    assert states()["worker-2"] == ("drained", "nodeprep: QUARANTINED (invoke health)")
    labmod.silence_node(lab, 2, silent=False)
    code, rep = _health(lab, lab_settings, capsys=capfd, undrain=True, limit="worker-2")
    assert [a["action"] for a in rep["slurm"]] == ["keep"], rep  # still quarantined: stays
    quarantine.release(lab_settings.state, ["worker-2"])
    code, rep = _health(lab, lab_settings, capsys=capfd, undrain=True, limit="worker-2")
    assert [a["action"] for a in rep["slurm"]] == ["resume"], rep
    assert "drain" not in states()["worker-2"][0]
