"""Each rootful node's own /etc: a copy of the host's, bound over /etc inside the node.

Why a copy: login shells (/etc/passwd), /etc/shells and sudoers are per machine on a real
cluster; with one shared /etc a `usermod -s` on one node would change every node, and a
parity check could never see nodes differ.

The copy is made once per node (`cp -a`, all nodes at once). Later up()s refresh it with
care, since the node's /etc is that node's state like its home:
  - the account files (passwd, group, shadow, gshadow) are never overwritten: entries the
    host gained since (a package's system user) are appended, the node's own changes kept;
  - other files are copied again only when the host changed them (mtime or ctime) since
    the last refresh: a package installed on the host after the node was made must reach
    the node (/usr is shared, so its conffiles and /etc/alternatives links belong with it),
    while a file the node changed or removed, and the host did not touch, stays as it is;
  - the lab's own files (hosts, resolv.conf, hostname, shells, sudoers.d/nodeprep-lab) are
    written by the lab, never copied from the host.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from pathlib import Path

from nodeprep.errors import NodeprepError

from . import net
from .config import (
    LAB_USER,
    LOGIN_SHELLS,
    SUDOERS_NAME,
    SUDOERS_SLURM_NAME,
    shells_text,
    sudoers_slurm_text,
    sudoers_text,
)

HOST_ETC = Path("/etc")
STAMP = "etc.synced"  # in the node directory: its mtime is the last refresh
ACCOUNTS = ("passwd", "group", "shadow", "gshadow")
# Never copied from the host: the node's account state (with shadow's backups and the
# subordinate id ranges) and what the lab writes itself.
NODE_OWNED = {f"{a}{s}" for a in ACCOUNTS + ("subuid", "subgid") for s in ("", "-")} | {
    ".pwd.lock",
    "hosts",
    "resolv.conf",
    "hostname",
    "shells",
    f"sudoers.d/{SUDOERS_NAME}",
    f"sudoers.d/{SUDOERS_SLURM_NAME}",
    "slurm/slurm.conf",
    "slurm/cgroup.conf",
}  # lab --slurm writes these (slurm.py)


def _clock(lab: Path) -> int:
    """Now, as the file system stamps files (ns). Not time.time(): file times come from the
    kernel's coarse clock, a tick behind, so a change made just before a refresh could
    look older than a stamp taken with time.time() and be missed for good."""
    mark = lab / "etc.clock"
    mark.touch()
    os.utime(mark)
    return mark.stat().st_mtime_ns


def _stamp(nd: Path, ns: int | None = None) -> int:
    """Read (or with NS, set) the time of the node's last refresh; 0: never."""
    path = nd / STAMP
    if ns is not None:
        path.touch()
        os.utime(path, ns=(ns, ns))
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def make(node_dirs: list[Path], sources: dict[Path, Path] | None = None) -> list[Path]:
    """Copy the host's /etc (or SOURCES[nd]: a foreign node's root's /etc, lab/foreign.py)
    for the nodes that have none yet, one `cp -a` per node, all at once; a copy cut short
    (etc.new) is redone. Returns the nodes copied."""
    sources = sources or {}
    todo = [nd for nd in node_dirs if not (nd / "etc").is_dir()]
    if not todo:
        return []
    now = _clock(todo[0].parent)
    procs = []
    for nd in todo:
        shutil.rmtree(nd / "etc.new", ignore_errors=True)
        procs.append(
            (
                nd,
                subprocess.Popen(
                    ["cp", "-a", "--", str(sources.get(nd, HOST_ETC)), str(nd / "etc.new")],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
            )
        )
    for nd, proc in procs:
        out, _ = proc.communicate()
        if proc.returncode:
            raise NodeprepError(f"copying /etc for {nd.name} failed: {out.strip()}")
        os.rename(nd / "etc.new", nd / "etc")
        _stamp(nd, now)
    return todo


def _host_entries(source: Path) -> list[tuple[int, str, os.stat_result]]:
    """(time changed in ns, path relative to SOURCE, lstat) of everything in SOURCE."""
    found, todo = [], [""]
    while todo:
        rel = todo.pop()
        try:
            with os.scandir(source / rel if rel else source) as it:
                for entry in it:
                    sub = f"{rel}/{entry.name}" if rel else entry.name
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # removed meanwhile
                    found.append((max(st.st_mtime_ns, st.st_ctime_ns), sub, st))
                    if stat.S_ISDIR(st.st_mode):
                        todo.append(sub)
        except OSError:
            continue
    return found


def refresh(node_dirs: list[Path], sources: dict[Path, Path] | None = None) -> list[Path]:
    """Bring the changes of the host's /etc (or SOURCES[nd], a foreign root's) into these
    nodes' copies (see the module docstring); returns the nodes whose copy changed."""
    sources = sources or {}
    touched = []
    for source in dict.fromkeys(sources.get(nd, HOST_ETC) for nd in node_dirs):
        touched += _refresh([nd for nd in node_dirs if sources.get(nd, HOST_ETC) == source], source)
    return touched


def _refresh(node_dirs: list[Path], source: Path) -> list[Path]:
    """One walk of SOURCE for all NODE_DIRS."""
    if not node_dirs:
        return []
    now = _clock(node_dirs[0].parent)  # before the walk: later changes count next time
    entries = _host_entries(source)
    touched = []
    for nd in node_dirs:
        # >=: a change in the very tick of the last stamp may have come after it. Seen twice
        # at worst, and _copy skips what it already copied.
        since = _stamp(nd)
        newer = [e for e in entries if e[0] >= since]
        if not newer:
            continue  # nothing changed on the host since: the usual case
        etc, did = nd / "etc", False
        # Shallow paths first: a directory the host gained exists before its entries.
        for _, rel, st in sorted(newer, key=lambda e: e[1].count("/")):
            if rel in ACCOUNTS:
                did |= _merge_accounts(source / rel, etc / rel)
            elif rel not in NODE_OWNED:
                did |= _copy(source / rel, etc / rel, st)
        _stamp(nd, now)
        if did:
            touched.append(nd)
    return touched


def _copy(src: Path, dst: Path, st: os.stat_result) -> bool:
    if not dst.parent.is_dir():
        return False  # its directory is the node's business (removed there)
    if stat.S_ISDIR(st.st_mode):
        if os.path.lexists(dst):
            return False  # its time moved with its entries; or the node's own thing
        dst.mkdir()
    elif stat.S_ISLNK(st.st_mode):
        if (
            dst.is_dir()
            and not dst.is_symlink()
            or dst.is_symlink()
            and os.readlink(dst) == os.readlink(src)
        ):
            return False
        dst.unlink(missing_ok=True)
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISREG(st.st_mode):
        try:
            have = dst.lstat()
        except FileNotFoundError:
            have = None
        # Already copied (a file changed in a stamp's tick is seen twice): copy2 kept its mtime.
        if have and (
            stat.S_ISDIR(have.st_mode)
            or stat.S_ISREG(have.st_mode)
            and (have.st_mtime_ns, have.st_size) == (st.st_mtime_ns, st.st_size)
        ):
            return False
        tmp = dst.with_name(f".{dst.name}.nodeprep")
        shutil.copy2(src, tmp, follow_symlinks=False)
        os.replace(tmp, dst)  # never write through: dst may be a link the node made
    else:
        return False  # sockets, fifos, devices: none belong in a node's /etc
    os.chown(dst, st.st_uid, st.st_gid, follow_symlinks=False)
    if not stat.S_ISLNK(st.st_mode):
        shutil.copystat(src, dst, follow_symlinks=False)
    return True


def add_user(nd: Path, user: str) -> bool:
    """The host's entries of USER (and its group) in node ND's account files: a foreign
    node's /etc comes from its own root, which has never heard of the lab user."""
    return any([_merge_accounts(HOST_ETC / a, nd / "etc" / a, {user}) for a in ACCOUNTS])


def _merge_accounts(host: Path, node: Path, only: set[str] | None = None) -> bool:
    """Append to the node's account file the host entries (by name; ONLY those names) it lacks."""
    try:
        have = node.read_text()
        theirs = host.read_text()
    except OSError:
        return False
    names = {ln.split(":", 1)[0] for ln in have.splitlines()}
    extra = [
        ln
        for ln in theirs.splitlines()
        if ln and ln.split(":", 1)[0] not in names and (only is None or ln.split(":", 1)[0] in only)
    ]
    if not extra:
        return False
    sep = "" if not have or have.endswith("\n") else "\n"
    st = node.stat()
    tmp = node.with_name(f".{node.name}.nodeprep")
    tmp.write_text(have + sep + "".join(f"{ln}\n" for ln in extra))
    os.chown(tmp, st.st_uid, st.st_gid)
    os.chmod(tmp, stat.S_IMODE(st.st_mode))
    os.replace(tmp, node)  # as usermod does: a reader sees the old or the new file
    return True


def _inside(root: Path, path: str) -> str:
    """PATH as seen in ROOT, following the root's own absolute links (merged /usr: /bin ->
    usr/bin) inside it."""
    full = root / path.lstrip("/")
    for _ in range(8):
        if not full.is_symlink():
            break
        target = os.readlink(full)
        full = root / target.lstrip("/") if target.startswith("/") else full.parent / target
    return str(full)


def _regular(path: Path) -> None:
    # A symlinked /etc/resolv.conf (systemd-resolved) copied from the host would make the
    # lab write through it into the host's file.
    if path.is_symlink():
        path.unlink()


def machine_id(nd: Path) -> str:
    """A stable /etc/machine-id for the node whose directory is ND (32 hex digits)."""
    return hashlib.sha256(str(nd).encode()).hexdigest()[:32] + "\n"


def write_files(
    nd: Path, hostname: str, hosts: str, sudo: bool = True, root: Path = Path("/")
) -> bool:
    """The lab's own files in the node's /etc; True when one changed. Writes in place, so
    a running node sees them at once (its /etc is a bind of this very directory). ROOT: the
    node's root (a foreign node's), where the shells it offers are looked for."""
    etc = nd / "etc"
    for name in ("hosts", "resolv.conf", "hostname", "shells", "machine-id"):
        _regular(etc / name)
    try:
        shells = (etc / "shells").read_text()
    except OSError:
        shells = ""
    offered = [s for s in LOGIN_SHELLS if os.access(_inside(root, s), os.X_OK)]
    wrote = [
        net.write_if_changed(etc / "hosts", hosts),
        # its own machine id, as separate machines have (the copy of the host's would
        # make every node one machine to nodeprep's identity fact)
        net.write_if_changed(etc / "machine-id", machine_id(nd)),
        # empty on purpose: a name server that never answers stalls reverse lookups
        net.write_if_changed(etc / "resolv.conf", ""),
        net.write_if_changed(etc / "hostname", f"{hostname}\n"),
        net.write_if_changed(etc / "shells", shells_text(shells, offered)),
        *(
            [
                _write_sudoers(etc, SUDOERS_NAME, sudoers_text(LAB_USER, offered)),
                _write_sudoers(etc, SUDOERS_SLURM_NAME, sudoers_slurm_text(LAB_USER)),
            ]
            if sudo
            else [_no_sudoers(etc, SUDOERS_NAME), _no_sudoers(etc, SUDOERS_SLURM_NAME)]
        ),
    ]
    return any(wrote)


_VALID: set[str] = set()  # sudoers texts visudo accepted: one check per up, not per node


def _no_sudoers(etc: Path, name: str) -> bool:
    """A node whose user may not sudo at all (as on many HPC clusters)."""
    path = etc / "sudoers.d" / name
    if os.path.lexists(path):
        path.unlink()
        return True
    return False


def _write_sudoers(etc: Path, name: str, text: str) -> bool:
    path = etc / "sudoers.d" / name
    try:
        if path.read_text() == text and not path.is_symlink():
            return False
    except OSError:
        pass
    if shutil.which("visudo") is None or not (etc / "sudoers.d").is_dir():
        raise NodeprepError("sudo not found: run requirements/bootstrap.sh")
    tmp = path.with_name(f".{name}.new")
    tmp.write_text(text)
    os.chmod(tmp, 0o440)
    # sudo ignores a sudoers.d file whose name has a dot, so the half-made one is inert;
    # a rule with a syntax error would make sudo refuse everything on the node.
    if text not in _VALID:
        proc = subprocess.run(["visudo", "-cf", str(tmp)], capture_output=True, text=True)
        if proc.returncode:
            tmp.unlink()
            raise NodeprepError(f"generated sudoers rejected by visudo: {proc.stdout.strip()}")
        _VALID.add(text)
    os.replace(tmp, path)
    return True


def mounted(pid: int, nd: Path) -> bool:
    """Whether the node process PID runs on this node's /etc copy (a node started before
    nodes had their own /etc runs on the host's and must be restarted)."""
    return bind_mounted(pid, "/etc", f"/{nd.name}/etc")


def bind_mounted(pid: int, target: str, source_end: str) -> bool:
    """Whether process PID sees a bind mount on TARGET whose source path ends in SOURCE_END."""
    try:
        lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any((f := ln.split())[4] == target and f[3].endswith(source_end) for ln in lines)
