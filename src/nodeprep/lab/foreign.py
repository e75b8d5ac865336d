"""Lab nodes of another CPU architecture (`lab.up --arch aarch64`, or per node
`--arch worker-1=aarch64`): the HPC case of an x86_64 login node driving aarch64 compute
nodes, on this x86_64 machine.

Such a node's userland is a Debian root of its architecture, built ONCE with mmdebstrap and
cached under ROOTS (keyed by suite, architecture, package list and RECIPE; built into a `.new`
directory and renamed, so a cut-short build is never used). Every process of the node runs
from that root through qemu-user, which the kernel starts by itself for the architecture's
ELF files (a binfmt_misc registration with the F flag: the interpreter is opened when
registered, so it works inside the chroot). `uname -m` on the node says aarch64; its sshd,
shells, python, pip, pdsh and the ranks are all aarch64 programs.

Each node sees the cached root through an overlay of its own (writes land in the node's
directory, `root.upper`), mounted in the node's private mount namespace with the node's own
/etc copy, home, /usr/local/bin, /proc, /sys, /dev and a private /dev/shm over it, then
chroots there and starts the root's sshd. Nothing is mounted in the host's namespace: the
mounts go with the node's processes. The binfmt registration is the one host-wide change:
up() adds it when missing and records that in the lab directory; down() removes it when this
lab added it and no other lab still runs foreign nodes.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

from nodeprep.errors import InputError, NodeprepError

from .binfmt import (
    ARCHES,
    ensure_binfmt,
    mount_binfmt,
    registered,
    unmount_binfmt,
    unregister,
)
from .config import BIN, LabNode

NATIVE = platform.machine()
SUITE = "bookworm"  # the host's Debian release: the same Python minor (3.11)
ROOTS = Path("/var/cache/nodeprep/roots")
ADDED = "binfmt-added"  # in the lab directory: what this lab registered (and mounted)
MOUNTED = "binfmt_misc"  # ... its line when this lab mounted binfmt_misc itself
# What a lab node needs: its sshd and client (the mesh, pdsh's hops), the interpreter nodeprep
# builds the venv from, pdsh for DeepSpeed's launcher, Open MPI for mpirun, sudo and the shells
# for the shell role, ps/ip for the facts.
PACKAGES = (
    "openssh-server",
    "openssh-client",
    "python3",
    "python3-venv",
    "pdsh",
    "openmpi-bin",
    "sudo",
    "procps",
    "iproute2",
    "zsh",
)


def parse(
    values: tuple[str, ...] | None, previous: dict | None, count: int, names: list[str]
) -> dict[int, str]:
    """`--arch` values -> {node index: arch} of the nodes that are not native. None keeps
    what the lab had; ARCH sets every node, NODE=ARCH one node (later values win); the native
    architecture (x86_64 here) or `native` sets it back."""
    if values is None:
        return {int(k): v for k, v in (previous or {}).items() if int(k) < count}
    out: dict[int, str] = {}
    for value in values:
        node, _, arch = str(value).rpartition("=")
        arch = NATIVE if arch == "native" else arch
        if arch != NATIVE and arch not in ARCHES:
            raise InputError(
                f"--arch {value!r}: unknown architecture {arch!r}",
                hint=f"one of {', '.join([NATIVE, *ARCHES])}, or NODE=ARCH for one node",
            )
        if node and node not in names:
            raise InputError(
                f"--arch {value!r}: no node {node!r} in this lab",
                hint=f"the nodes are {names[0]} .. {names[-1]}",
            )
        for i in [names.index(node)] if node else range(count):
            if arch == NATIVE:
                out.pop(i, None)
            else:
                out[i] = arch
    return out


def node_arches(
    lab: str,
    values: tuple[str, ...] | None,
    state: dict | None,
    running: bool,
    count: int,
    names: list[str],
) -> dict[int, str]:
    """The lab's foreign nodes after this up(): --arch VALUES over what the lab had (STATE;
    while it is RUNNING its nodes may not change architecture), with the host tools they
    need checked."""
    state = state or {}
    arches = parse(values, state.get("arch"), count, names)
    was = {int(k): v for k, v in (state.get("arch") or {}).items()}
    moved = [
        names[i] for i in range(min(count, state.get("nodes", 0))) if was.get(i) != arches.get(i)
    ]
    if running and moved:
        raise InputError(
            f"lab {lab}: {moved[0]} runs another architecture now",
            hint="run `invoke lab.down` first to change a node's architecture",
        )
    require(set(arches.values()))
    return arches


def mountable(lab: str, lab_dir: Path, arches: dict[int, str]) -> None:
    """Foreign nodes' roots are overlays under LAB_DIR: a path their mount options can name."""
    odd = sorted(set(str(lab_dir)) & set(",:\\"))
    if arches and odd:
        raise InputError(
            f"lab {lab}: its directory {lab_dir} holds {' '.join(repr(c) for c in odd)}, which an "
            "overlay mount's options cannot name (the aarch64 nodes' roots are overlays)",
            hint="set nodeprep.lab_root (invoke.yaml) to a path without ',' ':' or '\\'",
        )


