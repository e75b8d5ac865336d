"""`lab.up --bastion`: one more machine in front of the lab, as on a cloud or a university
cluster reached through a jump host. The bastion is a namespace of its own (np-NAME-b) on
the lab's bridge at 10.X.0.5 with its own sshd, home and /etc (no sudo); the nodes' sshds then
refuse every login from the controller's bridge address (`Match Address` + `DenyUsers *`: the
controller cannot log in to them directly, while they still reach each other and the bastion
does; the lab's own banner checks still see them), and the inventory says `proxy_jump:
nodeprep@10.X.0.5`. Its host key is pinned like the nodes'. A lab with a bastion runs without
Slurm (kept simple: its slurmd would log in from nowhere, but srun's head is reached through
the bastion too, untested)."""

from __future__ import annotations

import os
import signal

from nodeprep.engine.hostkeys import host_entry
from nodeprep.errors import InputError

from . import etc, host, net
from .config import (
    BIN,
    DENY_FLAG,
    PREFIX,
    LabNode,
    bridge_address,
    bridge_name,
    node_mac,
    pubkey,
)

ADDRESS_OCTET = 5
HOST_KEY = "ssh_host_ed25519_key"


def netns(name: str) -> str:
    return f"np-{name}-b"


def address(octet: int) -> str:
    return f"10.{octet}.0.{ADDRESS_OCTET}"


def node(name: str, lab, octet: int) -> LabNode:
    return LabNode(
        "bastion",
        -1,
        address(octet),
        port=22,
        netns=netns(name),
        home=lab / "bastion" / "home",
        sshd_pid=None,
    )


def exists(name: str) -> bool:
    return netns(name) in net.netns_list()


def up(name: str, lab, octet: int, ids: tuple[int, int], pub: str, changes: list[str]) -> LabNode:
    """The bastion made and started where missing (idempotent)."""
    b = node(name, lab, octet)
    nd = b.home.parent
    nd.mkdir(parents=True, exist_ok=True)
    if not exists(name):
        if net.link_exists(b.netns):
            net.ip_batch([f"link del {b.netns}"])
        net.ip_batch(
            [
                f"netns add {b.netns}",
                f"link add {b.netns} type veth peer name eth0 address "
                f"{node_mac(b.address)} netns {b.netns}",
                f"link set {b.netns} master {bridge_name(name)} up",
            ]
        )
        net.ip_batch_each(
            {
                b.netns: [
                    "link set lo up",
                    f"addr add {b.address}/{PREFIX} dev eth0",
                    "link set eth0 up",
                ]
            }
        )
        changes.append("made the bastion's namespace")
    if etc.make([nd]):
        changes.append("copied /etc for the bastion")
    host.prepare_node(
        b, f"127.0.0.1\tlocalhost\n{b.address}\tbastion\n", pub, ids, changes, sudo=False
    )
    (nd / BIN).mkdir(exist_ok=True)  # its /usr/local/bin: empty (no GPU stand-in)
    if not (nd / HOST_KEY).exists():
        net.keygen([nd / HOST_KEY])
    if net.sshd_pid(nd / "sshd.pid", nd / "sshd_config") is None:
        net.wait_banners(host.start(name, [b]))
        changes.append("started the bastion's sshd")
    b.sshd_pid = net.sshd_pid(nd / "sshd.pid", nd / "sshd_config")
    return b


def down(name: str) -> list[str]:
    """The bastion's namespace, for host.remove (empty when there is none)."""
    return [netns(name)] if exists(name) else []


def wall_off(nodes: list[LabNode], octet: int, on: bool) -> None:
    """Each node's sshd refuses (ON) or takes again (not ON) logins from the controller's
    bridge address; a running sshd re-reads its config (SIGHUP)."""
    for n in nodes:
        nd = n.home.parent
        if on:
            net.write_if_changed(nd / DENY_FLAG, bridge_address(octet) + "\n")
        else:
            (nd / DENY_FLAG).unlink(missing_ok=True)
        if net.write_if_changed(nd / "sshd_config", host.node_sshd_config(n)):
            pid = net.sshd_pid(nd / "sshd.pid", nd / "sshd_config")
            if pid:
                os.kill(pid, signal.SIGHUP)


def converge(state, ids: tuple[int, int], pub: str, store) -> LabNode | None:
    """STATE (state._Up) with its bastion when state.bastion, without it otherwise; the
    nodes walled off from the controller accordingly; the bastion's host key pinned."""
    if state.bastion:
        b = up(state.name, state.lab, state.octet, ids, pub, state.changes)
        if store.pin(host_entry(b.address, 22), pubkey(b.home.parent / f"{HOST_KEY}.pub")):
            state.changes.append("pinned the bastion")
    else:
        b = None
        if exists(state.name):
            host.remove(down(state.name))
            state.changes.append("removed the bastion")
    wall_off(state.nodes(), state.octet, state.bastion)
    return b


def check(slurm: bool, bastion: bool) -> None:
    if slurm and bastion:
        raise InputError(
            "--bastion and --slurm together: the nodes' slurmd reach slurmctld on the "
            "controller's bridge address, which a bastion lab walls off",
            hint="run the lab's Slurm without a bastion (lab.up --no-bastion)",
        )
