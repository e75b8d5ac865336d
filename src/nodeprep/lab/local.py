"""The lab without root: one unprivileged sshd per node on 127.0.0.1, port base+i.

Lower fidelity than the namespace lab, and said so at every up(): an unprivileged sshd
can only log in the user running it, so every "node" is the current user with the same
home, /etc (so login shell, sudoers and password), hostname and address. A mismatch
between nodes (another venv, another ~/.bashrc, another login shell) cannot exist here, so
a parity check cannot catch one either; enable_password and remove_authorized_key refuse.
State is kept under ~/.nodeprep-lab/NAME; the user's own ~/.ssh is left alone
(AuthorizedKeysFile points into the lab directory).
"""

from __future__ import annotations

import getpass
import json
import shutil
import time
from pathlib import Path

from nodeprep.engine.hostkeys import PinnedHostKeys, host_entry
from nodeprep.errors import InputError
from nodeprep.settings import Settings

from . import net
from .config import (
    LOCAL_MAX_NODES,
    MAX_NODES,
    LabInfo,
    LabNode,
    SshdAccess,
    local_port_base,
    node_name,
    pubkey,
    sshd_config,
)
from .lab_inventory import inventory_path, inventory_text

ADDRESS = "127.0.0.1"
HOST_KEY = "ssh_host_ed25519_key"
WARNING = (
    "warning: not root, so lab {name} is {n} sshds on 127.0.0.1 sharing your user, "
    "home, /etc and hostname: lower fidelity than the namespace lab (no per-node "
    "login shell, sudo rule or password login; run as root for per-node homes, "
    "/etc, IPs and hostnames)"
)


def lab_dir(name: str) -> Path:
    return Path.home() / ".nodeprep-lab" / name


def node_dir(info: LabInfo, index: int) -> Path:
    return lab_dir(info.name) / node_name(index)


def local_sshd_config(lab: Path, index: int, port: int, user: str) -> str:
    return sshd_config(
        lab / node_name(index),
        ADDRESS,
        port,
        node=node_name(index),
        login=SshdAccess(user, lab / "authorized_keys"),
    )


def _spawn(name: str, lab: Path, index: int, port: int) -> tuple:
    nd = lab / node_name(index)
    (nd / "sshd.pid").unlink(missing_ok=True)
    proc = net.spawn([net.SSHD, "-D", "-e", "-f", str(nd / "sshd_config")], nd / "sshd.log")
    return (f"lab {name} {node_name(index)}", ADDRESS, port, proc, nd / "sshd.log")


def _pid(nd: Path) -> int | None:
    return net.sshd_pid(nd / "sshd.pid", nd / "sshd_config")


def up(nodes: int, name: str, settings: Settings, inventory_dir, log) -> LabInfo:
    if nodes > LOCAL_MAX_NODES:  # each lab name has a block of LOCAL_MAX_NODES ports
        raise InputError(
            f"--nodes {nodes}: a lab without root holds at most {LOCAL_MAX_NODES} nodes",
            hint=f"run as root for up to {MAX_NODES} (network namespaces, not ports)",
        )
    net.require_tools(ip=False)
    log(WARNING.format(name=name, n=nodes))
    t0 = time.monotonic()
    user = getpass.getuser()
    lab = lab_dir(name)
    base = local_port_base(name)
    lab.mkdir(parents=True, exist_ok=True)
    lab.chmod(0o700)
    key = lab / "id_ed25519"
    net.keygen([key], f"nodeprep-lab-{name}")
    net.write_if_changed(lab / "authorized_keys", Path(f"{key}.pub").read_text(), 0o600)
    for nd in lab.glob("worker-*"):
        if int(nd.name[7:]) >= nodes and (pid := _pid(nd)):
            net.kill_wait([pid])
    for i in range(nodes):
        (lab / node_name(i)).mkdir(exist_ok=True)
        net.write_if_changed(
            lab / node_name(i) / "sshd_config", local_sshd_config(lab, i, base + i, user)
        )
    net.keygen([lab / node_name(i) / HOST_KEY for i in range(nodes)])
    starts = [i for i in range(nodes) if _pid(lab / node_name(i)) is None]
    net.wait_banners([_spawn(name, lab, i, base + i) for i in starts])
    store = PinnedHostKeys(settings.known_hosts)
    for i in range(nodes):
        store.pin(host_entry(ADDRESS, base + i), pubkey(lab / node_name(i) / f"{HOST_KEY}.pub"))
    inventory = inventory_path(name, inventory_dir, settings.project)
    inventory.parent.mkdir(parents=True, exist_ok=True)
    net.write_if_changed(
        inventory,
        inventory_text(user, key, [(node_name(i), ADDRESS, base + i) for i in range(nodes)]),
    )
    net.write_if_changed(
        lab / "lab.json", json.dumps({"nodes": nodes, "inventory": str(inventory)}) + "\n"
    )
    if starts:
        log(
            f"lab {name}: {nodes} nodes up on {ADDRESS}:{base}-{base + nodes - 1} "
            f"(started {len(starts)}) in {time.monotonic() - t0:.2f} s"
        )
    else:
        log(f"lab {name}: {nodes} nodes already up")
    return status(name, settings)


def down(name: str, settings: Settings, log, purge: bool = False) -> None:
    lab = lab_dir(name)
    pids = [p for nd in lab.glob("worker-*") if (p := _pid(nd))]
    net.kill_wait(pids)
    log(f"lab {name}: {len(pids)} nodes down" if pids else f"lab {name} is not up")
    if purge and lab.exists():
        state = json.loads((lab / "lab.json").read_text()) if (lab / "lab.json").exists() else {}
        store = PinnedHostKeys(settings.known_hosts)
        for nd in lab.glob("worker-*"):
            store.forget(host_entry(ADDRESS, local_port_base(name) + int(nd.name[7:])))
        if state.get("inventory"):
            Path(state["inventory"]).unlink(missing_ok=True)
        shutil.rmtree(lab, ignore_errors=True)


def status(name: str, settings: Settings) -> LabInfo | None:
    lab = lab_dir(name)
    try:
        state = json.loads((lab / "lab.json").read_text())
    except (OSError, ValueError):
        return None
    base = local_port_base(name)
    nodes = [
        LabNode(
            node_name(i),
            i,
            ADDRESS,
            port=base + i,
            netns=None,
            home=Path.home(),
            sshd_pid=_pid(lab / node_name(i)),
        )
        for i in range(state["nodes"])
    ]
    if not any(n.sshd_pid for n in nodes):
        return None
    return LabInfo(
        name,
        nodes,
        getpass.getuser(),
        key=lab / "id_ed25519",
        inventory=Path(state["inventory"]),
        rootful=False,
    )


def stop_node(node: LabNode) -> None:
    if node.sshd_pid:
        net.kill_wait([node.sshd_pid])
    node.sshd_pid = None


def start_node(info: LabInfo, node: LabNode) -> None:
    target = _spawn(info.name, lab_dir(info.name), node.index, node.port)
    net.wait_banners([target])
    node.sshd_pid = target[3].pid
