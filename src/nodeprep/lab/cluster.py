"""The lab as a whole: up (the nodes, the network, each node's files and sshd, Slurm,
pinned host keys, the inventory), down and status. The parts it puts together are the
package's other modules (see __init__.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections import Counter
from pathlib import Path

from nodeprep.engine.hostkeys import PinnedHostKeys, host_entry
from nodeprep.errors import InputError, NodeprepError
from nodeprep.settings import Settings

from . import bastion, containers, etc, foreign, gpu, host, local, modules, net, registry, slurm
from .config import (
    LAB_HOME,
    LAB_USER,
    PREFIX,
    LabInfo,
    UpOptions,
    bridge_address,
    bridge_name,
    hosts_text,
    lab_network,
    netns_name,
    node_address,
    node_mac,
    node_name,
    pubkey,
    validate_count,
    validate_name,
)
from .lab_inventory import inventory_path, inventory_text
from .nodes import HOST_KEY
from .state import STATE, _lab_dir, _node, _ours, _read_state, _sshd_pid, _Up, _up_state

# -- up ------------------------------------------------------------------------------------


def up(
    nodes: int,
    name: str = "local",
    settings: Settings = Settings(),
    options: UpOptions = UpOptions(),
    log=print,
) -> LabInfo:
    """Bring lab NAME to exactly NODES running nodes (adding, removing or restarting only
    what differs) and write its inventory. OPTIONS: where the inventory goes, the subnet,
    and whether a real Slurm runs over the nodes (slurm.py; None keeps what the lab had)."""
    validate_name(name)
    validate_count(nodes)
    if os.geteuid() != 0:
        if options.slurm or options.arch:
            raise InputError(
                f"lab --{'slurm' if options.slurm else 'arch'} needs root (slurmd and "
                "foreign roots run inside each node's namespaces)"
            )
        return local.up(nodes, name, settings, options.inventory_dir, log)
    net.require_tools()
    t0 = time.monotonic()
    state = _up_state(nodes, name, settings, options)
    ids = host.ensure_user(state.changes)
    pub = _controller_key(state)
    state.changes += foreign.converge(state.lab, set(state.arches.values()), log)
    fresh = _network(state)
    _node_files(state, pub, ids)
    _start_sshds(state, fresh)
    _slurm(state)
    containers.prepare_all(state.nodes(), state.containers, ids, _sshd_pid)
    modules.prepare_all(state.nodes(), state.modules, _sshd_pid)
    _pin_host_keys(state, settings)
    bastion.converge(state, ids, pub, PinnedHostKeys(settings.known_hosts))
    inventory = _write_inventory(state, options.inventory_dir, settings.project)
    net.write_if_changed(state.lab / STATE, _state_text(state, inventory))
    if state.changes:
        log(
            f"lab {name}: {nodes} nodes up on {lab_network(state.octet)} in "
            f"{time.monotonic() - t0:.2f} s ({'; '.join(_fold(state.changes))})"
        )
    else:
        log(f"lab {name}: {nodes} nodes already up")
    return status(name, settings)


def _state_text(state: _Up, inventory: Path) -> str:
    """lab.json: what later up()s keep (subnet, shape, options)."""
    return (
        json.dumps(
            {
                "subnet": state.octet,
                "nodes": state.count,
                "inventory": str(inventory),
                "slurm": state.slurm,
                "shared_home": state.shared_home,
                "aliases": state.aliases,
                "nic_names": list(state.nics),
                "link_rate": state.link_rate,
                "gpu_records": {str(k): v for k, v in state.gpu_records.items()},
                "bastion": state.bastion,
                "arch": {str(k): v for k, v in state.arches.items()},
                "containers": state.containers,
                "modules": state.modules,
            }
        )
        + "\n"
    )


def _controller_key(state: _Up) -> str:
    """The lab directory (0700) and the controller key in it; returns the public key line."""
    state.lab.mkdir(parents=True, exist_ok=True)
    os.chmod(state.lab, 0o700)
    if not state.key.exists():
        net.keygen([state.key], f"nodeprep-lab-{state.name}")
        state.changes.append("made controller key")
    return Path(f"{state.key}.pub").read_text()


def _network(state: _Up) -> list[int]:
    """Nodes past the count removed; the bridge and each node's namespace, veth and address
    made where missing (a namespace half-made by an interrupted up is made again). Returns
    the indices of the nodes whose namespace is new."""
    present = _ours(state.name)
    extra = [ns for i, ns in sorted(present.items()) if i >= state.count]
    if extra:
        host.remove(extra)
        state.changes.append(f"removed {len(extra)} nodes")
    batch = [] if state.running else _bridge_batch(state)
    fresh = []
    for i in range(state.count):
        ns = netns_name(state.name, i)
        if i in present and net.link_exists(ns):
            continue
        if i in present:  # half-made by an interrupted up: redo it
            host.remove([ns])
        elif net.link_exists(ns):
            batch.append(f"link del {ns}")
        batch += [
            f"netns add {ns}",
            f"link add {ns} type veth peer name {state.nic(i)} address "
            f"{node_mac(node_address(state.octet, i))} netns {ns}",
            f"link set {ns} master {bridge_name(state.name)} up",
        ]
        fresh.append(i)
    net.ip_batch(batch)
    # No `route add default`: the lab's /16 is all a node can reach.
    net.ip_batch_each(
        {
            netns_name(state.name, i): [
                "link set lo up",
                f"addr add {node_address(state.octet, i)}/{PREFIX} dev {state.nic(i)}",
                f"link set {state.nic(i)} up",
            ]
            for i in fresh
        }
    )
    if fresh:
        state.changes.append(f"made {len(fresh)} node namespaces")
    state.changes += filter(
        None, [net.raise_neigh_table(net.lab_namespaces())]
    )  # one ARP table for all
    todo = (
        range(state.count)
        if state.link_rate != state.had_rate
        else (fresh if state.link_rate else [])
    )
    if todo:  # each node's link limited both ways (a new rate replaces the old)
        net.limit_links([(netns_name(state.name, i), state.nic(i)) for i in todo], state.link_rate)
        state.changes.append(f"link rate {state.link_rate or 'unlimited'} on {len(todo)} nodes")
    return fresh


def _bridge_batch(state: _Up) -> list[str]:
    """The `ip` lines that make the lab's bridge, once its subnet is known to be free."""
    bridge = bridge_name(state.name)
    host.check_subnet_free(state.octet, bridge)
    return [
        f"link add {bridge} type bridge",
        f"addr add {bridge_address(state.octet)}/{PREFIX} dev {bridge}",
        f"link set {bridge} up",
    ]


