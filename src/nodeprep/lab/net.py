"""Host-side plumbing of the lab: `ip` batches, network namespaces, the processes that
live in them, node sshds, keys and files. Nothing here knows what a lab is for.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from nodeprep.errors import NodeprepError

from .config import tc_lines

SSHD = "/usr/sbin/sshd"
NETNS_DIR = Path("/run/netns")

# Popen objects of the sshds this process started, so that a killed sshd is reaped
# (not left as a zombie) and Python does not warn about a child still running.
_children: dict[int, subprocess.Popen] = {}


def require_tools(ip: bool = True) -> None:
    if not os.access(SSHD, os.X_OK):
        raise NodeprepError("sshd not found: run requirements/bootstrap.sh")
    if ip and shutil.which("ip") is None:
        raise NodeprepError("ip not found: run requirements/bootstrap.sh")


def _ip(args: list[str], lines: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        ["ip", *args, "-batch", "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen, lines: list[str], what: str) -> None:
    _, err = proc.communicate("\n".join(lines) + "\n")
    if proc.returncode:
        first = (err.strip().splitlines() or ["no message"])[0]
        raise NodeprepError(f"ip ({what}) failed: {first}")


def ip_batch(lines: list[str], force: bool = False) -> None:
    """Run host `ip` commands in one process (one fork for a whole lab, not one per link)."""
    if lines:
        _finish(_ip(["-force"] if force else [], lines), lines, "host")


def ip_batch_each(per_netns: dict[str, list[str]]) -> None:
    """One `ip -n NS -batch` per namespace, all running at once."""
    procs = {ns: _ip(["-n", ns], lines) for ns, lines in per_netns.items()}
    for ns, proc in procs.items():
        _finish(proc, per_netns[ns], ns)


def limit_links(links: list[tuple[str, str]], rate: str) -> None:
    """Limit each (netns, interface in it) link to RATE both ways ("" removes the limit): the
    node's egress on its own interface, its ingress on the host end of its veth, which is
    named as the namespace. The bridge and the host's side past it stay unlimited."""
    if rate and shutil.which("tc") is None:
        raise NodeprepError("tc not found (--link-rate needs it): apt-get install iproute2")
    per_ns: dict[str | None, list[str]] = {None: []}
    for ns, nic in links:
        per_ns[None] += tc_lines(ns, rate)
        per_ns[ns] = tc_lines(nic, rate)
    tc_batch(per_ns)


