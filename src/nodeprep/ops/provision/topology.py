"""Which inventory nodes share a machine or a home, from each node's IDENTITY fact.

Two inventory nodes can be one machine (the single-box recipe: aliases of localhost, or a
big box split into partitions), and many machines can share one home (an NFS home). A step
declares what it changes (engine/steps.Step.scope); the planner lets one node of each group
act for the group (the first in inventory order) and has the others only verify it."""
from __future__ import annotations

from dataclasses import dataclass, field

from nodeprep.engine.facts import IDENTITY
from nodeprep.errors import InputError
from nodeprep.inventory.nodeset import fold


@dataclass
class Topology:
    homes: dict[str, list[str]] = field(default_factory=dict)      # home id -> nodes
    machines: dict[str, list[str]] = field(default_factory=dict)   # machine id -> nodes
    home_of: dict[str, str] = field(default_factory=dict)
    machine_of: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, facts: dict, order: list[str]) -> "Topology":
        """FACTS: {node: facts with IDENTITY}; nodes without it are alone in their groups."""
        t = cls()
        for n in order:
            ident = (facts.get(n) or {}).get(IDENTITY.key) or {}
            home = ident.get("home") or f"node:{n}"
            machine = ident.get("machine") or f"node:{n}"
            t.home_of[n], t.machine_of[n] = home, machine
            t.homes.setdefault(home, []).append(n)
            t.machines.setdefault(machine, []).append(n)
        return t

    def actor(self, node: str, scope: str) -> str:
        """The node that acts for NODE's group of SCOPE (home, machine); NODE itself for node."""
        if scope == "home":
            return self.homes[self.home_of[node]][0]
        if scope == "machine":
            return self.machines[self.machine_of[node]][0]
        return node

    def leads_all(self, node: str) -> bool:
        """Does NODE act for every group it is in (nothing of it waits for another node)?"""
        return self.actor(node, "home") == node and self.actor(node, "machine") == node

    @property
    def shared(self) -> bool:
        return any(len(v) > 1 for v in (*self.homes.values(), *self.machines.values()))

    def describe(self) -> list[str]:
        """One line per shared group: `worker-[0-15] share one home (worker-0 acts for it)`."""
        out = [f"{fold(ns)} share one home ({ns[0]} acts for it)" for ns in self.homes.values() if len(ns) > 1]
        out += [f"{fold(ns)} are one machine ({ns[0]} acts for it)" for ns in self.machines.values()
                if len(ns) > 1]
        return out


def gpu_shares(topo: Topology, names: list[str], gpus: dict[str, int]) -> dict[str, list[int]]:
    """Inventory nodes that are one machine split its GPUs: node k of the M selected ones gets
    [k*K/M, (k+1)*K/M) (as `train --emulate` does), so no two share a GPU. Nodes alone on
    their machine, or on a machine without GPUs, are not in the answer (they use them all)."""
    out: dict[str, list[int]] = {}
    for nodes in topo.machines.values():
        sel = [n for n in nodes if n in names]
        k_gpus = gpus.get(sel[0], 0) if sel else 0
        if len(sel) < 2 or not k_gpus:
            continue
        if k_gpus % len(sel):
            raise InputError(f"{fold(sel)} are one machine with {k_gpus} GPU(s), which do not split "
                             f"evenly over {len(sel)} nodes",
                             hint="select a number of its nodes that divides its GPU count (--limit)")
        per = k_gpus // len(sel)
        out.update({n: list(range(k * per, (k + 1) * per)) for k, n in enumerate(sel)})
    return out