def _node_files(state: _Up, pub: str, ids: tuple[int, int]) -> None:
    """Each node's directory: its /etc copy (made, or refreshed from the host), home, ~/.ssh
    with the lab key, the lab's files in its /etc, sshd_config and host key."""
    hosts = hosts_text(state.octet, state.count, state.aliases)
    dirs = [state.lab / node_name(i) for i in range(state.count)]
    for nd in dirs:
        nd.mkdir(exist_ok=True)
    host.home_shape(state.nodes(), state.lab / "shared-home", state.shared_home, state.changes)
    roots = {i: foreign.root(a) for i, a in state.arches.items()}  # built by converge()
    sources = {dirs[i]: r / "etc" for i, r in roots.items()}
    made = etc.make(dirs, sources)
    if made:
        state.changes.append(f"copied /etc for {len(made)} nodes")
    if etc.refresh([nd for nd in dirs if nd not in made], sources):
        state.changes.append("refreshed node /etc from the host")
    state.changes += [
        f"{node_name(i)}: lab user added to its {state.arches[i]} /etc"
        for i in roots
        if etc.add_user(dirs[i], LAB_USER)
    ]
    containers.converge(state.nodes(), state.containers, ids, state.changes, _sshd_pid)
    modules.converge(state.nodes(), state.modules, state.changes)
    for node in state.nodes():
        host.prepare_node(node, hosts, pub, ids, state.changes, node.index not in state.no_sudo)
        if gpu.install(node.home.parent, state.gpu_records.get(node.index)):
            state.changes.append(
                f"{node.name}: GPU recording {state.gpu_records.get(node.index) or 'removed'}"
            )
    missing = [nd / HOST_KEY for nd in dirs]
    net.keygen([p for p in missing if not p.exists()])


