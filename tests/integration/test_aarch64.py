"""aarch64 compute nodes driven from this x86_64 controller (the HPC case: an x86 login node,
GH200-like aarch64 nodes), on a lab of its own: worker-0 and worker-1 run an arm64 Debian
root under qemu-user (lab.up --arch aarch64), worker-2 is a native x86_64 node.

- the pair's homes first hold an x86_64 venv and wheelhouse (the site's, copied there: as where
  x86 login nodes that were provisioned share homes with aarch64 compute nodes): refused in
  one line before any change, with the per-platform setting;
- the aarch64 pair is provisioned cold from the controller (its wheelhouse resolved for
  aarch64's markers, torch 2.8.0 from PyPI's aarch64 CPU wheel), then again as a no-op;
  parity OK; the health payload trains on it with torchrun and with DeepSpeed (pdsh);
- the mixed fleet (the pair plus worker-2): two wheelhouses, two torch builds, and parity
  naming the per-platform differences as expected, not as drift.
The root is built once per machine (lab/foreign.py: ~2 minutes) and cached."""

from __future__ import annotations

import json
import subprocess

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import ProvisionOptions, TrainOptions, VerifyOptions
from nodeprep.lab import binfmt

from .conftest import ssh_argv

NAME, SUBNET = "ar", 198


@pytest.fixture(scope="module")
def arm_lab(lab_settings, site_copy, tmp_path_factory, request):
    """The lab with the pair as aarch64 nodes (the arm64 root, built in the background
    meanwhile, waited for only here); every home holds the site's x86_64 venv and wheelhouse,
    copied there: the pair's as x86 login nodes that share their homes leave them, worker-2's
    as a provisioned x86_64 node."""
    labmod.down(NAME, lab_settings, log=lambda msg: None)
    inv, ctl = tmp_path_factory.mktemp("arinv"), tmp_path_factory.mktemp("arctl")
    sets = (f"controller_key={ctl}/id", f"controller_ssh_config={ctl}/config")
    request.getfixturevalue("arm64_root_ready")
    before = (binfmt.BINFMT / "register").exists(), binfmt.registered("aarch64")
    info = labmod.up(
        3,
        NAME,
        lab_settings,
        labmod.UpOptions(inventory_dir=inv, subnet=SUBNET, arch=("aarch64", "worker-2=native")),
        log=lambda msg: None,
    )
    for node in info.nodes:
        site_copy(node.home)
    yield info, sets
    labmod.down(NAME, lab_settings, log=lambda msg: None)
    # lab.down undoes lab.up's host-wide changes: a qemu-user registration it added, and
    # binfmt_misc if lab.up mounted it, are gone
    assert ((binfmt.BINFMT / "register").exists(), binfmt.registered("aarch64")) == before