def require(arches: set[str]) -> None:
    """The host tools foreign nodes need, with the command that installs them."""
    if not arches:
        return
    # arch-test: mmdebstrap runs it for a root of another architecture and stops without it
    # (it is only a Recommends of mmdebstrap)
    missing = [
        t for t in ("mmdebstrap", "arch-test", "qemu-aarch64-static") if shutil.which(t) is None
    ]
    if missing:
        raise InputError(
            f"lab --arch needs {', '.join(missing)}",
            hint="run `sh requirements/bootstrap.sh` "
            "(apt-get install mmdebstrap arch-test qemu-user-static)",
        )


# How the root is built, beside PACKAGES: every maintainer script runs under emulation, so
# what no lab node reads is never unpacked (docs, man pages, translations, and the CA store:
# update-ca-certificates ran twice, 80 s of emulated shell, and no lab node reaches the
# internet), no apt inside (mmdebstrap installs with the host's), and /usr merged by
# mmdebstrap's own hook rather than the usrmerge package's conversion.
RECIPE = (
    "--variant=essential",
    "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
    *(
        f"--dpkgopt=path-exclude=/usr/share/{d}/*"
        for d in ("doc", "man", "info", "locale", "ca-certificates")
    ),
)


def _root_path(arch: str) -> Path:
    recipe = " ".join([*sorted(PACKAGES), *RECIPE])
    key = hashlib.sha256(recipe.encode()).hexdigest()[:10]
    return ROOTS / f"{SUITE}-{ARCHES[arch].debian}-{key}"


def cached_root(arch: str) -> Path | None:
    """ARCH's root when it is built, else None."""
    path = _root_path(arch)
    return path if (path / "usr" / "bin" / "python3").exists() else None


