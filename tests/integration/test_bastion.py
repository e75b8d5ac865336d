"""Nodes behind a jump host (issue 30), on a lab with a bastion (`lab.up --bastion`: the nodes
drop the controller's address, only the bastion at 10.X.0.5 reaches them): facts, provision
(cold, then a no-op), verify-parity and train through each way of writing the jump (nodeprep's
proxy_jump, Ansible's ansible_ssh_common_args, ProxyJump in an ssh config); one bastion login
per run (its sshd's log counts them); the controller's ssh config block works for OpenSSH
itself; a node behind the bastion that is down is named and the rest complete; a bastion
whose host key changed is refused for every node behind it.

Lab "bast" (its own subnet), 3 nodes, no Slurm (a bastion lab walls off the bridge address
slurmctld listens on). Roles that need no package index, except where train needs the venv."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from nodeprep import cli as api
from nodeprep import lab as labmod
from nodeprep.commands.options import (
    FactsOptions,
    ForgetOptions,
    ProvisionOptions,
    TrainOptions,
    VerifyOptions,
)
from nodeprep.lab import host as labhost
from nodeprep.lab import net as labnet

NAME, NODES = "bast", 3
ROLES = "ssh_keys,ssh_config,shell,nccl,deepspeed_env"


@pytest.fixture(scope="module")
def bast(tmp_path_factory, own_settings):
    base = tmp_path_factory.mktemp("bast")
    settings = own_settings(base, lock_wait=60)
    labmod.down(NAME, settings, log=lambda m: None)

    def up(**kw):
        return labmod.up(
            NODES,
            NAME,
            settings,
            labmod.UpOptions(inventory_dir=base / "inv", bastion=True, **kw),
            log=lambda m: None,
        )

    info = up()
    sets = (f"controller_key={base}/ctl/id", f"controller_ssh_config={base}/ctl/config")
    yield info, settings, sets, base, up
    labmod.down(NAME, settings, log=lambda m: None, purge=True)


def logins(info) -> int:
    """Public-key logins the bastion's sshd accepted so far."""
    return (info.bastion.home.parent / "sshd.log").read_text().count("Accepted publickey")


def forms(info, base: Path) -> dict[str, str]:
    """The same 3 nodes as three inventories, one per way of writing the jump."""
    key, b = info.key, info.bastion.address
    ini = base / "ansible.ini"
    ini.write_text(
        "[gpus]\n"
        + "".join(f"{n.name} ansible_host={n.address}\n" for n in info.nodes)
        + f"[gpus:vars]\nansible_user=nodeprep\nansible_ssh_private_key_file={key}\n"
        f"ansible_ssh_common_args='-o StrictHostKeyChecking=yes -o ProxyJump=nodeprep@{b}'\n"
    )
    cfg = base / "ssh_config"
    cfg.write_text(
        "".join(f"Host {n.name}\n    HostName {n.address}\n" for n in info.nodes)
        + (
            f"Host worker-*\n    User nodeprep\n    IdentityFile {key}\n"
            f"    ProxyJump nodeprep@{b}:22\n"
        )
    )
    return {"proxy_jump": str(info.inventory), "ansible": str(ini), "sshconfig": f"sshconfig:{cfg}"}


