"""The stage's talk with nodes and with the controller's own files: nodeside/stage.py (the
source's end) and nodeside/stagerecv.py (each filled node's end) put in place on a node, once
per version (their names carry their content's hash); what a node's destination holds (its
State); what a source holds (its Manifest, read here or on the node that has it)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from nodeprep import nodeside
from nodeprep.engine.remote import rpath, write_script
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops.stage.needs import CHUNK, Manifest, State

SCAN_TIMEOUT = 3600  # hashing a large source (or, with --verify, a destination) once


def _named(path: Path) -> tuple[str, str]:
    text = path.read_text()
    return f".nodeprep/{path.stem}-{hashlib.sha256(text.encode()).hexdigest()[:12]}.py", text


PROGRAMS = dict(_named(p) for p in (nodeside.STAGE, nodeside.STAGERECV))
SEND, RECV = (f'python3 -I -S "$HOME/{name}"' for name in PROGRAMS)


def install() -> str:
    """sh putting both programs in the node's home unless those versions are there (older
    ones removed), and refusing a node without python3 by name."""
    out = [
        "command -v python3 >/dev/null 2>&1 || "
        "{ echo 'stage: no python3 on this node (staging needs any python3)' >&2; exit 3; }"
    ]
    for name, text in PROGRAMS.items():
        stem = name.rsplit("-", 1)[0]
        out.append(  # older versions go; this one is written whole (beside, then renamed)
            f'if [ ! -f "$HOME/{name}" ]; then\nfor np_f in "$HOME"/{stem}-*.py; do '
            f'[ "$np_f" = "$HOME/{name}" ] || rm -f -- "$np_f"; done\n'
            f"{write_script('~/' + name, text, 0o600)}\nfi"
        )
    return "\n".join(out)


def recv_command(dest: str, node: str, fifo: str | None) -> str:
    return f"{RECV} recv {rpath(dest)} {node}" + (f" {fifo}" if fifo else "")


def read_state(session, dest: str, verify: bool = False) -> State:
    """What DEST holds; with VERIFY only the staged files whose content hashes to what the
    record says (every file read on the node), not those whose size, inode and ctime do."""
    r = session.run(
        f"{install()}\n{RECV} state {rpath(dest)}",
        label=f"stage: what {dest} holds",
        log_output=False,
        timeout=600,
    )
    if not r.ok:
        raise NodeprepError(f"cannot read {dest}: {r.tail(2)}")
    state = State.parse(json.loads(r.stdout))
    if not verify or not state.staged:
        return state
    there = {e.path: e.digest for e in _scan(session, dest, "-").entries}
    staged = {p: d for p, d in state.staged.items() if there.get(p) == d}
    bad = frozenset(state.staged) - frozenset(staged)
    return State(staged, state.parts, state.free, bad, state.ident)


def _cache_name(src: str) -> str:
    return f"stage-sums-{hashlib.sha1(src.encode()).hexdigest()[:16]}.json"


def scan_local(src: Path, cache_dir: Path) -> Manifest:
    """SRC's files and chunk sums, read here; a file unchanged since the last scan (size,
    mtime, inode, ctime) is not read again (CACHE_DIR keeps its sums)."""
    if not src.exists():
        raise InputError(f"stage: {src} does not exist", hint="give a file or directory here")
    argv = [sys.executable, "-I", "-S", str(nodeside.STAGE), "scan", str(src), str(CHUNK)]
    argv.append(str(cache_dir / _cache_name(str(src.resolve()))))
    r = subprocess.run(argv, capture_output=True, text=True, errors="surrogateescape")
    if r.returncode:
        raise InputError(
            (r.stderr.strip().splitlines() or [f"scan of {src} failed"])[-1],
            hint="make every file under the source readable, or stage a directory without it",
        )
    return Manifest.parse(json.loads(r.stdout))


def scan_node(session, src: str) -> Manifest:
    """SRC's files and chunk sums as the node that has them reads them (the sums it kept
    spare it reading unchanged files again)."""
    try:
        return _scan(session, src, f'"$HOME"/.cache/nodeprep/{_cache_name(src)}')
    except NodeprepError as e:
        raise InputError(f"stage: {session.name}:{src}: {e}", hint="name a path that node has")


def _scan(session, path: str, cache: str) -> Manifest:
    r = session.run(
        f"{install()}\n{SEND} scan {rpath(path)} {CHUNK} {cache}",
        label=f"stage: the files of {path}",
        log_output=False,
        timeout=SCAN_TIMEOUT,
    )
    if not r.ok:
        raise NodeprepError(r.tail(1) or f"exit {r.rc}")
    return Manifest.parse(json.loads(r.stdout))
