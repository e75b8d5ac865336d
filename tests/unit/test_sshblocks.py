"""The controller's ssh config: which Host aliases other inventories' blocks and the user's own
entries define, and which of ours collide (ops/ssh/config_blocks.py), end to end through the
ssh_config role's validate on a real file."""

from __future__ import annotations

import pytest

from nodeprep.commands.options import ProvisionOptions
from nodeprep.commands.provision import validated
from nodeprep.engine.events import Events
from nodeprep.errors import InputError
from nodeprep.ops.ssh import config_blocks
from nodeprep.settings import Settings

BEGIN = "# BEGIN nodeprep hosts {} (managed: edits inside this block are replaced)"
END = "# END nodeprep hosts {}"

CONFIG = "\n".join(
    [
        "Host *",
        "    ServerAliveInterval 30",
        "Host mybox",
        "    HostName 192.168.1.5",
        BEGIN.format("clusterA"),
        "Host worker-0",
        "    HostName 10.1.0.10",
        "    Port 22",
        "Host worker-1",
        "    HostName 10.1.0.11",
        "    Port 2222",
        END.format("clusterA"),
        "Host gpu01 gpu02",
        "    User me",
        "Host gpu03",
        "    HostName gpu03.example.com",
        "",
    ]
)


def test_defined_reads_blocks_and_the_users_entries():
    found = config_blocks.defined(CONFIG, "cfg", own="mine")
    assert [(d.hostname, d.port, d.where) for d in found["worker-1"]] == [
        ("10.1.0.11", 2222, "cfg:9 (the block of inventory 'clusterA')")
    ]
    assert found["mybox"][0].hostname == "192.168.1.5" and found["mybox"][0].where == "cfg:3"
    assert found["gpu01"][0].hostname is None  # sets no HostName of its own
    assert "*" not in found  # patterns are not aliases


@pytest.mark.parametrize(
    "wanted,clash",
    [
        (("worker-0", "10.1.0.10", 22), None),  # the same node: no conflict
        (
            ("worker-0", "10.2.0.10", 22),
            "cfg:6 (the block of inventory 'clusterA') as 10.1.0.10:22",
        ),
        (("worker-1", "10.1.0.11", 22), "as 10.1.0.11:2222"),  # same address, another port
        (("gpu01", "10.9.9.9", 22), None),  # the user's entry names no address
        (("gpu03", "10.9.9.9", 22), "cfg:15 as gpu03.example.com:22"),
        (("lab-worker-0", "10.2.0.10", 22), None),  # a prefixed alias is another name
    ],
)
def test_conflicts(wanted, clash):
    got = config_blocks.conflicts([(*wanted, "inv.yml:3")], CONFIG, "cfg", own="mine")
    if clash is None:
        assert got == []
    else:
        assert len(got) == 1 and clash in got[0] and "inv.yml:3" in got[0]


def test_own_block_is_not_a_conflict():
    assert (
        config_blocks.conflicts([("worker-0", "10.2.0.10", 22, "x")], CONFIG, "cfg", "clusterA")
        == []
    )


@pytest.mark.parametrize(
    "value,written",
    [("10.0.0.1", "10.0.0.1"), ("fe80::1%eth0", "fe80::1%%eth0"), ("/k/my key", '"/k/my key"')],
)
def test_word(value, written):
    assert config_blocks.word(value) == written


def test_word_refuses_what_ssh_config_cannot_hold():
    for bad in ('a"b', "a\nb"):
        with pytest.raises(ValueError):
            config_blocks.word(bad)


def _inventory(tmp_path, prefix=None):
    config = tmp_path / "ssh_config"
    config.write_text(CONFIG)
    extra = f"  ssh_alias_prefix: {prefix}\n" if prefix else ""
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        f"vars:\n  controller_ssh_config: {config}\n{extra}hosts:\n"
        "  worker-0: {address: 10.2.0.10}\n  worker-1: {address: 10.2.0.11}\n"
    )
    return inv


def test_second_inventory_naming_the_same_nodes_is_refused_with_both_places(tmp_path):
    inv = _inventory(tmp_path)
    with pytest.raises(InputError) as err:
        validated(
            ProvisionOptions(inventory=str(inv), roles="ssh_config"),
            Settings(state_dir=str(tmp_path / "s")),
            Events(),
        )
    text = str(err.value)
    assert err.value.exit_code == 2 and "\n" not in text
    assert "Host worker-0 is already defined at" in text and "ssh_config:6" in text
    assert "hosts.yml:4" in text and "(and 1 more)" in text and "ssh_alias_prefix" in text


def test_an_alias_prefix_resolves_it(tmp_path):
    inv = _inventory(tmp_path, prefix="b-")
    _roles, prov = validated(
        ProvisionOptions(inventory=str(inv), roles="ssh_config"),
        Settings(state_dir=str(tmp_path / "s")),
        Events(),
    )
    assert prov.vars["worker-0"]["ssh_alias_prefix"] == "b-"


def test_the_controller_block_writes_the_jump_hosts_and_their_own_entries(tmp_path):
    """A node behind a chain: ProxyJump with each hop's user (else the node's), a Host entry per
    hop with the same keys and pins; OpenSSH itself reads the block back (ssh -G)."""
    import importlib.util
    import shutil
    import subprocess
    from pathlib import Path

    from nodeprep.inventory.model import load

    spec = importlib.util.spec_from_file_location(
        "ssh_config_role", Path(__file__).parents[2] / "roles" / "ssh_config" / "role.py"
    )
    role = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(role)
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "vars: {user: ops, proxy_jump: 'admin@outer.example.com:2222,inner'}\n"
        "hosts: {gpu1: {address: 10.0.0.11}}\n"
    )
    body = role.entries(
        load(str(inv)).hosts,
        "/k/ctl",
        ["UserKnownHostsFile /p/known", "StrictHostKeyChecking yes"],
        controller=True,
    )
    assert "    ProxyJump admin@outer.example.com:2222,ops@inner\n" in body
    assert "Host outer.example.com\n    IdentityFile /k/ctl\n    IdentitiesOnly yes\n" in body
    assert "Host inner\n" in body and body.count("UserKnownHostsFile /p/known") == 3
    if shutil.which("ssh") is None:
        pytest.skip("no OpenSSH client: requirements/bootstrap.sh installs it")
    cfg = tmp_path / "config"
    cfg.write_text(body)
    got = subprocess.run(
        ["ssh", "-G", "-F", str(cfg), "gpu1"], capture_output=True, text=True, check=True
    ).stdout
    assert "proxyjump admin@outer.example.com:2222,ops@inner" in got and "hostname 10.0.0.11" in got