def test_the_controller_cannot_log_in_to_the_nodes_directly(bast):
    info, settings, *_ = bast

    def direct(address):
        return subprocess.run(
            [
                "ssh",
                "-F",
                "/dev/null",
                "-i",
                str(info.key),
                "-o",
                "BatchMode=yes",
                "-o",
                f"UserKnownHostsFile={settings.known_hosts}",
                "-o",
                "StrictHostKeyChecking=yes",
                f"nodeprep@{address}",
                "true",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert direct(info.nodes[0].address).returncode == 255
    assert direct(info.bastion.address).returncode == 0


@pytest.mark.parametrize("form", ["proxy_jump", "ansible", "sshconfig"])
def test_facts_through_every_form_with_one_bastion_login(bast, capsys, form):
    info, settings, _sets, base, _up = bast
    before = logins(info)
    assert api.facts(FactsOptions(inventory=forms(info, base)[form], json=True), settings) == 0
    rep = json.loads(capsys.readouterr().out)
    assert sorted(rep["nodes"]) == ["worker-0", "worker-1", "worker-2"]
    assert {n: r["facts"]["hostname"] for n, r in rep["nodes"].items()} == {
        n: n for n in rep["nodes"]
    }
    assert logins(info) - before == 1  # one bastion login for 3 nodes


def test_provision_cold_then_noop_and_openssh_uses_the_block(bast, capsys):
    info, settings, sets, base, _up = bast
    opts = ProvisionOptions(inventory=str(info.inventory), roles=ROLES, sets=sets)
    assert api.provision(opts, settings) == 0
    capsys.readouterr()
    before = logins(info)
    assert (
        api.provision(
            ProvisionOptions(inventory=str(info.inventory), roles=ROLES, sets=sets, json=True),
            settings,
        )
        == 0
    )
    rep = json.loads(capsys.readouterr().out)
    assert not rep["changed"] and not rep["failed"] and logins(info) - before == 1, rep
    block = (base / "ctl" / "config").read_text()
    assert (
        f"ProxyJump nodeprep@{info.bastion.address}" in block
        and f"Host {info.bastion.address}" in block
    )
    r = subprocess.run(
        [
            "ssh",
            "-F",
            str(base / "ctl" / "config"),
            "-o",
            "BatchMode=yes",
            "bast-worker-1",
            "hostname",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and r.stdout.strip() == "worker-1", r.stderr


@pytest.mark.parametrize("form", ["ansible", "sshconfig"])
def test_provision_through_the_other_forms_changes_nothing(bast, capsys, form):
    info, settings, sets, base, _up = bast
    code = api.provision(
        ProvisionOptions(inventory=forms(info, base)[form], roles="shell,nccl", json=True), settings
    )
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and not rep["failed"] and not rep["unreachable"], rep


def test_a_node_down_behind_the_bastion_is_named_and_the_rest_complete(bast, capsys):
    info, settings, *_ = bast
    labmod.stop_node(info, 1)
    try:
        assert api.facts(FactsOptions(inventory=str(info.inventory), json=True), settings) == 1
        rep = json.loads(capsys.readouterr().out)
    finally:
        labmod.restart_node(info, 1)
    bad = {n: r for n, r in rep["nodes"].items() if r.get("status") != "ok"}
    assert list(bad) == ["worker-1"], rep
    assert re.search(r"through nodeprep@" + re.escape(info.bastion.address), json.dumps(bad)), bad


@pytest.fixture(scope="module")
def stacked(bast, site_copy):
    """The whole stack (venv, torch, deepspeed) provisioned through the bastion: the site's
    copied into each home first, so that provision verifies it there (through the bastion)
    rather than installing it cold again (test_provision covers the cold path)."""
    info, settings, sets, *_ = bast
    for node in info.nodes:
        site_copy(node.home)
    assert api.provision(ProvisionOptions(inventory=str(info.inventory), sets=sets), settings) == 0
    return bast


@pytest.mark.parametrize("form", ["proxy_jump", "sshconfig"])
def test_verify_parity_through_the_bastion(stacked, capsys, form):
    info, settings, _sets, base, _up = stacked
    code = api.verify_parity(VerifyOptions(inventory=forms(info, base)[form]), settings)
    out = capsys.readouterr()
    assert code == 0 and "PARITY OK" in out.out + out.err, out.out + out.err


@pytest.mark.parametrize(
    "form,launcher",
    [
        ("proxy_jump", "deepspeed"),
        ("proxy_jump", "torchrun"),
        ("proxy_jump", "mpirun"),
        ("ansible", "deepspeed"),
        ("sshconfig", "torchrun"),
        ("ansible", "mpirun"),
    ],
)
def test_train_through_the_bastion(stacked, capfd, form, launcher):
    info, settings, _sets, base, _up = stacked
    code = api.train(
        TrainOptions(
            inventory=forms(info, base)[form],
            limit=None,
            launcher=launcher,
            payload="health",
            timeout=180,
        ),
        settings,
    )
    out = capfd.readouterr()
    text = out.out + out.err
    assert code == 0 and f"health: OK world_size={NODES}" in text, text


def test_a_changed_bastion_key_is_refused_for_every_node(bast, capsys):
    """The bastion reinstalled (a new host key, not pinned): every node behind it is refused
    with that reason, and nodeprep never logs in to it. Last: the lab is purged after."""
    info, settings, *_ = bast
    nd = info.bastion.home.parent
    subprocess.run(["kill", str(info.bastion.sshd_pid)], check=True)
    for suffix in ("", ".pub"):
        (nd / f"ssh_host_ed25519_key{suffix}").unlink()
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(nd / "ssh_host_ed25519_key")],
        check=True,
    )
    before = logins(info)
    labnet.wait_banners(labhost.start(NAME, [info.bastion]))  # the same bastion, a new key
    assert api.facts(FactsOptions(inventory=str(info.inventory), json=True), settings) == 1
    rep = json.loads(capsys.readouterr().out)
    for n in ("worker-0", "worker-1", "worker-2"):
        msg = rep["nodes"][n].get("message", "")
        assert "jump host" in msg and "CHANGED" in msg, rep["nodes"][n]
    assert logins(info) == before
    # the reinstall was deliberate: forget the jump host's pin (by its address, as the error
    # says), and the next contact pins the new key and goes through
    assert (
        api.hosts_forget(
            ForgetOptions(nodes=info.bastion.address, inventory=str(info.inventory)), settings
        )
        == 0
    )
    assert f"jump host {info.bastion.address}: removed 1 pinned key(s)" in capsys.readouterr().out
    assert api.facts(FactsOptions(inventory=str(info.inventory), json=True), settings) == 0
    assert logins(info) == before + 1
