"""Wheels by sbcast (--via slurm): each platform's missing wheels as ONE tar file that the
Slurm head `sbcast`s to every node lacking them (Slurm's own tree: the controller sends the
file once, to the head), unpacked by one srun step into <wheelhouse>/.relay, where the
relay's arrival check takes it from (ops/pystack/relay.py: each wheel checked against the
controller's sha256 before it is used, what did not arrive pushed by the controller)."""

from __future__ import annotations

import shlex
import tempfile
from pathlib import Path

from nodeprep.ops.pystack.relay import STAGE, Relay, Want
from nodeprep.ops.pystack.relay_run import stream_tar


def unpack_script(tarball: str, dest: str) -> str:
    """sh for a node that received the platform's tar by sbcast: into DEST/.relay, where the
    arrival check (finalize_script) takes it from, as after a chain."""
    d, s = shlex.quote(dest), shlex.quote(f"{dest}/{STAGE}")
    return (
        f"umask 077; rm -rf -- {s} && mkdir -p -- {d} && mkdir -- {s} && "
        f"tar -xf {shlex.quote(tarball)} -C {s}"
    )


def run(fleet, nodes: list[str], relay: Relay, events, notes: list) -> None:
    """The fleet-level work of the wheelhouse's second pass under --via slurm (Step.fleet).
    Never raises: what did not arrive is pushed by the controller afterwards."""
    try:
        _run(fleet, nodes, relay, events, notes)
    except Exception as e:  # noqa: BLE001 -- a bug here costs the broadcast, not the run
        events.log(f"wheelhouse: sbcast failed ({type(e).__name__}: {e}); the controller pushes")
        relay.fail(nodes, f"sbcast failed: {type(e).__name__}: {str(e)[:200]}")


def _run(fleet, nodes: list[str], relay: Relay, events, notes: list) -> None:
    """One tar per platform; the tar leaves /tmp in a later step than the unpack (nodes may
    share /tmp)."""
    by_platform: dict[str, list[Want]] = {}
    usable = {s.name for s in fleet.usable()}
    for n in nodes:
        w = relay.wants.get(n)
        if w is not None and w.missing and n in usable:
            by_platform.setdefault(w.platform, []).append(w)
    for k, (platform, wants) in enumerate(sorted(by_platform.items())):
        files = sorted({f for w in wants for f in w.missing})
        names = [w.node for w in wants]
        remote = f"/tmp/nodeprep-wheels-{relay.token}-{k}.tar"
        for n in names:
            relay.source[n] = "sbcast"
        with tempfile.TemporaryDirectory(prefix="nodeprep-sbcast-") as tmp:
            tarball = Path(tmp) / "wheels.tar"
            with open(tarball, "wb") as fh:
                stream_tar(_File(fh), relay.local[platform], files)
            size = tarball.stat().st_size
            events.log(
                f"wheelhouse: {len(files)} wheels ({size / 1e6:.1f} MB) of {platform} to "
                f"{len(names)} node(s) by sbcast"
            )
            try:
                failed = fleet.transport.broadcast(tarball, remote, names)
            except Exception as e:  # noqa: BLE001 -- the controller pushes instead
                failed = {n: f"{type(e).__name__}: {str(e)[:200]}" for n in names}
        relay.count(names[0], size)
        with relay.lock:
            for n, err in failed.items():
                relay.errors[n] = f"sbcast: {err}"
        got = [w for w in wants if w.node not in failed]
        dests = {w.node: w.dest for w in got}
        done = fleet.map(
            lambda s: s.run(unpack_script(remote, dests[s.name]), label="unpack the sbcast wheels"),
            "relay",
            only=list(dests),
        )
        with relay.lock:
            for n, r in done.items():
                if not r.ok:
                    relay.errors[n] = f"unpacking the sbcast wheels failed: {r.tail(1)}"
        fleet.map(
            lambda s: s.run(f"rm -f -- {shlex.quote(remote)}", label="sbcast tar off /tmp"),
            "relay",
            only=names,
        )
        notes.append(
            f"wheelhouse sbcast {platform}: {len(names)} node(s), {size / 1e6:.1f} MB sent "
            "by the controller (to the head)"
        )


class _File:
    """A file as stream_tar's channel (sendall)."""

    def __init__(self, fh):
        self.fh = fh

    def sendall(self, b) -> None:
        self.fh.write(b)
