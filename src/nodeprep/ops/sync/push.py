"""One node's sync of a job's files (issue 48): one round trip to read what the node holds, the
plan (manifest.py), one stream with everything that moves.

1. `find` lists the job directory's files with their sizes and mtimes, and the record of the
   last sync is read (nodeside/syncrecv.py keeps it there). Only the record entries whose file
   on the node still has the recorded size and mtime count: a file edited or removed there
   behind nodeprep's back is sent again.
2. manifest.plan decides, reading a file here only when its size or mtime changed (a hash
   cache shared by every node of the sync reads it once).
3. What moves goes as one JSON line and one tar stream into syncrecv.py, run by the node's
   Python (its source passed on the command line: nothing to install first), which writes each
   file beside its place and renames it over it, deletes, and writes the new record.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep import nodeside
from nodeprep.engine.feed import feed
from nodeprep.errors import NodeprepError
from nodeprep.ops.sync import manifest

RECORD = ".nodeprep-sync.json"  # nodeside/syncrecv.py's RECORD (tests/unit/test_sync_push.py)
MARK = "@@nodeprep-files@@"


@dataclass
class Pushed:
    sent: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    hashed: list[str] = field(default_factory=list)
    nbytes: int = 0


class Hashes:
    """sha256 of files here, each read at most once per (path, size, mtime): one instance for
    every node of a sync reads a changed file once, not once per node."""

    def __init__(self):
        self.lock, self.done = threading.Lock(), {}

    def __call__(self, path: Path) -> str:
        st = path.stat()
        key = (str(path), st.st_size, st.st_mtime_ns)
        with self.lock:
            if key in self.done:
                return self.done[key]
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        with self.lock:
            self.done[key] = h.hexdigest()
        return self.done[key]


def state_script(job_dir: str) -> str:
    q = shlex.quote(job_dir)
    return (
        f"mkdir -p {q} && cd {q} && {{ cat {RECORD} 2>/dev/null; echo; echo {MARK}; "
        "find . -path ./.nodeprep-sync.part -prune -o -type f -printf '%s %T@ %P\\0'; }"
    )


def parse_state(out: str) -> tuple[dict, dict]:
    """(the record as the node keeps it, {path: (size, mtime_s)} of the files there)."""
    text, _, listing = out.partition(f"\n{MARK}\n")
    try:
        record = {p: tuple(e) for p, e in json.loads(text.strip() or "{}").items()}
    except (ValueError, TypeError, AttributeError):
        record = {}  # unreadable: as if the node never got anything (everything is sent)
    on_node = {}
    for item in listing.split("\0"):
        size, _, rest = item.partition(" ")
        stamp, _, path = rest.partition(" ")
        if path and size.isdigit():
            on_node[path] = (int(size), int(stamp.partition(".")[0] or 0))
    return record, on_node


def verified(record: dict, on_node: dict) -> dict:
    """The record entries whose file on the node has the recorded size and mtime (seconds)."""
    return {p: e for p, e in record.items() if on_node.get(p) == (e[0], e[1] // 1_000_000_000)}


def local_stats(files: dict[str, Path]) -> dict[str, tuple[int, int]]:
    out = {}
    for rel, path in files.items():
        st = path.stat()
        out[rel] = (st.st_size, st.st_mtime_ns)
    return out


class Spools:
    """Each tar stream made once, in a temporary file here, and read by every node that needs
    the same files: with N nodes to fill, the controller packs 20,000 files once, not N times
    (and its CPU, not the links, was what bounded a first sync)."""

    def __init__(self):
        self.lock, self.made = threading.Lock(), {}

    def get(self, files: dict[str, Path], names: list[str]) -> tuple[int, int]:
        """(a file descriptor to read with os.pread, its size) of NAMES' tar stream."""
        key = tuple((n, str(files[n])) for n in names)
        with self.lock:
            if key not in self.made:
                fh = tempfile.TemporaryFile(prefix="nodeprep-sync-")
                _tar(fh, files, names)
                fh.flush()
                self.made[key] = (fh, fh.tell())
            fh, size = self.made[key]
            return fh.fileno(), size

    def close(self) -> None:
        with self.lock:
            for fh, _size in self.made.values():
                fh.close()
            self.made.clear()


@dataclass
class How:
    """How one sync runs on each of its nodes: the hashes and the tar streams every node
    shares, the command that runs python with ARGS on NODE (python(node, args): the node's
    interpreter, its modules loaded), and --dry-run (the plan only). close() when the sync
    is over (the streams' temporary files)."""

    hashes: Hashes = field(default_factory=Hashes)
    python: Callable[[str, str], str] = lambda node, args: f"python3 {args}"  # noqa: E731
    dry_run: bool = False
    spools: Spools = field(default_factory=Spools)
    stats: dict = field(default_factory=dict)  # id(files) -> local_stats(files)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def local(self, files: dict[str, Path]) -> dict[str, tuple[int, int]]:
        with self.lock:
            if id(files) not in self.stats:
                self.stats[id(files)] = (files, local_stats(files))
            return self.stats[id(files)][1]

    def close(self) -> None:
        self.spools.close()


