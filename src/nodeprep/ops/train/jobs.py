"""A training job's files and processes on the nodes: the payload (a builtin or the user's
script with its directory), the sync that pushes only what differs, and the cleanup that stops
exactly the job's processes on a node.

Every process of a job carries PYTHON_NODEPREP_JOB=<id> in its environment (DeepSpeed's runner
forwards PYTHON* variables to every rank, mpirun gets -x, torchrun inherits it), so cleanup
kills the process groups of exactly those processes on every node: never a broad `pkill -f`.
"""
from __future__ import annotations

import hashlib
import posixpath
import shlex
from pathlib import Path

from nodeprep.engine.facts.probe import Fact
from nodeprep.engine.remote import stop_tagged_script
from nodeprep.errors import InputError
from nodeprep import nodeside

JOB_VAR = "PYTHON_NODEPREP_JOB"
SKIP = {".git", "__pycache__", ".venv", ".nodeprep", "node_modules"}

def resolve_payload(payload: str) -> tuple[Path, Path]:
    """(local directory to sync, script inside it) for a builtin name or a path."""
    if payload in nodeside.BUILTIN:
        script = Path(nodeside.BUILTIN[payload])
        return script.parent, script
    try:
        p = Path(payload).expanduser()
    except RuntimeError:                # ~name/ of a user this machine does not have
        p = Path(payload)
    if not p.is_file():
        raise InputError(f"--payload {payload!r}: not a builtin ({', '.join(nodeside.BUILTIN)}) "
                         "and not a file", hint="give a script path or health/ddp")
    return p.resolve().parent, p.resolve()


def local_files(root: Path, only: Path | None = None) -> dict[str, Path]:
    builtin = {path: name for name, path in nodeside.BUILTIN.items()}
    if only is not None and only in builtin:    # a builtin: its own script and what it imports
        return {p.name: p for p in [only, *nodeside.COMPANIONS.get(builtin[only], [])]}
    files = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not any(part in SKIP for part in p.relative_to(root).parts):
            _readable(p)
            files[str(p.relative_to(root))] = p
            if len(files) > 2000:
                raise InputError(f"{root} holds more than 2000 files to sync",
                                 hint="put the training script in a directory of its own")
    return files


def _readable(path: Path) -> None:
    """InputError, before any node is touched, for a file of the job that cannot be read."""
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise InputError(f"cannot read this file of the job directory: {exc.strerror}",
                         "fix its permissions, or move it out of the directory",
                         file=str(path)) from None


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sync(session, files: dict[str, Path], job_dir: str) -> int:
    """Push only the files whose sha256 differs on the node; returns how many were pushed."""
    names = " ".join(shlex.quote(n) for n in files)
    r = session.run(f"mkdir -p {shlex.quote(job_dir)} && cd {shlex.quote(job_dir)} && "
                    f"sha256sum -- {names} 2>/dev/null; true", label="job sums", log_output=False)
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


def cleanup_script(job_id: str) -> str:
    """sh that stops every process group holding a process of JOB_ID on this node."""
    return stop_tagged_script(JOB_VAR, job_id)


# -- the processes of nodeprep jobs on a node ---------------------------------------------------
# Every process of a job carries JOB_VAR in its environment: before a launch, those of EARLIER
# jobs are stale (a half-dead job still holding GPUs); after a run, those of THIS job are left
# over. One /proc scan lists them all: pid, job id, state, command line.
_PROCS = r'''
myns=$(readlink /proc/self/ns/net 2>/dev/null)
# one grep over every environ (a fork per process cost 0.4 s on a busy machine)
for f in $(grep -lz '^PYTHON_NODEPREP_JOB=' /proc/[0-9]*/environ 2>/dev/null); do
  p=${f%/environ}; pid=${p#/proc/}; [ "$pid" = "$$" ] && continue
  # this node's own: one network namespace (the lab's nodes share one process table)
  [ "$(readlink "$p/ns/net" 2>/dev/null)" = "$myns" ] || continue
  job=$(tr '\0' '\n' < "$p/environ" 2>/dev/null | sed -n 's/^PYTHON_NODEPREP_JOB=//p' | head -n 1)
  [ -z "$job" ] && continue
  st=$(cut -d')' -f2 "$p/stat" 2>/dev/null | cut -d' ' -f2)
  [ "$st" = Z ] && continue
  args=$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null | cut -c1-200)
  printf '%s\t%s\t%s\n' "$pid" "$job" "$args"
done
'''


def _procs(text: str, rc: int) -> list[dict]:
    out = []
    for line in text.splitlines():
        pid, _, rest = line.partition("\t")
        job, _, args = rest.partition("\t")
        if pid.isdigit() and job:
            out.append({"pid": int(pid), "job": job, "args": args.strip()})
    return out


JOB_PROCESSES = Fact("job_processes", lambda _v: _PROCS, _procs)


def _gpu_apps(text: str, rc: int) -> list[dict]:
    """`nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader`."""
    out = []
    for line in text.splitlines():
        parts = [x.strip() for x in line.split(",")]
        if len(parts) >= 3 and parts[0].isdigit():
            out.append({"pid": int(parts[0]), "name": parts[1], "memory": parts[2]})
    return out


# processes holding a GPU (none where there is no nvidia-smi)
GPU_APPS = Fact("gpu_apps", lambda _v: "command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi "
                "--query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null; true",
                _gpu_apps)


def stale(procs: list[dict], job_id: str) -> dict[str, list[dict]]:
    """Processes of earlier jobs, by job id."""
    out: dict[str, list[dict]] = {}
    for p in procs:
        if p["job"] != job_id:
            out.setdefault(p["job"], []).append(p)
    return out


# -- the node-side agent: rank wrapper and watcher (payloads/rank.py, payloads/watch.py) ----------
def agent_files() -> dict[str, Path]:
    return {"rank.py": nodeside.RANK, "watch.py": nodeside.WATCH}


def agent_dir(home: str) -> str:
    return posixpath.join(home, ".nodeprep", "agent")
