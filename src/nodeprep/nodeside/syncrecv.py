"""Runs ON a node: the receiving end of a project sync (ops/sync/push.py), standard library only.

    python3 syncrecv.py DIR < stream

The stream: one JSON line {"delete": [paths], "record": {path: [size, mtime_ns, sha256]}},
then a tar stream of the files to put in DIR. The deletions first (only paths the record of
the last sync held: the controller decides; directories they leave empty go too), so a path
may turn from a file into a directory or back. Each file is written beside its place
(`.name.nodeprep-part`), given the controller's mtime, and renamed over it: a reader of DIR sees
the old file or the new one, never half of one. Then the record, written the same way to
DIR/.nodeprep-sync.json. Interrupted anywhere, what was renamed stays, a `.nodeprep-part` is
removed by the next run, and the record still describes the last complete sync (the node's
own files are checked against it by size and mtime before the next plan), so the next sync
sends what is missing. Prints one line: `received N deleted M`.
"""

import json
import os
import sys
import tarfile

RECORD = ".nodeprep-sync.json"
PART = ".nodeprep-part"


def _safe(name: str) -> str:
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise SystemExit(f"syncrecv: refusing the path {name!r}")
    return name


def _replace(dest: str, write) -> str:
    head, tail = os.path.split(dest)
    os.makedirs(head or ".", exist_ok=True)
    tmp = os.path.join(head, f".{tail}{PART}")
    with open(tmp, "wb") as fh:
        write(fh)
    return tmp


def _clean(root: str) -> None:
    for here, _dirs, files in os.walk(root):
        for f in files:
            if f.endswith(PART):
                os.unlink(os.path.join(here, f))


def main(root: str) -> int:
    os.makedirs(root, exist_ok=True)
    _clean(root)
    stream = sys.stdin.buffer
    head = json.loads(stream.readline())
    gone = _delete(root, head["delete"])  # first: a file may become a directory, or back
    got = 0
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            if not member.isfile():
                continue
            dest = os.path.join(root, _safe(member.name))
            src = tar.extractfile(member)
            tmp = _replace(dest, lambda fh, src=src: _copy(src, fh))
            os.chmod(tmp, member.mode & 0o777)
            mtime = head["record"].get(member.name, [0, int(member.mtime * 1e9)])[1]
            os.utime(tmp, ns=(mtime, mtime))
            os.replace(tmp, dest)
            got += 1
    for name, (size, mtime, _sha) in head["record"].items():  # kept: the recorded mtime
        path = os.path.join(root, _safe(name))
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if st.st_size == size and st.st_mtime_ns != mtime:
            os.utime(path, ns=(mtime, mtime))
    tmp = _replace(
        os.path.join(root, RECORD), lambda fh: fh.write(json.dumps(head["record"]).encode())
    )
    os.replace(tmp, os.path.join(root, RECORD))
    print(f"received {got} deleted {gone}")
    return 0


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
        while parent != root.rstrip("/") and parent.startswith(root):
            try:
                os.rmdir(parent)
            except OSError:
                break
            parent = os.path.dirname(parent)
    return gone


def _copy(src, dst) -> None:
    while True:
        chunk = src.read(1 << 20)
        if not chunk:
            return
        dst.write(chunk)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
