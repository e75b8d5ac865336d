"""The emulated lab cluster: one network namespace, one sshd and one private home per node.

Rootful (the real thing, see /work/shared/reference/lab-recipe.md): lab NAME is a bridge
`np-NAME` on 10.X.0.0/24 and, per node, a netns `np-NAME-I` whose eth0 is 10.X.0.(10+I),
with no default route, so nothing inside can reach past the lab. Each node's sshd runs in
its own mount and UTS namespaces where the one lab user's home (/home/nodeprep, the same
path everywhere) and /etc are bind mounts of that node's own directories: same user and
paths, different contents (login shell, password, /etc/hosts), IPs and hostnames, as on a
real cluster. Every node's /etc (lab_etc) offers bash, zsh and tcsh in /etc/shells and
lets the lab user `sudo -n usermod -s SHELL nodeprep` (its own shell, nothing else), as a
cloud image's default user could. Node operations (node_shell, stop/restart, host key,
password login, authorized_keys) are in lab_nodes and exported here.
Without root, lab_local gives a lower-fidelity stand-in (sshds on 127.0.0.1 ports).

Everything the lab keeps lives in <lab_root>/NAME (0700: nodes must not read each other's
files through it): the controller key, and per node its home, /etc, host key, sshd config,
pid file and log. Homes, /etc and host keys survive down/up (only purge removes them); host
keys are pinned in the project's known_hosts by up(), since the lab made them.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections import Counter
from pathlib import Path

from . import lab_etc, lab_host, lab_local, lab_net, lab_slurm
from .errors import InputError, NodeprepError
from .hostkeys import KnownHosts, host_entry
from .lab_config import (LAB_HOME, LAB_USER, LabInfo, LabNode, bridge_address, bridge_name,
                         hosts_text, inventory_path, inventory_text, netns_name, node_address,
                         node_name, pubkey, subnet_for, validate_count, validate_name)
from .lab_nodes import (HOST_KEY, disable_password, enable_password, node_shell,
                        regenerate_host_key, remove_authorized_key, restart_node, stop_node)
from .settings import Settings

__all__ = ["LabInfo", "LabNode", "up", "down", "status", "node_shell", "stop_node",
           "restart_node", "regenerate_host_key", "enable_password", "disable_password",
           "remove_authorized_key"]

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
    return {int(m.group(1)): ns for ns in lab_net.netns_list() if (m := pat.fullmatch(ns))}


def up(nodes: int, name: str = "local", settings: Settings = Settings(),
       inventory_dir: Path | None = None, subnet: int | None = None, log=print,
       slurm: bool | None = None) -> LabInfo:
    """Bring lab NAME to exactly NODES running nodes (adding, removing or restarting only
    what differs) and write its inventory. SLURM: also run a real Slurm over the nodes
    (lab_slurm); None keeps what the lab had."""
    validate_name(name)
    validate_count(nodes)
    if os.geteuid() != 0:
        if slurm:
            raise InputError("lab --slurm needs root (slurmd runs inside each node's namespaces)")
        return lab_local.up(nodes, name, settings, inventory_dir, log)
    lab_net.require_tools()
    t0 = time.monotonic()
    lab, bridge = _lab_dir(settings, name), bridge_name(name)
    state, running = _read_state(lab), lab_net.link_exists(bridge)
    if slurm is None:
        slurm = bool(state and state.get("slurm"))
    if slurm:
        lab_slurm.require()
    octet = subnet_for(name, subnet)
    if running and state and state["subnet"] != octet:
        if subnet is not None:
            raise InputError(f"lab {name} is up on 10.{state['subnet']}.0.0/24",
                             hint="run `invoke lab.down` first to move it")
        octet = state["subnet"]
    if running:
        lab_host.check_bridge(bridge, octet)
    changes: list[str] = []
    ids = lab_host.ensure_user(changes)
    lab.mkdir(parents=True, exist_ok=True)
    os.chmod(lab, 0o700)
    key = lab / "id_ed25519"
    if not key.exists():
        lab_net.keygen([key], f"nodeprep-lab-{name}")
        changes.append("made controller key")
    pub = Path(f"{key}.pub").read_text()

    present = _ours(name)
    extra = [ns for i, ns in sorted(present.items()) if i >= nodes]
    if extra:
        lab_host.remove(extra)
        changes.append(f"removed {len(extra)} nodes")
    batch, fresh = [], []
    if not running:
        lab_host.check_subnet_free(octet, bridge)
        batch += [f"link add {bridge} type bridge", f"addr add {bridge_address(octet)}/24 "
                  f"dev {bridge}", f"link set {bridge} up"]
    for i in range(nodes):
        ns = netns_name(name, i)
        if i in present and lab_net.link_exists(ns):
            continue
        if i in present:                     # half-made by an interrupted up: redo it
            lab_host.remove([ns])
        elif lab_net.link_exists(ns):
            batch.append(f"link del {ns}")
        batch += [f"netns add {ns}", f"link add {ns} type veth peer name eth0 netns {ns}",
                  f"link set {ns} master {bridge} up"]
        fresh.append(i)
    lab_net.ip_batch(batch)
    # No `route add default`: the lab's /24 is all a node can reach.
    lab_net.ip_batch_each({netns_name(name, i): [
        "link set lo up", f"addr add {node_address(octet, i)}/24 dev eth0",
        "link set eth0 up"] for i in fresh})
    if fresh:
        changes.append(f"made {len(fresh)} node namespaces")

    hosts = hosts_text(octet, nodes)
    dirs = [lab / node_name(i) for i in range(nodes)]
    for nd in dirs:
        nd.mkdir(exist_ok=True)
    made = lab_etc.make(dirs)
    if made:
        changes.append(f"copied /etc for {len(made)} nodes")
    if lab_etc.refresh([nd for nd in dirs if nd not in made]):
        changes.append("refreshed node /etc from the host")
    for i in range(nodes):
        lab_host.prepare_node(lab, i, octet, hosts, pub, ids, changes)
    missing = [lab / node_name(i) / HOST_KEY for i in range(nodes)]
    missing = [p for p in missing if not p.exists()]
    lab_net.keygen(missing)
    starts = []
    for i in range(nodes):
        nd = lab / node_name(i)
        pid = lab_net.sshd_pid(nd / "sshd.pid", nd / "sshd_config")
        if pid and i in fresh:               # an sshd left in a namespace that is gone
            lab_net.kill_wait([pid])
            pid = None
        elif pid and not lab_etc.mounted(pid, nd):
            # Started before nodes had their own /etc: it runs on the host's. Restart it
            # with its sessions, as stop_node does.
            ns = netns_name(name, i)
            lab_net.kill_wait(sorted({pid, *lab_net.netns_pids([ns])[ns]}))
            changes.append(f"restarted {node_name(i)} on its own /etc")
            pid = None
        if pid is None:
            starts.append(i)
    lab_net.wait_banners(lab_host.start(name, lab, octet, starts))
    if starts:
        changes.append(f"started {len(starts)} sshds")

    if slurm:
        lab_slurm.up(name, lab, octet, [(node_name(i), node_address(octet, i),
                                         lab_net.sshd_pid(lab / node_name(i) / "sshd.pid",
                                                          lab / node_name(i) / "sshd_config"),
                                         lab / node_name(i)) for i in range(nodes)], changes)
    elif lab_slurm.stop(name, lab):
        changes.append("stopped Slurm")
    store = KnownHosts(settings.known_hosts)
    for i in range(nodes):
        if store.pin(host_entry(node_address(octet, i), 22),
                     pubkey(lab / node_name(i) / f"{HOST_KEY}.pub")):
            changes.append(f"pinned {node_name(i)}")
    inventory = inventory_path(name, inventory_dir)
    inventory.parent.mkdir(parents=True, exist_ok=True)
    hostlist = [(node_name(i), node_address(octet, i), 22) for i in range(nodes)]
    if lab_net.write_if_changed(inventory, inventory_text(LAB_USER, key, hostlist)):
        changes.append(f"wrote {inventory}")
    lab_net.write_if_changed(lab / STATE, json.dumps(
        {"subnet": octet, "nodes": nodes, "inventory": str(inventory), "slurm": slurm}) + "\n")
    if changes:
        log(f"lab {name}: {nodes} nodes up on 10.{octet}.0.0/24 in "
            f"{time.monotonic() - t0:.2f} s ({'; '.join(_fold(changes))})")
    else:
        log(f"lab {name}: {nodes} nodes already up")
    return status(name, settings)


def _fold(changes: list[str]) -> list[str]:
    counts = Counter(re.sub(r"worker-\d+", "node", c) for c in changes)
    return [f"{c} x{n}" if n > 1 else c for c, n in counts.items()]


def down(name: str = "local", settings: Settings = Settings(), log=print,
         purge: bool = False) -> None:
    """Stop every node of lab NAME and remove its network; homes, node /etc copies (login
    shells, passwords) and host keys are kept unless PURGE (then the lab directory, its
    inventory and its pins go too)."""
    validate_name(name)
    if os.geteuid() != 0:
        return lab_local.down(name, settings, log, purge)
    lab_net.require_tools()
    t0 = time.monotonic()
    lab, bridge = _lab_dir(settings, name), bridge_name(name)
    nss = list(_ours(name).values())
    if lab_slurm.stop(name, lab):
        log(f"lab {name}: Slurm stopped")
    if not nss and not lab_net.link_exists(bridge):
        log(f"lab {name} is not up")
    else:
        lab_host.remove(nss)
        if lab_net.link_exists(bridge):
            lab_net.ip_batch([f"link del {bridge}"])
        for pidfile in lab.glob("worker-*/sshd.pid"):
            pidfile.unlink(missing_ok=True)
        # The node bind mounts live only in the nodes' mount namespaces, gone with their
        # processes; one showing here would mean a node leaked into the host namespace.
        leaked = lab_net.leaked_mounts(lab, (str(LAB_HOME),))
        if leaked:
            raise NodeprepError(f"lab {name}: mounts left after down: {', '.join(leaked)}")
        log(f"lab {name}: {len(nss)} nodes down in {time.monotonic() - t0:.2f} s")
    if purge:
        _purge(name, lab, settings, log)


def _purge(name: str, lab: Path, settings: Settings, log) -> None:
    state = _read_state(lab)
    store = KnownHosts(settings.known_hosts)
    if state:
        for nd in lab.glob("worker-*"):
            store.forget(host_entry(node_address(state["subnet"], int(nd.name[7:])), 22))
        Path(state["inventory"]).unlink(missing_ok=True)
    shutil.rmtree(lab, ignore_errors=True)
    log(f"lab {name}: purged {lab} (homes, /etc copies, host keys, controller key)")


def status(name: str = "local", settings: Settings = Settings()) -> LabInfo | None:
    """The lab as it runs now (None when it is not up); a dead node has sshd_pid None."""
    validate_name(name)
    if os.geteuid() != 0:
        return lab_local.status(name, settings)
    lab = _lab_dir(settings, name)
    state = _read_state(lab)
    if not state or not lab_net.link_exists(bridge_name(name)):
        return None
    present = _ours(name)
    nodes = []
    for i in range(state["nodes"]):
        nd = lab / node_name(i)
        pid = lab_net.sshd_pid(nd / "sshd.pid", nd / "sshd_config") if i in present else None
        nodes.append(LabNode(node_name(i), i, node_address(state["subnet"], i), 22,
                             netns_name(name, i), nd / "home", pid))
    return LabInfo(name, nodes, LAB_USER, lab / "id_ed25519", Path(state["inventory"]), True)