@dataclass
class Look:
    """What one node's JOB_DIR holds against FILES, and what moves (one round trip)."""

    job_dir: str
    plan: manifest.Plan
    record: dict  # the node's record of the last sync
    pushed: Pushed

    @property
    def idle(self) -> bool:
        return self.plan.nothing and self.plan.record == self.record

    def head(self) -> bytes:
        """The stream's JSON header (deletions, the new record), length-prefixed."""
        body = json.dumps({"delete": self.plan.delete, "record": self.plan.record}).encode()
        return b"%016d\n" % len(body) + body


def look(session, files: dict[str, Path], job_dir: str, how: How) -> Look:
    r = session.run(
        state_script(job_dir), label="job files (sizes, mtimes, record)", log_output=False
    )
    if not r.ok:
        raise NodeprepError(f"cannot list {job_dir}: {r.tail(2)}")
    record, on_node = parse_state(r.stdout)
    here = how.local(files)
    plan = manifest.plan(here, verified(record, on_node), lambda rel: how.hashes(files[rel]))
    out = Pushed(list(plan.send), list(plan.delete), list(plan.hashed))
    out.nbytes = sum(here[p][0] for p in plan.send)
    return Look(job_dir, plan, record, out)


def receiver(job_dir: str) -> str:
    """The arguments that run nodeside/syncrecv.py into JOB_DIR (after the node's python)."""
    return f"-c {shlex.quote(nodeside.SYNCRECV.read_text())} {shlex.quote(job_dir)}"


def push(
    session, files: dict[str, Path], job_dir: str, how: How | None = None, seen: Look | None = None
) -> Pushed:
    """FILES (relative path -> file here) into JOB_DIR on SESSION's node, as HOW says; SEEN:
    the node's look taken just before (no second round trip)."""
    how = how or How()
    seen = seen or look(session, files, job_dir, how)
    if how.dry_run or seen.idle:
        return seen.pushed
    cmd = _any_shell(how.python(session.name, receiver(job_dir)))
    rc, said = feed(session, cmd, spooled(seen.head(), how.spools.get(files, seen.plan.send)))
    if rc != 0:
        raise NodeprepError(f"sync into {job_dir} failed (exit {rc}): {said.strip()[-300:]}")
    return seen.pushed


def _any_shell(script: str) -> str:
    """SCRIPT (POSIX sh) as a command any login shell runs with its stdin left to SCRIPT (the
    session's own wrapping pipes the script into sh's stdin): single quotes hold no newline
    and no `$` that tcsh or fish would read."""
    blob = base64.b64encode(script.encode()).decode()
    return f"exec /bin/sh -c 'eval \"$(echo {blob} | base64 -d)\"'"


def spooled(head: bytes, spool: tuple[int, int]):
    """A writer (engine/feed.py) of HEAD, then the tar stream SPOOL (fd, size) holds."""

    def write(ch) -> None:
        ch.sendall(head)
        fd, size, at = *spool, 0
        while at < size:
            chunk = os.pread(fd, min(1 << 20, size - at), at)
            ch.sendall(chunk)
            at += len(chunk)

    return write


def _tar(out, files: dict[str, Path], names: list[str]) -> None:
    """NAMES of FILES as one tar stream (pax) written to OUT (a file): by GNU tar where every
    file lies at its name under one directory (a project: 20,000 files in a fraction of the
    time Python's tarfile takes), by tarfile otherwise (a builtin payload's few files)."""
    root = _root_of(files, names)
    if root is not None and shutil.which("tar"):
        argv = ["tar", "-c", "-f", "-", "--format=pax", "--pax-option=delete=atime,delete=ctime"]
        argv += ["--owner=0", "--group=0", "--numeric-owner", "--dereference", "-C", str(root)]
        argv += ["--no-recursion", "--null", "-T", "-"]  # positional: after -C
        listing = b"".join(os.fsencode(n) + b"\0" for n in names)
        r = subprocess.run(argv, input=listing, stdout=out, stderr=subprocess.PIPE)
        if r.returncode:
            raise NodeprepError(f"tar of the job's files failed: {r.stderr.decode()[-300:]}")
        return
    with tarfile.open(fileobj=out, mode="w|", bufsize=1 << 20, format=tarfile.PAX_FORMAT) as t:
        for name in names:
            with open(files[name], "rb") as fh:  # a symlink goes as the file it names
                info = t.gettarinfo(arcname=name, fileobj=fh)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                t.addfile(info, fh)


def _root_of(files: dict[str, Path], names: list[str]) -> Path | None:
    """The directory every one of NAMES lies under at its own name, None when there is none."""
    if not names:
        return None
    first = files[names[0]]
    root = Path(str(first)[: -len(names[0])]) if str(first).endswith(names[0]) else None
    if root is None or any(files[n] != root / n for n in names):
        return None
    return root
