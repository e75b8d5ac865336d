"""A job's sync through a chain where it helps (issue 48): homes whose sync would send the same
thing (the same files, deletions and record: a first sync, a change every node lacks) get ONE
stream from the controller, passed node to node over the mesh as it arrives (the wheel relay's
hop, ops/pystack/relay.chain_hop, with `tee` into the next node and nodeside/syncrecv.py
storing). Worth it from MIN_NODES homes and MIN_BYTES up: below that a chain's logins cost more
than the controller's copies.

Nothing here has the last word: the sync that follows (push.push on every home) reads every
node again, so a node the chain did not fill (no mesh, a hop that failed) gets its own stream
from the controller then, and a filled one moves nothing."""

from __future__ import annotations

import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path

from nodeprep.engine.feed import feed
from nodeprep.engine.remote import rpath, write_script
from nodeprep.ops.pystack.relay import (
    MeshLogin,
    chain_hop,
    master_command,
    script_path,
    socket_path,
)
from nodeprep.ops.pystack.relay_run import timeout_for
from nodeprep.ops.sync import push

MIN_NODES = 3
MIN_BYTES = 4 << 20


@dataclass
class Chain:
    nodes: list[str]
    look: push.Look  # the first node's: every node of the chain has the same plan
    token: str = field(default_factory=lambda: secrets.token_hex(6))

    @property
    def timeout(self) -> int:
        return timeout_for(self.look.pushed.nbytes, len(self.nodes))


def chains(looks: dict[str, push.Look], order: list[str]) -> list[Chain]:
    """Homes (in ORDER) whose looks would send the same, grouped where it is worth a chain."""
    groups: dict[tuple, list[str]] = {}
    for n in order:
        lk = looks.get(n)
        if lk is None or lk.idle or lk.pushed.nbytes < MIN_BYTES:
            continue
        key = (lk.job_dir, tuple(lk.plan.send), tuple(lk.plan.delete), repr(lk.plan.record))
        groups.setdefault(key, []).append(n)
    return [Chain(ns, looks[ns[0]]) for ns in groups.values() if len(ns) >= MIN_NODES]


@dataclass
class FannedOut:
    looks: dict  # node -> its look before any chain (still true where no chain went)
    chained: dict = field(default_factory=dict)  # node -> what its chain was to bring it

    def look(self, node: str) -> push.Look | None:
        """NODE's look where it still holds (no chain went there), None where it must be
        read again."""
        return None if node in self.chained else self.looks.get(node)


def fan_out(fleet, homes: list[str], files: dict[str, Path], job_dir, how: push.How) -> FannedOut:
    """Chains over HOMES for FILES (JOB_DIR(node): where they go). Never raises: the sync
    that follows (push.push with FannedOut.look) fills what is missing."""
    looks = fleet.map(lambda s: push.look(s, files, job_dir(s.name), how), "sync", only=homes)
    out = FannedOut(looks)
    todo = chains(looks, homes)
    if not todo:
        return out
    logins = {
        n: MeshLogin(s.host.address, int(s.host.port or 22), s.host.user)
        for n, s in fleet.sessions.items()
    }
    try:
        for c in todo:
            fleet.map(lambda s, c=c: _put(s, c, logins, how), "sync", only=c.nodes)
        threads = [threading.Thread(target=_feed, args=(fleet, c, files, how)) for c in todo]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        fleet.cleanup(lambda s: s.run(_cleanup(todo), label="sync chain cleanup"), "sync", homes)
    out.chained = {n: looks[n].pushed for c in todo for n in c.nodes}
    return out


def _store(python: str, fifo: str | None) -> str:
    if fifo is None:
        return python
    return f"{{ tee -p -- {fifo} | {{ {python}\n}}; }}"


def _work(c: Chain) -> str:
    return f"~/.nodeprep/sync-{c.token}"


def _put(session, c: Chain, logins: dict, how: push.How) -> None:
    """SESSION's hop script of chain C and its master connection to the next node."""
    i = c.nodes.index(session.name)
    nxt = c.nodes[i + 1] if i + 1 < len(c.nodes) else None
    python = how.python(session.name, push.receiver(c.look.job_dir))
    text = chain_hop(
        session.name,
        (f"mkdir -p -- {rpath(_work(c))} || exit 1", rpath(_work(c))),
        lambda fifo: _store(python, fifo),
        (nxt, logins[nxt]) if nxt else None,
        c.token,
        c.timeout,
    )
    master = f"\n{master_command(logins[nxt], c.token, c.timeout)}" if nxt else ""
    session.run(
        write_script("~/" + script_path(c.token), text, 0o700) + master,
        label=f"sync hop ({'last' if nxt is None else 'to ' + nxt})",
    )


def _feed(fleet, c: Chain, files: dict[str, Path], how: push.How) -> None:
    head = fleet.sessions[c.nodes[0]]
    try:
        rc, out = feed(
            head,
            f"timeout -k 5 {int(c.timeout)} /bin/sh {script_path(c.token)}",
            push.spooled(c.look.head(), how.spools.get(files, c.look.plan.send)),
            timeout=300,
        )
        head.log(f"{out}[sync chain through {', '.join(c.nodes)}: exit {rc}]\n")
    except Exception as e:  # noqa: BLE001 -- the sync that follows fills what is missing
        head.log(f"sync chain failed: {type(e).__name__}: {e}\n")


def _cleanup(todo: list[Chain]) -> str:
    out = []
    for c in todo:
        sock = f'"$HOME/{socket_path(c.token)}"'
        out.append(
            f"rm -rf -- {rpath(_work(c))} {rpath('~/' + script_path(c.token))}; "
            f"[ -S {sock} ] && ssh -S {sock} -O exit -- peer >/dev/null 2>&1; rm -f -- {sock}"
        )
    return "; ".join(out) + "; true"