def _start_sshds(state: _Up, fresh: list[int]) -> None:
    """Start every node sshd that does not run as it should, and wait for their banners."""
    starts = [i for i in range(state.count) if not _sshd_keeps_running(state, i, fresh)]
    net.wait_banners(host.start(state.name, [state.node(i) for i in starts]))
    if starts:
        state.changes.append(f"started {len(starts)} sshds")


def _sshd_keeps_running(state: _Up, i: int, fresh: list[int]) -> bool:
    """Whether node I's sshd runs and may go on; one that may not is stopped here."""
    node = state.node(i)
    pid = _sshd_pid(node)
    if pid is None:
        return False
    if i in fresh:  # an sshd left in a namespace that is gone
        net.kill_wait([pid])
        return False
    if not foreign.runs_as(pid, node.arch):  # started as the other architecture
        net.kill_wait(sorted({pid, *net.netns_pids([node.netns])[node.netns]}))
        return False
    if not etc.mounted(pid, node.home.parent) or not gpu.bound(pid, node.home.parent):
        # Started before nodes had their own /etc (or /usr/local/bin): it runs on the host's.
        # Restart it with its sessions, as stop_node does.
        net.kill_wait(sorted({pid, *net.netns_pids([node.netns])[node.netns]}))
        state.changes.append(f"restarted {node.name} on its own /etc and /usr/local/bin")
        return False
    return True


def _slurm(state: _Up) -> None:
    """Slurm over the nodes (slurm.up converges it), or stopped when the lab goes without."""
    if state.slurm:
        slurm.up(
            state.name,
            state.lab,
            state.octet,
            [
                (node.name, node.address, _sshd_pid(node), node.home.parent)
                for node in state.nodes()
            ],
            state.changes,
        )
    elif slurm.stop(state.name, state.lab):
        state.changes.append("stopped Slurm")


def _pin_host_keys(state: _Up, settings: Settings) -> None:
    """Pin every node's host key in the project's known_hosts: the lab made those keys."""
    store = PinnedHostKeys(settings.known_hosts)
    for node in state.nodes():
        if store.pin(host_entry(node.address, 22), pubkey(node.home.parent / f"{HOST_KEY}.pub")):
            state.changes.append(f"pinned {node.name}")


def _write_inventory(state: _Up, inventory_dir: Path | None, root: Path) -> Path:
    """The lab's hosts.yml (in INVENTORY_DIR, or the project's inventory/NAME/)."""
    inventory = inventory_path(state.name, inventory_dir, root)
    inventory.parent.mkdir(parents=True, exist_ok=True)
    hostlist = [
        (node.name, node.address, 22, *([node.arch] if node.arch else [])) for node in state.nodes()
    ]
    hostlist += [
        (
            node_name(state.count + k),
            state.node(k).address,
            22,
            *([state.arches[k]] if k in state.arches else []),
        )
        for k in range(state.aliases)
    ]
    jump = f"{LAB_USER}@{bastion.address(state.octet)}" if state.bastion else None
    prefix = "" if state.name == "local" else f"{state.name}-"
    if net.write_if_changed(
        inventory, inventory_text(LAB_USER, state.key, hostlist, jump=jump, alias_prefix=prefix)
    ):
        state.changes.append(f"wrote {inventory}")
    return inventory


def _fold(changes: list[str]) -> list[str]:
    counts = Counter(re.sub(r"worker-\d+", "node", c) for c in changes)
    return [f"{c} x{n}" if n > 1 else c for c, n in counts.items()]


