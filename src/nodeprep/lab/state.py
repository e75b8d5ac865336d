"""A rootful lab's state: its directory and what lab.json recorded, what runs now (the
namespaces, each node's sshd), and what one up() works on (_Up), read from lab.json and the
options and checked against what a running lab has. cluster.py's up, down and status use it."""

from __future__ import annotations

import json
import re
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from nodeprep.errors import InputError
from nodeprep.settings import Settings

from . import bastion, containers, foreign, gpu, host, modules, net, slurm
from .config import (
    LabNode,
    UpOptions,
    bridge_name,
    link_rates,
    netns_name,
    node_address,
    node_name,
    subnet_for,
)

STATE = "lab.json"


def _lab_dir(settings: Settings, name: str) -> Path:
    return Path(settings.lab_root) / name


def _read_state(lab: Path) -> dict | None:
    try:
        return json.loads((lab / STATE).read_text())
    except (OSError, ValueError):
        return None


def _ours(name: str) -> dict[int, str]:
    """This lab's namespaces that exist now, by node index."""
    pat = re.compile(rf"np-{re.escape(name)}-(\d+)")
    return {int(m.group(1)): ns for ns in net.netns_list() if (m := pat.fullmatch(ns))}


def _node(name: str, lab: Path, octet: int, i: int, arch: str | None = None) -> LabNode:
    """Node I of lab NAME (directory LAB, subnet 10.OCTET.0.0/16), sshd_pid not looked up."""
    return LabNode(
        node_name(i),
        i,
        node_address(octet, i),
        port=22,
        netns=netns_name(name, i),
        home=lab / node_name(i) / "home",
        sshd_pid=None,
        arch=arch,
    )


def _sshd_pid(node: LabNode) -> int | None:
    """The pid of NODE's sshd, None when it does not run."""
    nd = node.home.parent
    return net.sshd_pid(nd / "sshd.pid", nd / "sshd_config")


@dataclass
class _Up:
    """One up() of the rootful lab: what it works on, and what it changed so far (for the
    one line it logs at the end)."""

    name: str
    count: int  # nodes wanted
    lab: Path  # <lab_root>/NAME
    _: KW_ONLY
    octet: int  # X of 10.X.0.0/16
    running: bool  # the bridge was up already
    slurm: bool  # Slurm over the nodes after this up()
    shared_home: bool = False  # every node binds <lab>/shared-home as its home
    aliases: int = 0  # inventory nodes worker-(count+k) on node k's machine
    nics: tuple[str, ...] = ()  # interface names the nodes get in turn (() = eth0)
    no_sudo: tuple[int, ...] = ()  # nodes whose user may not sudo
    link_rate: str = ""  # each node's link limit both ways ("" none), tc on its veth
    had_rate: str = ""  # the limit its veths have now
    gpu_records: dict[int, str] = field(
        default_factory=dict
    )  # node index -> recording (lab/gpu.py)
    bastion: bool = False  # a jump host in front (lab/bastion.py)
    containers: bool = False  # podman on the nodes (lab/containers.py)
    modules: str | None = None  # lmod | tcl: environment modules on the nodes (lab/modules.py)
    arches: dict[int, str] = field(
        default_factory=dict
    )  # node index -> foreign arch (lab/foreign.py)
    changes: list[str] = field(default_factory=list)

    @property
    def key(self) -> Path:
        return self.lab / "id_ed25519"

    def node(self, i: int) -> LabNode:
        return _node(self.name, self.lab, self.octet, i, self.arches.get(i))

    def nodes(self) -> list[LabNode]:
        return [self.node(i) for i in range(self.count)]

    def nic(self, i: int) -> str:
        return self.nics[i % len(self.nics)] if self.nics else "eth0"


def _up_state(nodes: int, name: str, settings: Settings, options: UpOptions) -> _Up:
    """What this up() works on. A running lab keeps its subnet (moving it is refused) and
    its bridge must be this lab's; Slurm runs when asked, or (None) as the lab had it."""
    lab, bridge = _lab_dir(settings, name), bridge_name(name)
    state, running = _read_state(lab), net.link_exists(bridge)
    with_slurm = options.slurm
    if with_slurm is None:
        with_slurm = bool(state and state.get("slurm"))
    if with_slurm:
        slurm.require()
    octet = _octet(name, options, state, running)
    if running:
        host.check_bridge(bridge, octet)
    shared = _shared_home(name, options, state, running)
    if not 0 <= options.aliases <= nodes:
        raise InputError(f"--aliases {options.aliases}: expected 0..{nodes} (one per node at most)")
    nics = _nic_names(name, options, state, running)
    up = _Up(
        name,
        nodes,
        lab,
        octet=octet,
        running=running,
        slurm=with_slurm,
        shared_home=shared,
        aliases=options.aliases,
    )
    up.nics, up.no_sudo = nics, tuple(options.no_sudo)
    up.had_rate, up.link_rate = link_rates(state, running, options.link_rate)
    up.gpu_records = gpu.records(
        options.gpu_records,
        (state or {}).get("gpu_records"),
        nodes,
        [node_name(i) for i in range(nodes)],
    )
    up.arches = foreign.node_arches(
        name, options.arch, state, running, nodes, [node_name(i) for i in range(nodes)]
    )
    foreign.mountable(name, lab, up.arches)
    up.bastion = bool((state or {}).get("bastion")) if options.bastion is None else options.bastion
    bastion.check(with_slurm, up.bastion)
    up.containers = (
        bool((state or {}).get("containers")) if options.containers is None else options.containers
    )
    if up.containers:
        containers.require()
    up.modules = (
        ((state or {}).get("modules") or None)
        if options.modules is None
        else options.modules or None
    )
    if up.modules:
        modules.require(up.modules)
    return up


def _octet(name: str, options: UpOptions, state: dict | None, running: bool) -> int:
    """The lab's subnet octet: OPTIONS' (or the name's), or the one a running lab has."""
    octet = subnet_for(name, options.subnet)
    if running and state and state["subnet"] != octet:
        if options.subnet is not None:
            raise InputError(
                f"lab {name} is up on 10.{state['subnet']}.0.0/16",
                hint="run `invoke lab.down` first to move it",
            )
        octet = state["subnet"]
    return octet


def _shared_home(name: str, options: UpOptions, state: dict | None, running: bool) -> bool:
    """Whether every node binds one shared home: OPTIONS', or as the lab had it; a running
    lab cannot change it."""
    shared = (
        bool(state and state.get("shared_home"))
        if options.shared_home is None
        else options.shared_home
    )
    if running and state and bool(state.get("shared_home")) != shared:
        raise InputError(
            f"lab {name} is up with {'one shared' if not shared else 'private'} "
            f"home{'s' if shared else ''}",
            hint="run `invoke lab.down` first to change it",
        )
    return shared


def _nic_names(name: str, options: UpOptions, state: dict | None, running: bool) -> tuple[str, ...]:
    """The interface names the nodes get in turn: OPTIONS', or as the lab had them; a running
    lab cannot change them."""
    nics = (
        tuple((state or {}).get("nic_names") or ())
        if options.nic_names is None
        else tuple(options.nic_names)
    )
    bad = [n for n in nics if not re.fullmatch(r"[a-z][a-z0-9]{0,9}", n) or n == "lo"]
    if bad:
        raise InputError(f"--nic-names: {bad[0]!r} is not an interface name (a-z0-9, at most 10)")
    if running and state and tuple(state.get("nic_names") or ()) != nics:
        raise InputError(
            f"lab {name} is up with other interface names",
            hint="run `invoke lab.down` first to change them",
        )
    return nics
