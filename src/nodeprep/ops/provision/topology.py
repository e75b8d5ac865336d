"""Which inventory nodes share a machine or a home, from each node's IDENTITY fact.

Two inventory nodes can be one machine (the single-box recipe: aliases of localhost, or a
big box split into partitions), and many machines can share one home (an NFS home). A step
declares what it changes (engine/steps.Step.scope); the planner lets one node of each group
act for the group (the first in inventory order) and has the others only verify it. How
nodes on one machine split its GPUs for a launch is ops/train/gpusplit.py."""

from __future__ import annotations

from dataclasses import dataclass, field

from nodeprep.engine.facts import IDENTITY
from nodeprep.inventory.nodeset import fold


@dataclass
class Topology:
    homes: dict[str, list[str]] = field(default_factory=dict)  # home id -> nodes
    by_machine_id: dict[str, list[str]] = field(default_factory=dict)  # machine-id:boot-id -> nodes
    home_of: dict[str, str] = field(default_factory=dict)
    machine_id_of: dict[str, str] = field(default_factory=dict)  # node -> machine-id:boot-id

    @classmethod
    def of(cls, facts: dict, order: list[str]) -> "Topology":
        """FACTS: {node: facts with IDENTITY}; nodes without it are alone in their groups."""
        t = cls()
        for n in order:
            ident = (facts.get(n) or {}).get(IDENTITY.key) or {}
            home = ident.get("home") or f"node:{n}"
            machine_id = ident.get("machine") or f"node:{n}"
            t.home_of[n], t.machine_id_of[n] = home, machine_id
            t.homes.setdefault(home, []).append(n)
            t.by_machine_id.setdefault(machine_id, []).append(n)
        return t

    def actor(self, node: str, scope: str) -> str:
        """The node that acts for NODE's group of SCOPE (home, machine); NODE itself for node."""
        if scope == "home":
            return self.homes[self.home_of[node]][0]
        if scope == "machine":
            return self.by_machine_id[self.machine_id_of[node]][0]
        return node

    def leads_all(self, node: str) -> bool:
        """Does NODE act for every group it is in (nothing of it waits for another node)?"""
        return self.actor(node, "home") == node and self.actor(node, "machine") == node

    @property
    def shared(self) -> bool:
        return any(len(v) > 1 for v in (*self.homes.values(), *self.by_machine_id.values()))

    def describe(self) -> list[str]:
        """One line per shared group: `worker-[0-15] share one home (worker-0 acts for it)`."""
        out = [
            f"{fold(ns)} share one home ({ns[0]} acts for it)"
            for ns in self.homes.values()
            if len(ns) > 1
        ]
        out += [
            f"{fold(ns)} are one machine ({ns[0]} acts for it)"
            for ns in self.by_machine_id.values()
            if len(ns) > 1
        ]
        return out