def root(arch: str, log=print) -> Path:
    """The cached root of ARCH, built first if missing (minutes: every package's scripts run
    under emulation). One build at a time on a machine: a second caller waits for the first
    one's root (a lock beside ROOTS)."""
    if cached_root(arch) is not None:
        return cached_root(arch)
    ROOTS.mkdir(parents=True, exist_ok=True)
    with open(ROOTS / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return cached_root(arch) or _build(arch, log)


def _build(arch: str, log) -> Path:
    a = ARCHES[arch]
    path = _root_path(arch)
    ensure_binfmt(arch)
    ROOTS.mkdir(parents=True, exist_ok=True)
    new = path.with_name(path.name + ".new")
    shutil.rmtree(new, ignore_errors=True)
    log(
        f"lab: building the {a.debian} root once "
        f"({SUITE}, mmdebstrap; a few minutes under emulation)"
    )
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            "mmdebstrap",
            *RECIPE,
            f"--architectures={a.debian}",
            f"--include={','.join(PACKAGES)}",
            # the root's own host keys are never used (each node has its own)
            '--customize-hook=rm -f "$1"/etc/ssh/ssh_host_*',
            SUITE,
            str(new),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
        shutil.rmtree(new, ignore_errors=True)
        raise NodeprepError(f"building the {a.debian} root failed:\n{tail}", hint=build_hint(tail))
    os.rename(new, path)
    log(f"lab: {a.debian} root built in {time.monotonic() - t0:.0f} s ({path})")
    return path


# mmdebstrap's (apt's) words when Debian's mirror could not be reached or read
_MIRROR = (
    "Failed to fetch",
    "Temporary failure resolving",
    "Could not resolve",
    "Could not connect",
    "Unable to connect",
    "Connection timed out",
    "Network is unreachable",
    "Hash Sum mismatch",
)


def build_hint(tail: str) -> str:
    """What to do after mmdebstrap failed with TAIL (its last lines): the cause it names."""
    if "install arch-test" in tail:  # "E: install arch-test for foreign architecture support"
        return (
            "install Debian's arch-test package (apt-get install arch-test, or rerun "
            "`sh requirements/bootstrap.sh`), then rerun lab.up"
        )
    if any(m in tail for m in _MIRROR):
        return "Debian's package mirror must be reachable; rerun lab.up"
    return "mmdebstrap's last lines above say why; rerun lab.up once that is fixed"


def prebuild(arch: str, log=print) -> None:
    """Build ARCH's root ahead of any lab (the test session starts it in the background), and
    leave binfmt_misc as it was found: the registration is lab.up's to add and record."""
    mounted = mount_binfmt()
    had = registered(arch)
    try:
        root(arch, log)
    finally:
        if not had:
            unregister(arch)
        if mounted:
            unmount_binfmt()


def runs_as(pid: int, arch: str | None) -> bool:
    """Whether node process PID runs as ARCH's node (chrooted into a root) or, ARCH None, as
    a native one."""
    try:
        chrooted = os.readlink(f"/proc/{pid}/root") != "/"
    except OSError:
        return False
    return chrooted == bool(arch)


def converge(lab: Path, arches: set[str], log=print) -> list[str]:
    """Binfmt for every architecture the lab's nodes use; the ones this lab registered are
    recorded in LAB/ADDED. Returns the changes."""
    changes = []
    mine = _added(lab)
    if arches and mount_binfmt():
        mine.add(MOUNTED)
        changes.append("mounted binfmt_misc")
    for arch in sorted(arches):
        if ensure_binfmt(arch):  # first: building the root needs it, and must not hide who added it
            mine.add(arch)
            changes.append(f"registered qemu-user for {arch}")
        root(arch, log)
    if mine:
        (lab / ADDED).write_text("".join(f"{a}\n" for a in sorted(mine)))
    return changes


def release(lab: Path, others_using) -> list[str]:
    """down(): remove the registrations this lab added, unless OTHERS_USING(arch) (another
    lab still runs nodes of that architecture)."""
    done, added = [], _added(lab)
    for arch in sorted(added - {MOUNTED}):
        if not others_using(arch) and unregister(arch):
            done.append(f"removed the qemu-user registration for {arch}")
    if MOUNTED in added and unmount_binfmt():
        done.append("unmounted binfmt_misc")
    (lab / ADDED).unlink(missing_ok=True)
    return done


def _added(lab: Path) -> set[str]:
    try:
        return {a for a in (lab / ADDED).read_text().split() if a in ARCHES or a == MOUNTED}
    except OSError:
        return set()


# The shell that becomes one foreign node (compare config.NODE_INIT), run as `ip netns exec
# NS unshare --mount --uts --propagation private /bin/sh -c NODE_INIT sh HOSTNAME ETC
# HOME_SRC HOME CONFIG BIN ROOT NODE_DIR`. The overlay is mounted at NODE_DIR/rootfs; the node
# directory itself is bound at its own path inside (sshd_config names its host key and pid
# file by those paths); the home is bound at HOME both inside and outside the root.
NODE_INIT = (
    'hostname "$1" && R="$8/rootfs" && mkdir -p "$R" "$8/root.upper" "$8/root.work" && '
    'mount -t overlay overlay -o "lowerdir=$7,upperdir=$8/root.upper,workdir=$8/root.work" "$R" && '
    'mount --bind "$2" "$R/etc" && mkdir -p "$R$4" "$R$8" && '
    'mount --bind "$3" "$R$4" && mount --bind "$3" "$4" && mount --bind "$8" "$R$8" && '
    'mount --bind "$6" "$R/usr/local/bin" && mount -t proc proc "$R/proc" && '
    'mount --rbind /sys "$R/sys" && mount --rbind /dev "$R/dev" && '
    'mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm" && '
    'mount -t tmpfs -o mode=755 tmpfs "$R/run" && '
    'mkdir -p "$R/run/sshd" && { umount -l /run/netns 2>/dev/null; '
    'exec chroot "$R" /usr/sbin/sshd -D -e -f "$5"; }'
)


def node_argv(node: LabNode, home: Path) -> list[str]:
    """How NODE (its directory: the parent of its home source) starts, HOME its home's path."""
    nd = node.home.parent
    return [
        "ip",
        "netns",
        "exec",
        node.netns,
        "unshare",
        "--mount",
        "--uts",
        "--propagation",
        "private",
        "/bin/sh",
        "-c",
        NODE_INIT,
        "sh",
        node.name,
        str(nd / "etc"),
        str(node.home),
        str(home),
        str(nd / "sshd_config"),
        str(nd / BIN),
        str(root(node.arch)),
        str(nd),
    ]
