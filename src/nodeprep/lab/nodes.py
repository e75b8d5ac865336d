"""Operations on one node of a running lab, for tests and deliberate tampering: run a
command inside it, stop or restart it, give it a new host key, let it take a password,
take the lab key out of its authorized_keys. The package (__init__.py) exports them all.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from nodeprep.errors import InputError, NodeprepError

from . import host, local, net
from .config import LAB_HOME, PASSWORD_FLAG, LabInfo, LabNode

HOST_KEY = "ssh_host_ed25519_key"


def node_shell(info: LabInfo, index: int, command: str) -> subprocess.CompletedProcess:
    """Run COMMAND (a shell string) as root inside node INDEX: its network, mounts (home,
    /etc) and hostname. For tests and deliberate tampering."""
    node = info.nodes[index]
    if not info.rootful:
        return subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True)
    pid = _live_pid(node)
    if pid is None:
        raise NodeprepError(
            f"lab {info.name} {node.name}: sshd is not running",
            hint="restart_node() or `invoke lab.up` brings it back",
        )
    return subprocess.run(
        ["nsenter", "-t", str(pid), "-m", "-u", "-n", "--", "/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        cwd="/",
    )


def _live_pid(node: LabNode) -> int | None:
    # The pid file first: a LabInfo kept across a down/up or restart holds stale pids. The
    # remembered pid covers the moment after a start before sshd has written the file.
    nd = node.home.parent
    pid = net.sshd_pid(nd / "sshd.pid", nd / "sshd_config")
    if (
        pid is None
        and node.sshd_pid
        and net.alive(node.sshd_pid)
        and str(nd / "sshd_config") in " ".join(net.cmdline(node.sshd_pid))
    ):
        pid = node.sshd_pid
    return pid


def stop_node(info: LabInfo, index: int) -> None:
    """Take a node down: every process in it (sshd and all sessions) is killed; its
    address stays, so connections are refused rather than timing out."""
    node = info.nodes[index]
    if not info.rootful:
        return local.stop_node(node)
    pids = net.netns_pids([node.netns])[node.netns]
    net.kill_wait(pids)
    node.sshd_pid = None


def restart_node(info: LabInfo, index: int) -> None:
    """Stop node INDEX (if it runs) and start it again: its sshd rereads its config."""
    node = info.nodes[index]
    stop_node(info, index)
    if not info.rootful:
        return local.start_node(info, node)
    targets = host.start(info.name, [node])
    net.wait_banners(targets)
    node.sshd_pid = targets[0][3].pid  # ip netns exec/unshare/sh all exec: same pid


def regenerate_host_key(info: LabInfo, index: int) -> None:
    """A new host key for one node, as after a reinstall, deliberately NOT pinned: clients
    holding the old pin must refuse the node (the next up() pins the new key)."""
    node_dir = info.nodes[index].home.parent if info.rootful else local.node_dir(info, index)
    for suffix in ("", ".pub"):
        Path(f"{node_dir / HOST_KEY}{suffix}").unlink(missing_ok=True)
    net.keygen([node_dir / HOST_KEY])
    restart_node(info, index)


def _rootful_dir(info: LabInfo, index: int, what: str) -> Path:
    if not info.rootful:
        raise NodeprepError(
            f"lab {info.name}: {what} needs the namespace lab (run as root)",
            hint="the non-root lab's nodes share your user, home and /etc",
        )
    return info.nodes[index].home.parent


# Runs "$2..." with the node's own /etc (directory "$1") bound over /etc, in a mount namespace
# of its own: the account tools then edit that node's passwd/shadow, taking the same lock
# files as a usermod inside the node, whether or not the node runs. (`--prefix` would do
# for usermod, but Debian 12's chpasswd lists it in --help and then rejects it.)
_WITH_ETC = 'mount --bind "$1" /etc && shift && exec "$@"'


def _accounts(nd: Path, argv: list[str], stdin: str | None = None) -> None:
    proc = subprocess.run(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            _WITH_ETC,
            "sh",
            str(nd / "etc"),
            *argv,
        ],
        input=stdin,
        capture_output=True,
        text=True,
        cwd="/",
    )
    if proc.returncode:
        raise NodeprepError(
            f"{argv[0]} for {nd.name} failed: {(proc.stderr or proc.stdout).strip()}"
        )


def _sshd_config(info: LabInfo, index: int) -> bool:
    node = info.nodes[index]
    return net.write_if_changed(node.home.parent / "sshd_config", host.node_sshd_config(node))


def enable_password(info: LabInfo, index: int, password: str) -> None:
    """Let node INDEX, and no other, take password logins for the lab user (as for a first
    contact with --ask-pass): PASSWORD's hash goes into that node's /etc/shadow only, and
    its sshd (listening on that node's address only) gets `PasswordAuthentication yes` and
    is restarted. Key logins keep working. Kept across down/up until disable_password."""
    nd = _rootful_dir(info, index, "password login")
    if not isinstance(password, str) or not password or any(c in password for c in "\r\n\0"):
        raise InputError("lab password must be a non-empty single line")
    # chpasswd reads `user:password` lines from stdin: the password is in no argv. With a
    # crypt method given it hashes by itself, without PAM.
    _accounts(nd, ["chpasswd", "--crypt-method", "SHA512"], f"{info.user}:{password}\n")
    (nd / PASSWORD_FLAG).touch()
    _sshd_config(info, index)
    restart_node(info, index)


def disable_password(info: LabInfo, index: int) -> None:
    """Undo enable_password: the lab user's password field back to `*` (no password, not
    locked, as the lab makes it), password logins off; restarts the node only when its
    sshd took passwords."""
    nd = _rootful_dir(info, index, "password login")
    _accounts(nd, ["usermod", "--password", "*", info.user])
    (nd / PASSWORD_FLAG).unlink(missing_ok=True)
    if _sshd_config(info, index):
        restart_node(info, index)


def remove_authorized_key(info: LabInfo, index: int) -> None:
    """Empty node INDEX's ~/.ssh/authorized_keys (same file, owner and mode), as on a node
    that was never given the lab key: only a password gets in. up() appends the key again."""
    nd = _rootful_dir(info, index, "removing the lab key")
    path = nd / "home" / ".ssh" / "authorized_keys"
    if path.is_symlink():  # root must not truncate what a link points to
        path.unlink()
    elif path.exists():
        with open(path, "r+") as fh:
            fh.truncate(0)


def _halves(address: str) -> list[str]:
    """The lab's /16 as two /17 routes: more specific than the node's own subnet route."""
    base = ".".join(address.split(".")[:2])
    return [f"{base}.0.0/17", f"{base}.128.0/17"]


def silence_node(info: LabInfo, index: int, silent: bool = True) -> None:
    """Make node INDEX silent the way a power loss looks from outside (SILENT=False heals
    it): blackhole routes for the whole lab subnet in its network namespace, so whatever it
    would send (replies, ACKs, RSTs) is dropped without a word. Its processes keep running and
    its open connections stay open on both ends, as with a dead switch port."""
    node = info.nodes[index]
    _rootful_dir(info, index, "silencing a node")
    for net_ in _halves(node.address):
        argv = ["ip", "-n", node.netns, "route", "replace" if silent else "del", "blackhole", net_]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode and silent:
            raise NodeprepError(f"cannot silence {node.name}: {proc.stderr.strip()}")


def _mount(info: LabInfo, index: int, command: str, what: str) -> None:
    proc = node_shell(info, index, command)
    if proc.returncode:
        raise NodeprepError(
            f"lab {info.nodes[index].name}: {what} failed: {(proc.stderr or proc.stdout).strip()}"
        )


def limit_space(
    info: LabInfo, index: int, rel: str = ".nodeprep", size: str | None = "16m"
) -> None:
    """A small file system (a tmpfs of SIZE, owned by the lab user) over ~/REL of node INDEX,
    in the node's mount namespace (what its sshd and sessions see), as a nearly full home looks;
    SIZE None takes it away again (what was below it comes back)."""
    _rootful_dir(info, index, "a small file system")
    path = shlex.quote(f"{LAB_HOME}/{rel}")
    if size is None:
        _mount(info, index, f"umount {path}", "unmounting the small file system")
        return
    user = shlex.quote(info.user)
    _mount(
        info,
        index,
        f"runuser -u {user} -- mkdir -p {path} && "
        f"mount -t tmpfs -o size={shlex.quote(size)},mode=0700 tmpfs {path} && "
        f"chown {user}: {path}",
        "mounting a small file system",
    )


def readonly_home(info: LabInfo, index: int, readonly: bool = True) -> None:
    """Node INDEX's home remounted read-only (READONLY=False: read-write again), as after a
    file server's error or a full quota enforcement turned read-only."""
    _rootful_dir(info, index, "a read-only home")
    path = shlex.quote(str(LAB_HOME))
    _mount(
        info,
        index,
        f"mount -o remount,bind,{'ro' if readonly else 'rw'} {path}",
        "remounting the home",
    )


