"""Host-side work of the rootful lab: the lab user, node directories and files, starting
node sshds inside their namespaces and removing nodes. The package's up() and down()
(__init__.py) decide what to do."""

from __future__ import annotations

import ipaddress
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

from nodeprep.engine.steps import without_block
from nodeprep.errors import InputError, NodeprepError

from . import containers, etc, foreign, net
from .config import (
    DENY_FLAG,
    LAB_HOME,
    LAB_USER,
    PASSWORD_FLAG,
    PREFIX,
    LabNode,
    SshdAccess,
    authorized_keys_text,
    bridge_address,
    lab_network,
    node_argv,
    sshd_config,
)


def run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        raise NodeprepError(f"{argv[0]} failed: {(proc.stderr or proc.stdout).strip()}")


def ensure_user(changes: list[str]) -> tuple[int, int]:
    try:
        pw = pwd.getpwnam(LAB_USER)
    except KeyError:
        run(
            [
                "useradd",
                "--home-dir",
                str(LAB_HOME),
                "--no-create-home",
                "--shell",
                "/bin/bash",
                LAB_USER,
            ]
        )
        changes.append(f"added user {LAB_USER}")
        pw = pwd.getpwnam(LAB_USER)
    if pw.pw_shell != "/bin/bash":
        run(["usermod", "--shell", "/bin/bash", LAB_USER])
    shadow = [ln.split(":") for ln in Path("/etc/shadow").read_text().splitlines()]
    if any(f[0] == LAB_USER and f[1].startswith("!") for f in shadow if len(f) > 1):
        # useradd leaves `!`; with UsePAM no, sshd then refuses the account as locked.
        run(["usermod", "-p", "*", LAB_USER])
    LAB_HOME.mkdir(parents=True, exist_ok=True)  # the mount point on every node
    os.chown(LAB_HOME, pw.pw_uid, pw.pw_gid)
    return pw.pw_uid, pw.pw_gid


def check_subnet_free(octet: int, bridge: str) -> None:
    ours = ipaddress.ip_network(lab_network(octet))
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) > 3 and f[1] != bridge and ipaddress.ip_interface(f[3]).network.overlaps(ours):
            raise InputError(
                f"subnet {ours} overlaps {f[3]} on {f[1]}",
                hint="pick another with --subnet X (10.X.0.0/16)",
            )


def check_bridge(bridge: str, octet: int) -> None:
    """A running bridge must be this lab's (a lab left up under another lab_root or
    subnet would otherwise get nodes on the wrong network)."""
    out = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "dev", bridge], capture_output=True, text=True
    ).stdout
    if f" {bridge_address(octet)}/{PREFIX} " not in out:
        raise InputError(
            f"bridge {bridge} is up without {bridge_address(octet)}/{PREFIX}",
            hint="run `invoke lab.down` for this lab name first (a lab made before its subnet "
            "became a /16 has a /24 bridge)",
        )


def prepare_node(
    node: LabNode, hosts: str, pub: str, ids: tuple[int, int], changes: list[str], sudo: bool = True
) -> None:
    """Home, ~/.ssh, the lab's files in the node's /etc and its sshd_config (the node's
    /etc copy itself is made by etc.make before)."""
    home = node.home
    nd = home.parent
    if not home.exists():
        home.mkdir()
        os.chmod(home, 0o700)
        changes.append(f"made {node.name} home")
    os.chown(home, *ids)
    for skel in Path("/etc/skel").glob(".*"):
        if skel.is_file() and not os.path.lexists(home / skel.name):  # no writing via links
            shutil.copy2(skel, home / skel.name)
            os.chown(home / skel.name, *ids)
    ssh = home / ".ssh"
    # The lab works as root on the host: a link the node's user made here must not lead
    # it to chown or write a file of the host's.
    if ssh.is_symlink():
        ssh.unlink()
    ssh.mkdir(exist_ok=True)
    os.chmod(ssh, 0o700)
    os.chown(ssh, *ids)
    for old in ("hosts", "resolv.conf"):  # bound over /etc/* before nodes had an /etc
        (nd / old).unlink(missing_ok=True)
    wrote = [
        ensure_authorized_key(ssh / "authorized_keys", pub, ids),
        etc.write_files(
            nd, node.name, hosts, sudo, foreign.root(node.arch) if node.arch else Path("/")
        ),
        net.write_if_changed(nd / "sshd_config", node_sshd_config(node)),
    ]
    if any(wrote):
        changes.append(f"wrote {node.name} files")


