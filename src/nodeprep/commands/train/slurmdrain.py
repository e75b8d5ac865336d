"""`train --restarts --drain` (issue 47): each node the job quarantines is drained in Slurm as
`invoke health --drain` drains a node with a CRITICAL finding (reason `nodeprep: QUARANTINED
(invoke health)`; a node someone else drained is left as it is), scontrol run on the first of
the job's remaining nodes that answers. `invoke train.release` and then `invoke health
--undrain` put it back in service."""

from __future__ import annotations

from nodeprep.commands import health as health_cmd
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.errors import NodeprepError
from nodeprep.settings import Settings

CODE = "QUARANTINED"  # the finding health gives a quarantined node (commands/health.quarantined)


def drain_held(held: list[str], peers: list, by_name: dict, settings: Settings, events: Events):
    """One line per node of HELD (quarantined just now) saying what Slurm was told; PEERS: the
    hosts the job goes on with (one of them runs scontrol), BY_NAME: every host of the job."""
    hosts = [*peers, *(by_name[n] for n in held)]
    try:
        with Fleet(peers, settings, "train", events) as fleet:
            done = health_cmd.slurm_actions(
                fleet, hosts, {n: [CODE] for n in held}, list(held), True, False
            )
    except NodeprepError as e:
        return [f"--drain: {e}"]
    return [
        f"slurm: {a.op} {a.slurm or a.node}: " + (f"FAILED: {err}" if err else a.why)
        for a, err in done
    ]
