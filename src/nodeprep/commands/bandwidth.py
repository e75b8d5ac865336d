"""`invoke bandwidth`: TCP bandwidth and latency between the nodes, in rounds where every node
sends and receives at once (ops/health/pairs.py: the full ring shift, or --quick's matching
and second pass), with nodeside/bwpair.py on every node of a round; the result is the matrix
and the nodes the rule flags."""
from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from nodeprep import nodeside
from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import BandwidthOptions
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops.health import pairs
from nodeprep.settings import Settings


@dataclass
class BandwidthResult:
    matrix: pairs.Matrix
    mode: str                   # full | quick
    rounds: int
    seconds: float
    flagged: dict[str, str]

    def as_dict(self) -> dict:
        return {"mode": self.mode, "rounds": self.rounds, "seconds_per_round": self.seconds,
                **self.matrix.as_dict(), "flagged": self.flagged}

    @property
    def exit_code(self) -> int:
        return 1 if self.flagged or self.matrix.errors else 0


def _round(fleet: Fleet, flows: list[tuple[str, str]], addr: dict, opts: BandwidthOptions, m: pairs.Matrix):
    """One round: every sender of FLOWS sends to its receiver while receiving from its own."""
    text = nodeside.BWPAIR.read_text()
    peer = dict(flows)

    def one(s):
        py = shlex.quote(str(s.host.vars.get("python") or "python3"))
        cmd = f"{py} -I -S -c {shlex.quote(text)} {opts.port} {shlex.quote(addr[peer[s.name]])} {opts.seconds:g}"
        r = s.run(cmd, timeout=opts.seconds + 90, label=f"bandwidth to {peer[s.name]}")
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        if r.rc != 0 or not lines:
            raise NodeprepError(f"bandwidth program failed (exit {r.rc}): {r.tail(2)}")
        return json.loads(lines[-1])
    got = fleet.map(one, "bandwidth", only=list(peer))
    for src, dst in flows:
        res = got.get(src)
        if res is None:
            m.errors[(src, dst)] = "the sender did not answer"
        elif res.get("error") or not res.get("seconds"):
            m.errors[(src, dst)] = res.get("error") or "nothing sent"
        else:
            m.rate[(src, dst)] = res["sent_bytes"] * 8 / res["seconds"] / 1e9
            if res.get("rtt_ms") is not None:
                m.rtt[(src, dst)] = res["rtt_ms"]


def bandwidth(opts: BandwidthOptions, settings: Settings, events: Events) -> BandwidthResult:
    opts.check()
    _inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    if len(hosts) < 2:
        raise InputError("bandwidth needs at least 2 nodes", hint="--limit at least two nodes")
    names = [h.name for h in hosts]
    addr = {h.name: h.address for h in hosts}
    m = pairs.Matrix(names)
    with Fleet(hosts, settings, "bandwidth", events) as fleet:
        if not opts.quick or len(names) < 4:        # under 4 nodes a matching has no reference
            plan = pairs.ring_rounds(names)
            for flows in plan:
                _round(fleet, flows, addr, opts, m)
            mode = "full" if not opts.quick else "full (--quick needs 4 nodes or more)"
            return BandwidthResult(m, mode, len(plan), opts.seconds, m.flagged())
        matched, left = pairs.matching(names)
        _round(fleet, pairs.both_ways(matched), addr, opts, m)
        suspects = m.suspects() | set(left)
        second = pairs.second_pass(m, suspects)
        for flows in second:
            _round(fleet, flows, addr, opts, m)
        flagged = {n: why for n, why in m.flagged().items() if n in suspects}   # a pass never flips
        return BandwidthResult(m, "quick", 1 + len(second), opts.seconds, flagged)
