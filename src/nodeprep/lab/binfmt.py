"""The foreign architectures the lab knows (`uname -m`'s name, Debian's, qemu-user's binfmt
entry) and qemu-user's binfmt_misc registration for them: the one host-wide change foreign
nodes need (foreign.py: lab.up adds and records it, lab.down removes what its lab added)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from nodeprep.errors import InputError, NodeprepError

BINFMT = Path("/proc/sys/fs/binfmt_misc")


@dataclass(frozen=True)
class Arch:
    name: str  # what `uname -m` says: aarch64
    debian: str  # Debian's name for it: arm64
    qemu: str  # the binfmt_misc entry Debian's qemu-user-static ships: qemu-aarch64


ARCHES = {"aarch64": Arch("aarch64", "arm64", "qemu-aarch64")}


def registered(arch: str) -> bool:
    return (BINFMT / ARCHES[arch].qemu).exists()


def ensure_binfmt(arch: str) -> bool:
    """Register qemu-user for ARCH with binfmt_misc (mounting binfmt_misc first when needed),
    with Debian's own line (/usr/lib/binfmt.d/qemu-aarch64.conf, flags OCF or POF: F is what
    makes it work in a chroot). True when this call registered it."""
    a = ARCHES[arch]
    mount_binfmt()
    if registered(arch):
        return False
    conf = Path(f"/usr/lib/binfmt.d/{a.qemu}.conf")
    try:
        line = next(ln for ln in conf.read_text().splitlines() if ln.startswith(":"))
    except (OSError, StopIteration):
        raise InputError(
            f"{conf} is missing",
            hint="apt-get install qemu-user-static (or run `sh requirements/bootstrap.sh`)",
        ) from None
    if "F" not in line.rsplit(":", 1)[1]:
        line += "F"
    (BINFMT / "register").write_text(line)
    return True


def mount_binfmt() -> bool:
    """binfmt_misc mounted at BINFMT (systemd mounts it; a bare machine may not); True when
    this call mounted it."""
    if (BINFMT / "register").exists():
        return False
    proc = subprocess.run(
        ["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT)], capture_output=True, text=True
    )
    if proc.returncode:
        raise NodeprepError(
            f"cannot mount binfmt_misc: {proc.stderr.strip()}",
            hint="the kernel needs binfmt_misc (modprobe binfmt_misc)",
        )
    return True


def unmount_binfmt() -> bool:
    """Unmount binfmt_misc when no registration is left in it (it was mounted for ours)."""
    try:
        left = [p.name for p in BINFMT.iterdir() if p.name not in ("register", "status")]
    except OSError:
        return False
    if left or not (BINFMT / "register").exists():
        return False
    return subprocess.run(["umount", str(BINFMT)], capture_output=True).returncode == 0


def unregister(arch: str) -> bool:
    if not registered(arch):
        return False
    (BINFMT / ARCHES[arch].qemu).write_text("-1")
    return True