def tc_batch(per_netns: dict[str | None, list[str]]) -> None:
    """One `tc -batch` per namespace (None: the host), all running at once; -force: a line
    that fails (a limit to remove that is not there) does not stop the others."""
    procs = {}
    for ns, lines in per_netns.items():
        if lines:
            argv = ["tc", "-force"] + (["-n", ns] if ns else []) + ["-batch", "-"]
            procs[ns] = (
                subprocess.Popen(
                    argv,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
                lines,
            )
    for ns, (proc, lines) in procs.items():
        _, err = proc.communicate("\n".join(lines) + "\n")
        if proc.returncode and not all("del" in ln for ln in lines):
            first = (err.strip().splitlines() or ["no message"])[0]
            raise NodeprepError(f"tc ({ns or 'host'}) failed: {first}")


NEIGH = Path("/proc/sys/net/ipv4/neigh/default")


def neigh_thresholds(namespaces: int) -> tuple[int, int]:
    """(gc_thresh2, gc_thresh3) that let NAMESPACES lab nodes all talk to each other and to
    the host at once. The kernel's IPv4 neighbour (ARP) table is ONE table for every network
    namespace, capped at gc_thresh3 (1024 by default): a node that logs in to its N-1 peers
    (the mesh check) or a Slurm step tree fills N x N entries, and past the cap the kernel
    drops packets ("neighbour: arp_cache: neighbor table overflow!"): lost Slurm messages
    (a step's completion waits 60 s, the next salloc times out) and 1 s SYN retransmits.
    On a cluster each host has its own table; this only makes the one-kernel lab honest."""
    need = namespaces * (namespaces + 1) + 256
    return need, 2 * need


def lab_namespaces() -> int:
    """How many lab nodes (of every lab) this host holds now."""
    return len([ns for ns in netns_list() if ns.startswith("np-")])


def raise_neigh_table(namespaces: int, root: Path = NEIGH) -> str | None:
    """Raise the host's neighbour table limits to what NAMESPACES nodes need (never lower
    them). Returns a line for lab.up's changes, or None when nothing had to change; a host
    that will not let us write them (a container's read-only /proc/sys) gets a warning line."""
    want2, want3 = neigh_thresholds(namespaces)
    changed = []
    for key, want in (("gc_thresh2", want2), ("gc_thresh3", want3)):
        f = root / key
        try:
            have = int(f.read_text().split()[0])
            if have < want:
                f.write_text(f"{want}\n")
                changed.append(f"{key} {have} -> {want}")
        except (OSError, ValueError, IndexError) as e:
            return (
                f"warning: cannot raise net.ipv4.neigh.default.{key} to {want} "
                f"({e.strerror or e}): "
                f"past ~30 nodes the shared ARP table may overflow and drop packets"
            )
    return f"neighbour table for {namespaces} nodes: {', '.join(changed)}" if changed else None


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_list() -> list[str]:
    try:
        return sorted(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return []


def netns_pids(names: list[str]) -> dict[str, list[int]]:
    """What `ip netns pids NS` prints, for many namespaces in one scan of /proc."""
    wanted = {}
    for ns in names:
        try:
            st = os.stat(NETNS_DIR / ns)
            wanted[(st.st_dev, st.st_ino)] = ns
        except OSError:
            pass
    found: dict[str, list[int]] = {ns: [] for ns in names}
    if not wanted:
        return found
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                st = os.stat(f"/proc/{entry}/ns/net")
            except OSError:
                continue  # gone meanwhile, or a zombie
            ns = wanted.get((st.st_dev, st.st_ino))
            if ns:
                found[ns].append(int(entry))
    return found


def alive(pid: int) -> bool:
    """True while PID runs; a zombie counts as gone (and is reaped when it is ours)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    if stat.rsplit(")", 1)[1].split()[0] != "Z":
        return True
    proc = _children.pop(pid, None)
    if proc is not None:
        proc.poll()
    else:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return False


def kill_wait(pids: list[int], grace: float = 2.0, timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `grace` s; raise if anything still runs after `timeout`."""

    def send(sig, targets):
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    send(signal.SIGTERM, pids)
    start = time.monotonic()
    left, killed = list(pids), False
    while left:
        left = [p for p in left if alive(p)]
        if not left:
            break
        elapsed = time.monotonic() - start
        if elapsed > grace and not killed:
            send(signal.SIGKILL, left)
            killed = True
        if elapsed > timeout:
            raise NodeprepError(f"processes {left} did not exit after SIGKILL")
        time.sleep(0.01)


def leaked_mounts(lab: Path, targets: tuple[str, ...]) -> list[str]:
    """Mounts in this (host) mount namespace that come from LAB or sit on one of TARGETS.
    /proc/self/mountinfo, not /proc/mounts: only mountinfo shows a bind mount's source
    directory (field 4, the root of the mount inside its file system)."""
    under = str(lab).rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        f = line.split()
        root, point = f[3], f[4]
        if point in targets or (root + "/").startswith(under) or (point + "/").startswith(under):
            found.append(f"{root} on {point}")
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def sshd_pid(pidfile: Path, config: Path) -> int | None:
    """The pid in PIDFILE when that process is still the sshd of CONFIG."""
    try:
        pid = int(pidfile.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    # A running sshd rewrites its argv ("sshd: /usr/sbin/sshd -D -e -f CONFIG [listener]
    # ..."), so look for the config path inside the joined command line.
    return pid if alive(pid) and str(config) in " ".join(cmdline(pid)) else None


def spawn(argv: list[str], log: Path) -> subprocess.Popen:
    """Start a node sshd in the background; it outlives this process (own session)."""
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd="/", start_new_session=True
        )
    _children[proc.pid] = proc
    return proc


def _banner(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5) as s:
            s.settimeout(1.0)
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False


def log_tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def wait_banners(
    targets: list[tuple[str, str, int, subprocess.Popen, Path]], timeout: float = 10.0
) -> None:
    """Wait until every (label, address, port, proc, log) answers with an SSH banner."""
    pending = list(targets)
    deadline = time.monotonic() + timeout
    while pending:
        for t in list(pending):
            label, address, port, proc, log = t
            if proc.poll() is not None:
                _children.pop(proc.pid, None)
                raise NodeprepError(
                    f"{label}: sshd exited with {proc.returncode}; log {log}: {log_tail(log)}"
                )
            if _banner(address, port):
                pending.remove(t)
        if pending and time.monotonic() > deadline:
            label, address, port, _, log = pending[0]
            raise NodeprepError(
                f"{label}: sshd on {address}:{port} did not answer within "
                f"{timeout:.0f} s; log {log}: {log_tail(log)}"
            )
        if pending:
            time.sleep(0.01)


def keygen(paths: list[Path], comment: str = "") -> None:
    """Make missing ed25519 keys (no passphrase), all ssh-keygens at once."""
    procs = []
    for path in paths:
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            procs.append(
                (
                    path,
                    subprocess.Popen(
                        [
                            "ssh-keygen",
                            "-q",
                            "-t",
                            "ed25519",
                            "-N",
                            "",
                            "-C",
                            comment or path.parent.name,
                            "-f",
                            str(path),
                        ],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                    ),
                )
            )
    for path, proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise NodeprepError(f"ssh-keygen for {path} failed: {out.strip()}")


def write_if_changed(path: Path, text: str, mode: int = 0o644, owner: tuple | None = None) -> bool:
    """Write TEXT unless already there. Writes in place (same inode): a node's /etc/hosts is a
    bind mount of this file, and a replaced file would leave running nodes on the old one."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)
    if owner:
        os.chown(path, *owner)
    return True
