"""A stage's chains run over the fleet (needs.chains decides them): every node of a chain gets a
hop script (the wheel relay's, ops/pystack/relay.chain_hop: the stream stored and passed on to
the next node over the mesh as it arrives, with nodeside/stage.py's recv as the store), then
the source feeds the first node: the controller (nodeside/stage.py's send run here, its output
sent up one channel) or the node that holds the source (its send piped into an ssh to the first
node, so the bytes never pass through the controller). Each node's recv reports the bytes it
read as `@@stage NODE BYTES` on stderr, which flows back up the chain to the controller:
Flow.progress() is called with them as they come."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from nodeprep import nodeside
from nodeprep.engine.feed import feed
from nodeprep.engine.remote import rpath, write_script
from nodeprep.errors import NodeprepError
from nodeprep.ops.pystack.relay import (
    MeshLogin,
    chain_hop,
    master_command,
    peer_ssh,
    script_path,
    socket_path,
)
from nodeprep.ops.stage.needs import Chain, request
from nodeprep.ops.stage.nodes import SEND, install, recv_command


@dataclass
class Flow:
    """One stage's run: where from (SRC here, or on SOURCE_NODE), where to (DEST on every
    node), how peers log in to each other, and what the nodes said as it went."""

    src: str
    dest: str
    source_node: str | None
    logins: dict[str, MeshLogin]
    progress: Callable[[str, int], None] = lambda node, nbytes: None  # noqa: E731
    token: str = field(default_factory=lambda: secrets.token_hex(6))
    said: dict[str, list[str]] = field(default_factory=dict)  # node -> its error lines
    chain_ids: dict = field(default_factory=dict)  # id(chain) -> its number in this stage
    failed: dict[str, str] = field(default_factory=dict)  # node -> why its chain failed
    sent: int = 0  # bytes the controller sent
    lock: threading.Lock = field(default_factory=threading.Lock)

    def hear(self, line: str) -> None:
        """One line from a chain's nodes."""
        tag, _, rest = line.partition(" ")
        node, _, value = rest.partition(" ")
        if tag == "@@stage" and value.isdigit():
            self.progress(node, int(value))
        elif tag == "stage" and node.endswith(":"):
            with self.lock:
                self.said.setdefault(node[:-1], []).append(value)


def _work(token: str) -> tuple[str, str]:
    d = f"~/.nodeprep/stage-{token}"
    return f"mkdir -p -- {rpath(d)} || exit 1", rpath(d)


def hop_token(flow: Flow, chain: Chain, node: str) -> str:
    """A name of its own for NODE's hop script, fifo directory and master socket in CHAIN:
    nodes that share a home (an NFS home, DEST on their local disks) must not share them."""
    return f"{flow.token}{flow.chain_ids[id(chain)]}n{chain.nodes.index(node)}"


def put_hops(fleet, chain: Chain, flow: Flow, timeout: int) -> None:
    """Every node of CHAIN gets the program, its hop script and its master connection to
    the next node (one round trip each, all at once)."""

    flow.chain_ids.setdefault(id(chain), len(flow.chain_ids))

    def one(session):
        i = chain.nodes.index(session.name)
        nxt = chain.nodes[i + 1] if i + 1 < len(chain.nodes) else None
        login = (nxt, flow.logins[nxt], hop_token(flow, chain, nxt)) if nxt else None
        mine = hop_token(flow, chain, session.name)
        text = chain_hop(
            session.name,
            _work(mine),
            lambda fifo: recv_command(flow.dest, shlex.quote(session.name), fifo),
            login,
            mine,
            timeout,
        )
        master = f"\n{master_command(flow.logins[nxt], mine, timeout)}" if nxt else ""
        r = session.run(
            f"{install()}\n{write_script('~/' + script_path(mine), text, 0o700)}{master}",
            label=f"stage hop ({'last' if nxt is None else 'to ' + nxt})",
        )
        if not r.ok:
            with flow.lock:
                flow.failed.setdefault(session.name, f"no hop script: {r.tail(1)}")

    fleet.map(one, "stage", only=chain.nodes)


