"""`invoke facts`: every node's facts (host name, OS, Python, login shell, GPUs, free disk) in
one round trip per node."""

from __future__ import annotations

from dataclasses import dataclass

from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import FactsOptions
from nodeprep.engine import facts as factmod
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.settings import Settings


@dataclass
class FactsResult:
    report: dict  # the run report: per node status, message and "facts"

    @property
    def exit_code(self) -> int:
        return 1 if self.report["failed"] or self.report["unreachable"] else 0


def facts(opts: FactsOptions, settings: Settings, events: Events) -> FactsResult:
    inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    with Fleet(hosts, settings, "facts", events) as fleet:
        values = fleet.map(lambda s: factmod.gather(s, factmod.NODE_FACTS, s.host.vars), "facts")
        for node, v in values.items():
            fleet.sessions[node].result.data["facts"] = dict(v)
        return FactsResult(fleet.report(inventory=inv.name))
