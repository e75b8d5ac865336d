"""Nodes `train --restarts` took out of service (issue 47): kept on the controller in
state/quarantine.json with the reason, the time and the job, until `invoke train.release`.
A quarantined node is left out of every later launch (with a note saying how to release it),
and `invoke health` names it. The file is replaced whole (written aside, then renamed): a cut
write leaves the old one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from nodeprep.errors import NodeprepError

FILE = "quarantine.json"


def path_of(state: Path) -> Path:
    return Path(state) / FILE


def load(state: Path) -> dict[str, dict]:
    """node -> {reason, since (epoch seconds), job}; {} when none is quarantined."""
    p = path_of(state)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # never every node back in service by accident
        raise NodeprepError(
            f"{p}: unreadable ({str(e)[:80]})",
            hint="fix it, or remove it to put every quarantined node back in service",
        ) from None
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, dict):
        raise NodeprepError(
            f"{p}: no {{'nodes': {{...}}}} in it",
            hint="fix it, or remove it to put every quarantined node back in service",
        )
    return {str(k): v for k, v in nodes.items() if isinstance(v, dict)}


def _save(state: Path, nodes: dict) -> None:
    p = path_of(state)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"nodes": nodes}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, p)


def add(state: Path, node: str, reason: str, job: str, now: float | None = None) -> None:
    nodes = load(state)
    nodes[node] = {"reason": reason, "since": time.time() if now is None else now, "job": job}
    _save(state, nodes)


def release(state: Path, names: list[str]) -> tuple[list[str], list[str]]:
    """(released, not quarantined) of NAMES; ["*"]: every quarantined node."""
    nodes = load(state)
    want = list(nodes) if names == ["*"] else names
    done = [n for n in want if n in nodes]
    for n in done:
        del nodes[n]
    if done:
        _save(state, nodes)
    return done, [n for n in want if n not in done]


def line(node: str, rec: dict) -> str:
    """ "worker-3 quarantined since 2026-11-29 02:14:07 (job J): REASON"."""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(rec.get("since") or 0)))
    return f"{node} quarantined since {since} (job {rec.get('job', '?')}): {rec.get('reason', '')}"