class _Lines:
    def __init__(self, flow: Flow):
        self.flow, self.buf = flow, b""

    def __call__(self, data: bytes) -> None:
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            self.flow.hear(line.decode(errors="replace"))


def run_chain(fleet, chain: Chain, flow: Flow, timeout: int) -> None:
    """CHAIN from its source to its end; a failure lands in FLOW.failed for each node of
    the chain (the arrival check then says which of them lack what)."""
    hop = (
        f"timeout -k 5 {int(timeout)} /bin/sh {script_path(hop_token(flow, chain, chain.nodes[0]))}"
    )
    try:
        if flow.source_node is None:
            rc, out = feed(
                fleet.sessions[chain.nodes[0]],
                hop,
                lambda ch: _send_here(ch, flow, chain),
                timeout=300,
                on_output=_Lines(flow),
            )
        else:
            rc, out = _send_from_node(fleet, chain, flow, timeout)
        err = None if rc == 0 else f"exit {rc}: {(out.strip().splitlines() or [''])[-1][:200]}"
    except Exception as e:  # noqa: BLE001 -- the arrival check names what is missing
        err = f"{type(e).__name__}: {str(e)[:200]}"
    if err:
        with flow.lock:
            for n in chain.nodes:
                flow.failed.setdefault(n, err)


def _send_here(ch, flow: Flow, chain: Chain) -> None:
    """The chain's frames, read here by nodeside/stage.py's send, up the channel."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="nodeprep-stage-") as req:
        json.dump(request(chain.need), req)
        req.flush()
        argv = [sys.executable, "-I", "-S", str(nodeside.STAGE), "send", flow.src, req.name]
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None
            while data := os.read(proc.stdout.fileno(), 1 << 20):
                ch.sendall(data)
                with flow.lock:
                    flow.sent += len(data)
            proc.wait()
            if proc.returncode:
                why = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                raise NodeprepError(f"reading {flow.src} failed: {why[-200:]}")


def _send_from_node(fleet, chain: Chain, flow: Flow, timeout: int) -> tuple[int, str]:
    """The chain fed by the node that holds the source: its send piped into an ssh to the
    chain's first node, over the mesh."""
    first = chain.nodes[0]
    req = f"~/.nodeprep/stage-{hop_token(flow, chain, first)}-request.json"  # one per chain
    remote = f"timeout -k 5 {int(timeout)} /bin/sh {script_path(hop_token(flow, chain, first))}"
    script = (
        f"{install()}\n{write_script(req, json.dumps(request(chain.need)), 0o600)}\n"
        f"{{ {SEND} send {rpath(flow.src)} {rpath(req)} | "
        f"{peer_ssh(flow.logins[first], remote, timeout + 10)}; }} 2>&1"
    )
    lines = _Lines(flow)
    r = fleet.sessions[flow.source_node].run(
        script,
        timeout=timeout + 30,
        label=f"stage {flow.src} to {first} and on",
        log_output=False,
        on_line=lambda text: lines(text.encode() + b"\n"),
    )
    return r.rc, r.stdout + r.stderr


def cleanup_script(token: str) -> str:
    """sh leaving nothing of the stage's run TOKEN in the home (hop scripts, fifo directories,
    requests, master connections: every node's, named TOKEN...)."""
    sock = socket_path(token).removesuffix(".sock")
    return (
        f'rm -rf -- "$HOME"/.nodeprep/stage-{token}* "$HOME"/{script_path(token)[:-3]}*.sh; '
        f'for np_s in "$HOME"/{sock}*.sock; do [ -S "$np_s" ] && ssh -S "$np_s" -O exit '
        f'-- peer >/dev/null 2>&1; rm -f -- "$np_s"; done; true'
    )
