"""Runs ON a node: the receiving end of a project sync (ops/sync/push.py), standard library only.

    python3 syncrecv.py DIR < stream

The stream: the length of a JSON header as 16 digits and a newline, the header
{"delete": [paths], "record": {path: [size, mtime_ns, sha256]}}, then a tar stream of the files
to put in DIR. The deletions first (only paths the record of the last sync held: the controller
decides; directories they leave empty go too), so a path may turn from a file into a directory
or back. The tar stream is unpacked into DIR/.nodeprep-sync.part by GNU tar where the node has
it (by Python's tarfile where not), and each file then renamed into its place: a reader of DIR
sees the old file or the new one, never half of one. A file not sent whose size matches its
record gets the recorded mtime (a `touch` on the controller). Then the record, written beside
and renamed, to DIR/.nodeprep-sync.json. Interrupted anywhere, what was renamed stays, the
staging directory is removed by the next run, and the record still describes the last
complete sync (the node's files are checked against it by size and mtime before the next
plan), so the next sync sends what is missing. Prints one line: `received N deleted M`.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile

RECORD = ".nodeprep-sync.json"
STAGE = ".nodeprep-sync.part"


def _safe(name: str) -> str:
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise SystemExit(f"syncrecv: refusing the path {name!r}")
    return name


def _exactly(n: int) -> bytes:
    """N bytes of stdin, read without reading past them (the tar stream follows)."""
    out = bytearray()
    while len(out) < n:
        got = os.read(0, min(n - len(out), 1 << 20))
        if not got:
            raise SystemExit("syncrecv: the stream ended early")
        out += got
    return bytes(out)


def _delete(root: str, names: list) -> int:
    """NAMES (paths the last sync put there) removed, and the directories they leave empty."""
    gone = 0
    for name in names:
        path = os.path.join(root, _safe(name))
        try:
            os.unlink(path)
            gone += 1
        except (FileNotFoundError, IsADirectoryError):
            continue
        parent = os.path.dirname(path)
        while parent != root and parent.startswith(root + os.sep):
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)
    return gone


def _unpack(stage: str) -> None:
    """The tar stream on stdin into STAGE."""
    tar = shutil.which("tar")
    if tar:
        argv = [tar, "-x", "-f", "-", "-C", stage, "--no-same-owner", "-p"]
        if subprocess.run(argv, stdin=0).returncode:
            raise SystemExit("syncrecv: tar failed")
        return
    with tarfile.open(fileobj=os.fdopen(0, "rb", closefd=False), mode="r|") as t:
        for member in t:
            if member.isfile():
                _safe(member.name)
                try:  # the names are checked above; Python < 3.11.4 has no filter
                    t.extract(member, stage, set_attrs=True, filter="fully_trusted")
                except TypeError:
                    t.extract(member, stage, set_attrs=True)


def _place(root: str, stage: str) -> int:
    """Every file of STAGE renamed to its place under ROOT; how many."""
    got = 0
    for here, _dirs, files in os.walk(stage):
        rel = os.path.relpath(here, stage)
        dest_dir = root if rel == "." else os.path.join(root, _safe(rel.replace(os.sep, "/")))
        if files:
            os.makedirs(dest_dir, exist_ok=True)
        for f in files:
            os.replace(os.path.join(here, f), os.path.join(dest_dir, f))
            got += 1
    return got


def main(root: str) -> int:
    root = os.path.abspath(root)
    stage = os.path.join(root, STAGE)
    shutil.rmtree(stage, ignore_errors=True)
    os.makedirs(stage)
    head = json.loads(_exactly(int(_exactly(17))))
    gone = _delete(root, head["delete"])
    _unpack(stage)
    got = _place(root, stage)
    shutil.rmtree(stage, ignore_errors=True)
    for name, (size, mtime, _sha) in head["record"].items():  # a touch: the recorded mtime
        path = os.path.join(root, _safe(name))
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if st.st_size == size and st.st_mtime_ns // 10**9 != mtime // 10**9:
            os.utime(path, ns=(mtime, mtime))
    tmp = os.path.join(root, f".{RECORD}.part")
    with open(tmp, "w") as fh:
        json.dump(head["record"], fh)
    os.replace(tmp, os.path.join(root, RECORD))
    print(f"received {got} deleted {gone}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
