"""What a training job runs and how it reaches the nodes: the payload (a builtin of
nodeside/payloads, with what it imports, or the user's script with its directory), the agent
(nodeside's rank wrapper and watcher), and the sync that pushes only the files that differ."""

from __future__ import annotations

import hashlib
import posixpath
import shlex
from pathlib import Path

from nodeprep import nodeside
from nodeprep.errors import InputError

SKIP = {".git", "__pycache__", ".venv", ".nodeprep", "node_modules"}


def resolve_payload(payload: str) -> tuple[Path, Path]:
    """(local directory to sync, script inside it) for a builtin name or a path."""
    if payload in nodeside.BUILTIN:
        script = Path(nodeside.BUILTIN[payload])
        return script.parent, script
    try:
        p = Path(payload).expanduser()
    except RuntimeError:  # ~name/ of a user this machine does not have
        p = Path(payload)
    if not p.is_file():
        raise InputError(
            f"--payload {payload!r}: not a builtin ({', '.join(nodeside.BUILTIN)}) and not a file",
            hint="give a script path or health/ddp",
        )
    return p.resolve().parent, p.resolve()


def local_files(root: Path, only: Path | None = None) -> dict[str, Path]:
    builtin = {path: name for name, path in nodeside.BUILTIN.items()}
    if only is not None and only in builtin:  # a builtin: its own script and what it imports
        return {p.name: p for p in [only, *nodeside.COMPANIONS.get(builtin[only], [])]}
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not any(part in SKIP for part in p.relative_to(root).parts):
            _readable(p)
            files[str(p.relative_to(root))] = p
            if len(files) > 2000:
                raise InputError(
                    f"{root} holds more than 2000 files to sync",
                    hint="put the training script in a directory of its own",
                )
    return files


def _readable(path: Path) -> None:
    """InputError, before any node is touched, for a file of the job that cannot be read."""
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise InputError(
            f"cannot read this file of the job directory: {exc.strerror}",
            "fix its permissions, or move it out of the directory",
            file=str(path),
        ) from None


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sync(session, files: dict[str, Path], job_dir: str) -> int:
    """Push only the files whose sha256 differs on the node; returns how many were pushed."""
    names = " ".join(shlex.quote(n) for n in files)
    r = session.run(
        f"mkdir -p {shlex.quote(job_dir)} && cd {shlex.quote(job_dir)} && "
        f"sha256sum -- {names} 2>/dev/null; true",
        label="job sums",
        log_output=False,
    )
    have = {}
    for line in r.stdout.splitlines():
        sha, _, name = line.partition("  ")
        have[name] = sha
    pushed = 0
    sftp = session.conn.sftp()
    for name, path in files.items():
        if have.get(name) == _sha(path):
            continue
        dest = posixpath.join(job_dir, name)
        session.run(f"mkdir -p {shlex.quote(posixpath.dirname(dest))}", label="mkdir")
        sftp.put(str(path), dest + ".part")
        sftp.posix_rename(dest + ".part", dest)
        pushed += 1
    return pushed


# -- the node-side agent: rank wrapper and watcher (nodeside/rank.py, nodeside/watch.py) --------
def agent_files() -> dict[str, Path]:
    return {"rank.py": nodeside.RANK, "watch.py": nodeside.WATCH}


# a job's run directory on a node is ~/NODE_RUNS/<job> (nodeside/rank.py's RUNS: the same, kept
# equal by tests/unit/test_nodeside_copies.py)
NODE_RUNS = ".nodeprep/runs"


def agent_dir(home: str) -> str:
    return posixpath.join(home, ".nodeprep", "agent")