def node_sshd_config(node: LabNode) -> str:
    nd = node.home.parent
    deny = (nd / DENY_FLAG).read_text().strip() if (nd / DENY_FLAG).exists() else None
    text = sshd_config(
        nd,
        node.address,
        node=node.name,
        password=(nd / PASSWORD_FLAG).exists(),
        login=SshdAccess(deny_from=deny),
    )
    runtime = nd / containers.RUNTIME_FLAG  # lab --containers: a login's runtime dir, as
    if runtime.exists():  # pam_systemd sets it (podman keeps its per-login state there)
        head, _, rest = text.partition("\n")
        text = f"{head}\nSetEnv XDG_RUNTIME_DIR={runtime.read_text().strip()}\n{rest}"
    return text


def home_shape(nodes: list[LabNode], shared: Path, on: bool, changes: list[str]) -> None:
    """Shared: each node's home is a link to <lab>/shared-home (the bind mount follows it, so
    every node mounts the one directory, as NFS would give them); private: a directory each.
    A home of the other shape is kept aside as home.private / left to the shared dir."""
    for node in nodes:
        home = node.home
        if on and not home.is_symlink():
            shared.mkdir(mode=0o700, exist_ok=True)
            if home.exists():
                home.rename(home.with_name("home.private"))
            home.symlink_to(shared)
            changes.append(f"shared home for {node.name}")
        elif not on and home.is_symlink():
            home.unlink()
            kept = home.with_name("home.private")
            if kept.exists():
                kept.rename(home)
            changes.append(f"private home for {node.name}")


def ensure_authorized_key(path: Path, pub: str, ids: tuple[int, int]) -> bool:
    """Append the lab key when the file lacks it; whatever else is there stays (a link
    is replaced by a file: see prepare_node)."""
    if path.is_symlink():
        path.unlink()
    try:
        current = path.read_text()
    except FileNotFoundError:
        current = ""
    return net.write_if_changed(path, authorized_keys_text(current, pub), 0o600, ids)


def start(lab_name: str, nodes: list[LabNode]) -> list:
    """Start the sshd of each of NODES inside its namespace; returns what net.wait_banners
    waits for."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # root sshd's privsep dir
    targets = []
    for node in nodes:
        nd = node.home.parent
        (nd / "sshd.pid").unlink(missing_ok=True)
        argv = (
            foreign.node_argv(node, LAB_HOME)
            if node.arch
            else node_argv(node.netns, node.name, nd, node.home, LAB_HOME)
        )
        proc = net.spawn(argv, nd / "sshd.log")
        targets.append(
            (f"lab {lab_name} {node.name}", node.address, node.port, proc, nd / "sshd.log")
        )
    return targets


def remove(nss: list[str], timeout: float = 3.0) -> None:
    """Kill every process of these node namespaces, then delete them (their veths go too)."""
    pids = [p for found in net.netns_pids(nss).values() for p in found]
    net.kill_wait(pids)
    net.ip_batch([f"netns del {ns}" for ns in nss], force=True)
    # The kernel frees deleted namespaces (and the veth pairs in them) in one batch a moment
    # later: much faster than `link del` one by one (~20 ms each), but wait for it so that
    # a caller never sees a half-removed node. A veth still there after TIMEOUT means
    # something else holds its namespace: delete it by hand.
    deadline = time.monotonic() + timeout
    while left := [ns for ns in nss if net.link_exists(ns)]:
        if time.monotonic() > deadline:
            net.ip_batch([f"link del {ns}" for ns in left], force=True)
            break
        time.sleep(0.005)


def forget_ssh_blocks(inventory: Path, project: Path, config: Path = Path("~/.ssh/config")) -> bool:
    """Remove from the controller's ssh config the blocks provision wrote for the lab's
    INVENTORY (the ssh_config role names a block after inventory/NAME, else the inventory's
    path: its file or its directory), so a later lab naming its nodes alike is not refused.
    Everything else in the file is kept byte for byte."""
    path = config.expanduser()
    if not path.is_file():
        return False
    inv = inventory.resolve()
    names = {str(inv), str(inv.parent)}
    if inv.parent.parent == (project / "inventory").resolve():
        names.add(inv.parent.name)
    old = path.read_text()
    new = old
    for name in names:
        new = without_block(new, f"hosts {name}")
    if new == old:
        return False
    tmp = path.with_name(f".{path.name}.nodeprep-lab.tmp")
    tmp.write_text(new)
    os.chmod(tmp, path.stat().st_mode & 0o777)
    os.replace(tmp, path)
    return True