def down(
    name: str = "local", settings: Settings = Settings(), log=print, purge: bool = False
) -> None:
    """Stop every node of lab NAME and remove its network; homes, node /etc copies (login
    shells, passwords) and host keys are kept unless PURGE (then the lab directory, its
    inventory and its pins go too)."""
    validate_name(name)
    if os.geteuid() != 0:
        return local.down(name, settings, log, purge)
    net.require_tools()
    t0 = time.monotonic()
    lab, bridge = _lab_dir(settings, name), bridge_name(name)
    nss = list(_ours(name).values()) + bastion.down(name)
    if slurm.stop(name, lab):
        log(f"lab {name}: Slurm stopped")
    if registry.stop(lab):
        log(f"lab {name}: its registry stopped")
    if not nss and not net.link_exists(bridge):
        log(f"lab {name} is not up")
    else:
        host.remove(nss)
        if net.link_exists(bridge):
            net.ip_batch([f"link del {bridge}"])
        for pidfile in lab.glob("worker-*/sshd.pid"):
            pidfile.unlink(missing_ok=True)
        # The node bind mounts live only in the nodes' mount namespaces, gone with their
        # processes; one showing here would mean a node leaked into the host namespace.
        leaked = net.leaked_mounts(lab, (str(LAB_HOME),))
        if leaked:
            raise NodeprepError(f"lab {name}: mounts left after down: {', '.join(leaked)}")
        log(f"lab {name}: {len(nss)} nodes down in {time.monotonic() - t0:.2f} s")
    for line in foreign.release(lab, lambda arch: _others_run(arch, name, settings)):
        log(f"lab {name}: {line}")
    state = _read_state(lab)
    if state and host.forget_ssh_blocks(Path(state["inventory"]), Path(settings.project)):
        log(f"lab {name}: its block removed from ~/.ssh/config")
    if purge:
        _purge(name, lab, settings, log)


def _others_run(arch: str, name: str, settings: Settings) -> bool:
    """Whether a lab other than NAME is up with nodes of ARCH."""
    return any(
        arch in (_read_state(o) or {}).get("arch", {}).values()
        and net.link_exists(bridge_name(o.name))
        for o in Path(settings.lab_root).glob("*")
        if o.name != name
    )


def _purge(name: str, lab: Path, settings: Settings, log) -> None:
    state = _read_state(lab)
    store = PinnedHostKeys(settings.known_hosts)
    if state:
        for nd in lab.glob("worker-*"):
            store.forget(host_entry(node_address(state["subnet"], int(nd.name[7:])), 22))
        store.forget(host_entry(bastion.address(state["subnet"]), 22))
        Path(state["inventory"]).unlink(missing_ok=True)
    shutil.rmtree(lab, ignore_errors=True)
    log(f"lab {name}: purged {lab} (homes, /etc copies, host keys, controller key)")


def status(name: str = "local", settings: Settings = Settings()) -> LabInfo | None:
    """The lab as it runs now (None when it is not up); a dead node has sshd_pid None."""
    validate_name(name)
    if os.geteuid() != 0:
        return local.status(name, settings)
    lab = _lab_dir(settings, name)
    state = _read_state(lab)
    if not state or not net.link_exists(bridge_name(name)):
        return None
    present = _ours(name)
    arches = {int(k): v for k, v in (state.get("arch") or {}).items()}
    found = [_node(name, lab, state["subnet"], i, arches.get(i)) for i in range(state["nodes"])]
    for node in found:
        node.sshd_pid = _sshd_pid(node) if node.index in present else None
    b = (
        bastion.node(name, lab, state["subnet"])
        if state.get("bastion") and bastion.exists(name)
        else None
    )
    if b is not None:
        b.sshd_pid = _sshd_pid(b)
    return LabInfo(
        name,
        found,
        LAB_USER,
        key=lab / "id_ed25519",
        inventory=Path(state["inventory"]),
        rootful=True,
        bastion=b,
    )
