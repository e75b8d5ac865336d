"""Spare nodes for `train --restarts` (issue 47): the hosts of `--spares PATTERN`, else of the
inventory's `spares` group, never among the job's first nodes. One takes a quarantined node's
place once `provision` has converged it and `verify-parity` holds between it and the nodes the
job goes on with; a spare that fails either is quarantined with the reason."""

from __future__ import annotations

import time

from nodeprep.commands import provision as provision_cmd
from nodeprep.commands import verify as verify_cmd
from nodeprep.commands.options import ProvisionOptions, TrainOptions, VerifyOptions
from nodeprep.engine.events import Events
from nodeprep.errors import NodeprepError
from nodeprep.settings import Settings

GROUP = "spares"


def of(opts: TrainOptions, inv) -> list:
    """The spare hosts, inventory order: --spares, else the `spares` group ([] without one)."""
    pattern = opts.spares or (GROUP if GROUP in inv.groups else None)
    return inv.select(pattern) if pattern else []


def converge(name: str, peers: list[str], opts: TrainOptions, settings: Settings, events: Events):
    """(None when spare NAME is ready, else why not; seconds it took): provisioned as the job's
    nodes are, then parity with PEERS."""
    t0 = time.monotonic()
    try:
        res = provision_cmd.provision(
            ProvisionOptions(inventory=opts.inventory, limit=name), settings, events
        )
        if res.exit_code:
            node = res.report["nodes"].get(name) or {}
            return f"provision failed: {node.get('message') or node.get('status')}", _since(t0)
        rep = verify_cmd.verify(
            VerifyOptions(inventory=opts.inventory, limit=",".join([*peers, name]), port=None),
            settings,
            events,
        ).report
    except NodeprepError as e:
        return f"{e.message}", _since(t0)
    if not rep.ok:
        odd = [f"{d.key}" for d in rep.drift if d.severity == "error"][:4]
        why = ", ".join(odd) or "; ".join(f"{n}: {w}" for n, w in rep.unreachable.items())
        return f"parity with {', '.join(peers)} does not hold ({why or 'see verify-parity'})", (
            _since(t0)
        )
    return None, _since(t0)


def _since(t0: float) -> float:
    return time.monotonic() - t0