def _on(info, settings, node, command):
    return subprocess.run(
        ssh_argv(info, node, settings, command),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_the_nodes_are_aarch64_userlands(arm_lab, lab_settings):
    info, _ = arm_lab
    got = [
        _on(
            info,
            lab_settings,
            n,
            "uname -m; /usr/bin/python3 -c 'import platform; print(platform.machine())'",
        )
        for n in info.nodes
    ]
    assert [g.stdout.split() for g in got] == [["aarch64"] * 2, ["aarch64"] * 2, ["x86_64"] * 2], (
        got
    )
    assert [n.arch for n in labmod.status(NAME, lab_settings).nodes] == ["aarch64", "aarch64", None]


def test_an_x86_64_venv_in_the_pairs_homes_is_refused_before_any_change(
    arm_lab, lab_settings, capfd
):
    """The x86_64 venv the pair's homes hold: installing aarch64 wheels into it would leave its
    x86_64 numpy (pip keeps a matching version) and replacing it would break the x86_64 nodes
    that may share those homes. One line names the nodes, the path and both CPUs; the hint
    gives the per-platform setting and the removal; nothing on the nodes changed."""
    info, sets = arm_lab
    pair = "worker-0,worker-1"
    look = "cat ~/.nodeprep/wheelhouse/SHA256SUMS; ls ~/.nodeprep/venv/lib/python3*/site-packages"
    before = [_on(info, lab_settings, info.nodes[i], look).stdout for i in (0, 1)]
    assert "x86_64" in before[0]
    code = api.provision(
        ProvisionOptions(inventory=str(info.inventory), limit=pair, sets=sets), lab_settings
    )
    err = capfd.readouterr().err
    first = err.splitlines()[0]
    assert code == 2 and first.startswith(
        "error: worker-[0-1]: ~/.nodeprep/venv holds a venv built for x86_64 ("
    ), err
    assert "x86_64 (numpy, torch, " in first, err  # what would break named first
    assert "; these nodes are aarch64: one venv cannot serve both platforms" in first, err
    assert "venv_path: ~/.nodeprep/venv-aarch64" in err and "rm -rf ~/.nodeprep/venv" in err, err
    assert [_on(info, lab_settings, info.nodes[i], look).stdout for i in (0, 1)] == before
    # the hint's second way (no x86_64 node uses these homes any more); the next test converges
    for i in (0, 1):
        assert _on(info, lab_settings, info.nodes[i], "rm -rf ~/.nodeprep/venv").returncode == 0


def test_aarch64_pair_cold_then_noop_then_parity(arm_lab, lab_settings, capfd):
    info, sets = arm_lab
    pair = "worker-0,worker-1"
    assert (
        api.provision(
            ProvisionOptions(inventory=str(info.inventory), limit=pair, sets=sets), lab_settings
        )
        == 0
    )
    out = "".join(capfd.readouterr())
    assert "torch==2.8.0 for aarch64: PyPI's aarch64 wheel of 2.8 is the CPU build" in out, out[
        -3000:
    ]
    assert "wheelhouse.download cp311-aarch64" in out
    assert (
        api.provision(
            ProvisionOptions(inventory=str(info.inventory), limit=pair, sets=sets), lab_settings
        )
        == 0
    )
    out = "".join(capfd.readouterr())
    assert "nothing to change" in out, out[-3000:]
    assert (
        api.verify_parity(
            VerifyOptions(inventory=str(info.inventory), limit=pair, json=True), lab_settings
        )
        == 0
    )
    rep = json.loads(capfd.readouterr().out)
    assert rep["ok"] and rep["drift"] == [] and rep["per_platform"] == []
    # what the venv's python says it is, on the node
    r = _on(
        info,
        lab_settings,
        info.nodes[1],
        "~/.nodeprep/venv/bin/python -c "
        "'import platform, torch; print(platform.machine(), torch.__version__)'",
    )
    assert r.stdout.split() == ["aarch64", "2.8.0+cpu"], r


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed", "mpirun"])
def test_health_trains_on_the_aarch64_pair(arm_lab, lab_settings, capfd, launcher):
    info, _ = arm_lab
    code = api.train(
        TrainOptions(
            inventory=str(info.inventory),
            limit="worker-0,worker-1",
            launcher=launcher,
            payload="health",
            timeout=240,
        ),
        lab_settings,
    )
    text = "".join(capfd.readouterr())
    assert code == 0 and "health: OK world_size=2" in text, text[-3000:]
    assert "torch=2.8.0+cpu" in text


def test_mixed_fleet_two_wheelhouses_and_parity_per_platform(arm_lab, lab_settings, capfd):
    info, sets = arm_lab
    assert (
        api.provision(ProvisionOptions(inventory=str(info.inventory), sets=sets), lab_settings) == 0
    )
    out = "".join(capfd.readouterr())
    assert "torch==2.13.0+cpu for x86_64" in out and "torch==2.8.0 for aarch64" in out, out[-3000:]
    assert (
        api.verify_parity(VerifyOptions(inventory=str(info.inventory), json=True), lab_settings)
        == 0
    )
    rep = json.loads(capfd.readouterr().out)
    per = {d["key"]: {g["value"]: g["nodes"] for g in d["groups"]} for d in rep["per_platform"]}
    assert rep["ok"] and rep["drift"] == [], rep
    assert per["cpu.arch"] == {"aarch64": ["worker-0", "worker-1"], "x86_64": ["worker-2"]}
    assert per["pkg.torch"] == {"2.8.0": ["worker-0", "worker-1"], "2.13.0+cpu": ["worker-2"]}
    # drift on one aarch64 node stays drift in a mixed fleet
    _on(info, lab_settings, info.nodes[1], "echo 'export NCCL_DEBUG=INFO' >> ~/.nodeprep/env.sh")
    try:
        assert api.verify_parity(VerifyOptions(inventory=str(info.inventory)), lab_settings) == 1
        out = capfd.readouterr().out
        assert (
            "DRIFT: 1 key differs on 1 of 3 nodes (env.shell.NCCL_DEBUG), odd node: worker-1" in out
        ), out
        assert "differ per platform as expected (cpu.arch" in out
    finally:
        _on(info, lab_settings, info.nodes[1], "sed -i '/NCCL_DEBUG=INFO/d' ~/.nodeprep/env.sh")
