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
import shlex
import tarfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep import nodeside
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
        "find . -type f ! -name '*.nodeprep-part' -printf '%s %T@ %P\\0'; }"
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


@dataclass
class How:
    """How one sync runs on each of its nodes: the hashes every node shares, the command that
    runs python with ARGS on NODE (python(node, args): the node's interpreter, its modules
    loaded), and --dry-run (the plan only)."""

    hashes: Hashes = field(default_factory=Hashes)
    python: Callable[[str, str], str] = lambda node, args: f"python3 {args}"  # noqa: E731
    dry_run: bool = False


def push(session, files: dict[str, Path], job_dir: str, how: How | None = None) -> Pushed:
    """FILES (relative path -> file here) into JOB_DIR on SESSION's node, as HOW says."""
    how = how or How()
    r = session.run(
        state_script(job_dir), label="job files (sizes, mtimes, record)", log_output=False
    )
    if not r.ok:
        raise NodeprepError(f"cannot list {job_dir}: {r.tail(2)}")
    record, on_node = parse_state(r.stdout)
    plan = manifest.plan(
        local_stats(files), verified(record, on_node), lambda rel: how.hashes(files[rel])
    )
    out = Pushed(list(plan.send), list(plan.delete), list(plan.hashed))
    out.nbytes = sum(files[p].stat().st_size for p in plan.send)
    if how.dry_run or (plan.nothing and plan.record == record):
        return out
    head = json.dumps({"delete": plan.delete, "record": plan.record}) + "\n"
    args = f"-c {shlex.quote(nodeside.SYNCRECV.read_text())} {shlex.quote(job_dir)}"
    cmd = _any_shell(how.python(session.name, args))
    rc, said = _stream(session, cmd, head.encode(), files, plan.send)
    if rc != 0:
        raise NodeprepError(f"sync into {job_dir} failed (exit {rc}): {said.strip()[-300:]}")
    return out


def _any_shell(script: str) -> str:
    """SCRIPT (POSIX sh) as a command any login shell runs with its stdin left to SCRIPT (the
    session's own wrapping pipes the script into sh's stdin): single quotes hold no newline
    and no `$` that tcsh or fish would read."""
    blob = base64.b64encode(script.encode()).decode()
    return f"exec /bin/sh -c 'eval \"$(echo {blob} | base64 -d)\"'"


def _stream(session, cmd: str, head: bytes, files: dict[str, Path], names: list[str]):
    """(exit status, output) of CMD fed HEAD then NAMES as one tar stream."""
    session.connect()
    ch = session.conn.client.get_transport().open_session()
    got: list[bytes] = []
    try:
        ch.set_combine_stderr(True)
        ch.exec_command(cmd)

        def drain():
            try:
                while data := ch.recv(65536):
                    got.append(data)
            except OSError:
                pass

        reader = threading.Thread(target=drain, daemon=True)
        reader.start()
        try:
            ch.sendall(head)
            _tar(ch, files, names)
        finally:
            ch.shutdown_write()
        rc = ch.recv_exit_status()
        reader.join(30)
        return rc, b"".join(got).decode(errors="replace")
    finally:
        ch.close()


def _tar(ch, files: dict[str, Path], names: list[str]) -> None:
    class Out:
        def write(self, b):
            ch.sendall(b)
            return len(b)

    with tarfile.open(fileobj=Out(), mode="w|", bufsize=1 << 20, format=tarfile.PAX_FORMAT) as t:
        for name in names:
            with open(files[name], "rb") as fh:  # a symlink goes as the file it names
                info = t.gettarinfo(arcname=name, fileobj=fh)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                t.addfile(info, fh)