def limit_shm(info: LabInfo, index: int, size: str | None = "64m") -> None:
    """Node INDEX's /dev/shm a tmpfs of SIZE (Docker's default is 64m), in its own mount
    namespace; SIZE None takes it away (the host's /dev/shm shows again)."""
    _rootful_dir(info, index, "a small /dev/shm")
    if size is None:
        _mount(info, index, "umount /dev/shm", "unmounting the small /dev/shm")
        return
    _mount(
        info,
        index,
        f"mount -t tmpfs -o size={shlex.quote(size)},mode=1777 tmpfs /dev/shm",
        "mounting a small /dev/shm",
    )


def limit_memlock(info: LabInfo, index: int, kib: int | None = 64) -> None:
    """The soft locked-memory limit of node INDEX's sshd, so every new session has it, as on a
    node without the cluster's limits.d line; KIB None: back up to the hard limit (only the
    soft one moves: raising a hard limit needs CAP_SYS_RESOURCE, which a container may lack)."""
    node = info.nodes[index]
    _rootful_dir(info, index, "a memlock limit")
    pid = _live_pid(node)
    if pid is None:
        raise NodeprepError(f"lab {node.name}: its sshd does not run")
    if kib is None:
        hard = (
            subprocess.run(
                ["prlimit", "--pid", str(pid), "--memlock", "--raw", "--noheadings", "-o", "HARD"],
                capture_output=True,
                text=True,
            ).stdout.strip()
            or "unlimited"
        )
        value = hard
    else:
        value = str(int(kib) * 1024)
    proc = subprocess.run(
        ["prlimit", "--pid", str(pid), f"--memlock={value}:"], capture_output=True, text=True
    )
    if proc.returncode:
        raise NodeprepError(f"lab {node.name}: prlimit failed: {proc.stderr.strip()}")


def limit_link(info: LabInfo, index: int, rate: str | None = "20mbit") -> None:
    """Node INDEX's link limited to RATE both ways (tc on both ends of its veth), as a node on
    a slower or failing link; None: unlimited again (the lab's --link-rate, if any, is not
    restored: lab.up restores it)."""
    node = info.nodes[index]
    _rootful_dir(info, index, "a limited link")
    out = subprocess.run(
        ["ip", "-n", node.netns, "-o", "link", "show"], capture_output=True, text=True
    ).stdout
    nics = [
        ln.split(":")[1].strip().split("@")[0]
        for ln in out.splitlines()
        if ln.split(":")[1].strip() != "lo"
    ]
    if not nics:
        raise NodeprepError(f"lab {node.name}: no interface in {node.netns}")
    net.limit_links([(node.netns, nics[0])], rate or "")
