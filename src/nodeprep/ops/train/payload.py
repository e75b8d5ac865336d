"""What a training job runs and how it reaches the nodes: the payload (a builtin of
nodeside/payloads, with what it imports, or the user's script with its directory), the agent
(nodeside's rank wrapper and watcher), and the sync that pushes only the files that differ."""

from __future__ import annotations

import posixpath
from pathlib import Path

from nodeprep import nodeside
from nodeprep.errors import InputError
from nodeprep.ops.sync import fileset, push


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
    """The job's files: a builtin's script and what it imports; a user's script's directory
    as git sees it (ops/sync/fileset.py: tracked and untracked-not-ignored files, less
    .nodeprepignore's), each one readable (checked before any node is touched)."""
    builtin = {path: name for name, path in nodeside.BUILTIN.items()}
    if only is not None and only in builtin:  # a builtin: its own script and what it imports
        return {p.name: p for p in [only, *nodeside.COMPANIONS.get(builtin[only], [])]}
    files = {rel: root / rel for rel in fileset.of(root).files}
    for p in files.values():
        _readable(p)
    if only is not None and only.relative_to(root).as_posix() not in files:
        raise InputError(
            f"{only}: git ignores it, so the nodes would not get it",
            hint=f"take it out of the ignore rules, or out of {fileset.IGNORE_FILE}",
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


def sync(session, files: dict[str, Path], job_dir: str, how: push.How, seen=None) -> push.Pushed:
    """FILES into JOB_DIR on SESSION's node: what differs, one stream (ops/sync/push.py);
    SEEN: its look just taken (ops/sync/chained.FannedOut.look), or None."""
    return push.push(session, files, job_dir, how, seen)


# -- the node-side agent: rank wrapper and watcher (nodeside/rank.py, nodeside/watch.py) --------
def agent_files() -> dict[str, Path]:
    return {"rank.py": nodeside.RANK, "watch.py": nodeside.WATCH}


# a job's run directory on a node is ~/NODE_RUNS/<job> (nodeside/rank.py's RUNS: the same, kept
# equal by tests/unit/test_nodeside_copies.py)
NODE_RUNS = ".nodeprep/runs"


def agent_dir(home: str) -> str:
    return posixpath.join(home, ".nodeprep", "agent")
