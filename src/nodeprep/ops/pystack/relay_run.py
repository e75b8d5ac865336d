"""One apply pass's relay run over the fleet (relay.py has the chains and the sh each node
runs): every node's hop script put in place, then the chains at once, one per platform, each
fed by the controller's tar stream or by a node that holds the wheels. What did not arrive is
left in the Relay for the controller to push."""

from __future__ import annotations

import tarfile
import threading
from pathlib import Path

from nodeprep.engine.feed import feed as engine_feed
from nodeprep.engine.remote import write_script
from nodeprep.ops.pystack.relay import (
    MIN_RATE,
    Chain,
    Relay,
    chains_for,
    hop_script,
    master_command,
    script_path,
    source_script,
)


def timeout_for(nbytes: int, hops: int) -> int:
    return int(120 + 5 * hops + nbytes / MIN_RATE)


def stream_tar(channel, local: Path, files: list[str]) -> int:
    """FILES of LOCAL as one tar stream into CHANNEL's stdin; returns the bytes sent."""

    class Out:
        n = 0

        def write(self, b):
            channel.sendall(b)
            Out.n += len(b)
            return len(b)

    with tarfile.open(fileobj=Out(), mode="w|", bufsize=1 << 20, format=tarfile.GNU_FORMAT) as tar:
        for name in files:
            info = tar.gettarinfo(str(local / name), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(local / name, "rb") as fh:
                tar.addfile(info, fh)
    return Out.n


def write_hop(session, node: str, chain: Chain, relay: Relay, timeout: int) -> None:
    """Put NODE's hop script of CHAIN in its home (one round trip)."""
    i = chain.nodes.index(node)
    nxt = chain.nodes[i + 1] if i + 1 < len(chain.nodes) else None
    text = hop_script(
        node,
        relay.wants[node].dest,
        (nxt, relay.logins[nxt]) if nxt else None,
        relay.token,
        timeout,
    )
    master = f"\n{master_command(relay.logins[nxt], relay.token, timeout)}" if nxt else ""
    r = session.run(
        write_script("~/" + script_path(relay.token), text, 0o700) + master,
        label=f"relay script ({'last' if nxt is None else 'to ' + nxt})",
    )
    if not r.ok:
        with relay.lock:
            relay.errors[node] = f"cannot write the relay script: {r.tail(1)}"


def feed(session, chain: Chain, relay: Relay, timeout: int) -> tuple[int, str]:
    """The controller's stream into the chain's first node (its hop script reads stdin):
    (exit status, output)."""

    def write(ch) -> None:
        relay.count(chain.nodes[0], stream_tar(ch, relay.local[chain.platform], chain.files))

    return engine_feed(
        session,
        f"timeout -k 5 {int(timeout)} /bin/sh {script_path(relay.token)}",
        write,
        timeout,
    )


def run_chain(fleet, chain: Chain, relay: Relay, timeout: int) -> None:
    """One chain, start to end; who got the stream from whom, and any error, in RELAY."""
    for i, n in enumerate(chain.nodes):
        relay.source[n] = chain.nodes[i - 1] if i else (chain.source or "controller")
    try:
        if chain.source is None:
            head = fleet.sessions[chain.nodes[0]]
            rc, out = feed(head, chain, relay, timeout)
            head.log(out + f"[relay exit {rc}]\n")
        else:
            src = fleet.sessions[chain.source]
            r = src.run(
                source_script(
                    relay.holders[chain.platform][chain.source],
                    chain.files,
                    (chain.nodes[0], relay.logins[chain.nodes[0]]),
                    relay.token,
                    timeout,
                ),
                timeout=timeout + 20,
                label=f"relay {len(chain.files)} {relay.unit} to {chain.nodes[0]} and on",
            )
            rc, out = r.rc, r.stdout + r.stderr
        err = (
            f"relay exit {rc}: {out.strip().splitlines()[-1][:200]}"
            if rc and out.strip()
            else (f"relay exit {rc}" if rc else None)
        )
    except Exception as e:  # noqa: BLE001 -- the fallback pushes what did not arrive
        err = f"relay failed: {type(e).__name__}: {str(e)[:200]}"
    if err:
        relay.fail(chain.nodes, err)


def run(fleet, nodes: list[str], relay: Relay, events, notes: list) -> None:
    """The fleet-level relay of one apply pass (Step.fleet): the chains over NODES, put
    each node's hop script in place, run the chains (one per platform, at once). Never
    raises: what did not arrive is pushed by the controller afterwards."""
    try:
        _run(fleet, nodes, relay, events, notes)
    except Exception as e:  # noqa: BLE001 -- a bug here costs the relay, not the run
        events.log(f"{relay.what}: relay failed ({type(e).__name__}: {e}); the controller pushes")
        relay.fail(nodes, f"relay failed: {type(e).__name__}: {str(e)[:200]}", source="controller")


def _run(fleet, nodes: list[str], relay: Relay, events, notes: list) -> None:
    usable = {s.name for s in fleet.usable()}
    holders = {
        p: [h for h in relay.order if h in hs and h in usable and h not in nodes]
        for p, hs in relay.holders.items()
    }
    chains = chains_for([relay.wants[n] for n in nodes if n in relay.wants], holders, relay.order)
    where = {n: c for c in chains for n in c.nodes}
    size = {
        c.platform: sum((relay.local[c.platform] / f).stat().st_size for f in c.files)
        for c in chains
    }
    timeouts = {c.platform: timeout_for(size[c.platform], len(c.nodes)) for c in chains}
    fleet.map(
        lambda s: write_hop(s, s.name, where[s.name], relay, timeouts[where[s.name].platform]),
        "relay",
        only=list(where),
    )
    threads = []
    for c in chains:
        events.log(
            f"{relay.what}: {len(c.files)} {relay.unit} ({size[c.platform] / 1e6:.1f} MB) of "
            f"{c.platform} to {len(c.nodes)} node(s), chained from "
            f"{c.source or 'the controller'}"
        )
        t = threading.Thread(target=run_chain, args=(fleet, c, relay, timeouts[c.platform]))
        t.start()
        threads.append(t)
    for t in threads:
        t.join()
    for c in chains:
        sent = sum(relay.sent.get(n, 0) for n in c.nodes)
        notes.append(
            f"{relay.what} relay {c.platform}: {len(c.nodes)} node(s) chained from "
            f"{c.source or 'the controller'}, {sent / 1e6:.1f} MB sent by the controller"
        )
