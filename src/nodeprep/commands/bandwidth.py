"""`invoke bandwidth`: TCP bandwidth and latency between the nodes, in rounds where every node
sends and receives at once (ops/health/pairs.py: the full ring shift, or --quick's matching
and second pass), with iperf3 (nodeside/iperf3pair.sh) where every node has it, else
nodeside/bwpair.py, on every node of a round; the result is the matrix and the nodes the rule
flags."""
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
    tool: str = "builtin"       # iperf3 | builtin

    def as_dict(self) -> dict:
        return {"mode": self.mode, "tool": self.tool, "rounds": self.rounds, "seconds_per_round": self.seconds,
                **self.matrix.as_dict(), "flagged": self.flagged}

    @property
    def exit_code(self) -> int:
        return 1 if self.flagged or self.matrix.errors else 0


def _command(tool: str, peer_addr: str, opts: BandwidthOptions, python: str) -> str:
    if tool == "iperf3":
        secs = max(1, round(opts.seconds))          # iperf3's -t takes whole seconds
        return (f"sh -c {shlex.quote(nodeside.IPERF3PAIR.read_text())} - {opts.port} "
                f"{shlex.quote(peer_addr)} {secs} {secs + 60}")
    return (f"{shlex.quote(python)} -I -S -c {shlex.quote(nodeside.BWPAIR.read_text())} {opts.port} "
            f"{shlex.quote(peer_addr)} {opts.seconds:g}")


def _result(tool: str, r) -> dict:
    if tool == "iperf3":
        return pairs.iperf3_result(r.stdout)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.rc != 0 or not lines:
        raise NodeprepError(f"bandwidth program failed (exit {r.rc}): {r.tail(2)}")
    return json.loads(lines[-1])


def _round(fleet: Fleet, flows: list[tuple[str, str]], addr: dict, opts: BandwidthOptions, m: pairs.Matrix,
           tool: str = "builtin"):
    """One round: every sender of FLOWS sends to its receiver while receiving from its own."""
    peer = dict(flows)

    def one(s):
        cmd = _command(tool, addr[peer[s.name]], opts, str(s.host.vars.get("python") or "python3"))
        r = s.run(cmd, timeout=opts.seconds + 90, label=f"bandwidth to {peer[s.name]} ({tool})")
        return _result(tool, r)
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


def choose_tool(fleet: Fleet, want: str) -> str:
    """iperf3 where every node has it on the login PATH (--tool auto), else the builtin sender;
    --tool iperf3 on a node without it is a bad input naming the node."""
    if want == "builtin":
        return "builtin"
    has = fleet.map(lambda s: s.run("command -v iperf3", timeout=30, label="iperf3?").rc == 0, "bandwidth: tool")
    lacking = sorted(n for n, ok in has.items() if not ok)
    if want == "iperf3" and lacking:
        raise InputError(f"--tool iperf3: no iperf3 on {', '.join(lacking[:5])}",
                         hint="install it there (Debian/Ubuntu: apt install iperf3) or use --tool builtin")
    return "iperf3" if has and not lacking else "builtin"


def bandwidth(opts: BandwidthOptions, settings: Settings, events: Events) -> BandwidthResult:
    opts.check()
    _inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    if len(hosts) < 2:
        raise InputError("bandwidth needs at least 2 nodes", hint="--limit at least two nodes")
    names = [h.name for h in hosts]
    addr = {h.name: h.address for h in hosts}
    m = pairs.Matrix(names)
    with Fleet(hosts, settings, "bandwidth", events) as fleet:
        tool = choose_tool(fleet, opts.tool)
        if not opts.quick or len(names) < 4:        # under 4 nodes a matching has no reference
            plan = pairs.ring_rounds(names)
            for flows in plan:
                _round(fleet, flows, addr, opts, m, tool)
            mode = "full" if not opts.quick else "full (--quick needs 4 nodes or more)"
            return BandwidthResult(m, mode, len(plan), opts.seconds, m.flagged(), tool)
        matched, left = pairs.matching(names)
        _round(fleet, pairs.both_ways(matched), addr, opts, m, tool)
        suspects = m.suspects() | set(left)
        second = pairs.second_pass(m, suspects)
        for flows in second:
            _round(fleet, flows, addr, opts, m, tool)
        flagged = {n: why for n, why in m.flagged().items() if n in suspects}   # a pass never flips
        return BandwidthResult(m, "quick", 1 + len(second), opts.seconds, flagged, tool)
