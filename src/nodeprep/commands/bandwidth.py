"""`invoke bandwidth`: TCP bandwidth and latency between the nodes, in rounds where every node
sends and receives at once (ops/health/pairs.py: the full ring shift, or --quick's matching
and second pass), with iperf3 (nodeside/iperf3pair.sh) where every node has it, else
nodeside/bwpair.py, on every node of a round; the result is the matrix and the nodes the rule
flags. When iperf3 fails a pair for a node's own reason (a full /tmp, a crash), the node is
named with iperf3's line and the builtin program measures the whole matrix (pairs.Fallback)."""

from __future__ import annotations

import json
import shlex
from dataclasses import KW_ONLY, dataclass

from nodeprep import nodeside
from nodeprep.commands.common import select_hosts
from nodeprep.commands.options import BandwidthOptions
from nodeprep.engine.events import Events
from nodeprep.engine.fleet import Fleet
from nodeprep.errors import InputError, NodeprepError
from nodeprep.ops.health import pairs
from nodeprep.settings import Settings

NOT_ON_PATH = "iperf3: not found on the login PATH"


@dataclass
class BandwidthResult:
    matrix: pairs.Matrix
    mode: str  # full | quick
    rounds: int
    _: KW_ONLY
    seconds: float
    flagged: dict[str, str]
    tool: str = "builtin"  # iperf3 | builtin: the tool of every pair in the matrix
    fallback: pairs.Fallback | None = None  # why builtin where iperf3 was wanted

    def as_dict(self) -> dict:
        return {
            "mode": self.mode,
            "tool": self.tool,
            "rounds": self.rounds,
            "seconds_per_round": self.seconds,
            **self.matrix.as_dict(),
            "flagged": self.flagged,
            "fallback": self.fallback.as_dict() if self.fallback else None,
        }

    @property
    def exit_code(self) -> int:
        return 1 if self.flagged or self.matrix.errors else 0


def _command(tool: str, peer_addr: str, opts: BandwidthOptions, python: str) -> str:
    if tool == "iperf3":
        secs = max(1, round(opts.seconds))  # iperf3's -t takes whole seconds
        return (
            f"sh -c {shlex.quote(nodeside.IPERF3PAIR.read_text())} - {opts.port} "
            f"{shlex.quote(peer_addr)} {secs} {secs + 60}"
        )
    return (
        f"{shlex.quote(python)} -I -S -c {shlex.quote(nodeside.BWPAIR.read_text())} {opts.port} "
        f"{shlex.quote(peer_addr)} {opts.seconds:g}"
    )


def _result(tool: str, r) -> dict:
    if tool == "iperf3":
        return pairs.iperf3_answer(r.stdout)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.rc != 0 or not lines:
        raise NodeprepError(f"bandwidth program failed (exit {r.rc}): {r.tail(2)}")
    return json.loads(lines[-1])


@dataclass
class _Rounds:
    """Runs rounds on the fleet into a matrix, with one tool."""

    fleet: Fleet
    addr: dict[str, str]
    opts: BandwidthOptions
    tool: str

    def run(self, flows: list[tuple[str, str]], m: pairs.Matrix) -> None:
        """One round: every sender of FLOWS sends to its receiver while receiving from its own."""
        peer = dict(flows)

        def one(s):
            cmd = _command(
                self.tool,
                self.addr[peer[s.name]],
                self.opts,
                str(s.host.vars.get("python") or "python3"),
            )
            r = s.run(
                cmd,
                timeout=self.opts.seconds + 90,
                label=f"bandwidth to {peer[s.name]} ({self.tool})",
            )
            return _result(self.tool, r)

        got = self.fleet.map(one, "bandwidth", only=list(peer))
        if self.tool == "iperf3":
            pairs.record_iperf3(m, flows, got)
            return
        for src, dst in flows:
            res = got.get(src)
            if res is None:
                m.errors[(src, dst)] = "the sender did not answer"
            elif res.get("error") or not res.get("seconds"):
                m.errors[(src, dst)] = res.get("error") or "nothing sent"
            else:
                pairs.record(m, (src, dst), res)

    def full(self, m: pairs.Matrix, quick_wanted: bool) -> tuple[str, int, dict[str, str]]:
        """Every ordered pair, N-1 rounds; stops after a round where iperf3 failed on a node."""
        rounds = pairs.ring_rounds(m.names)
        done = 0
        for flows in rounds:
            self.run(flows, m)
            done += 1
            if m.unmeasured:
                break
        return (
            ("full" if not quick_wanted else "full (--quick needs 4 nodes or more)"),
            done,
            m.flagged(),
        )

    def quick(self, m: pairs.Matrix) -> tuple[str, int, dict[str, str]]:
        """The matching, then each suspect against a good node; stops as full() does."""
        matched, left = pairs.matching(m.names)
        self.run(pairs.both_ways(matched), m)
        if m.unmeasured:
            return "quick", 1, {}
        suspects = m.suspects() | set(left)
        done = 1
        for flows in pairs.second_pass(m, suspects):
            self.run(flows, m)
            done += 1
            if m.unmeasured:
                return "quick", done, {}
        flagged = {n: why for n, why in m.flagged().items() if n in suspects}  # a pass never flips
        return "quick", done, flagged


def probe_iperf3(fleet: Fleet) -> dict[str, bool]:
    return fleet.map(
        lambda s: s.run("command -v iperf3", timeout=30, label="iperf3?").rc == 0, "bandwidth: tool"
    )


def tool_for(has: dict[str, bool], want: str) -> str:
    """iperf3 where every node has it on the login PATH (--tool auto), else the builtin sender;
    --tool iperf3 on a node without it is a bad input naming the node."""
    if want == "builtin":
        return "builtin"
    lacking = sorted(n for n, ok in has.items() if not ok)
    if want == "iperf3" and lacking:
        raise InputError(
            f"--tool iperf3: no iperf3 on {', '.join(lacking[:5])}",
            hint="install it there (Debian/Ubuntu: apt install iperf3) or use --tool builtin",
        )
    return "iperf3" if has and not lacking else "builtin"


def lacking(has: dict[str, bool]) -> pairs.Fallback | None:
    """The nodes without iperf3 that made --tool auto take the builtin program, named."""
    missing = sorted(n for n, ok in has.items() if not ok)
    return pairs.Fallback({n: NOT_ON_PATH for n in missing}) if missing else None


def _measure(
    fleet: Fleet,
    addr: dict[str, str],
    opts: BandwidthOptions,
    tool: str,
    fallback: pairs.Fallback | None,
) -> BandwidthResult:
    """The mode's rounds with TOOL; when iperf3 failed a pair for a node's own reason, the
    rounds again from the start with the builtin program, the iperf3 rounds kept as the
    Fallback."""
    names = list(addr)
    quick = opts.quick and len(names) >= 4  # under 4 nodes a matching has no reference
    m = pairs.Matrix(names)
    rounds = _Rounds(fleet, addr, opts, tool)
    mode, done, flagged = rounds.quick(m) if quick else rounds.full(m, opts.quick)
    if m.unmeasured:
        fallback = pairs.Fallback.of(m, done)
        tool, m = "builtin", pairs.Matrix(names)
        rounds = _Rounds(fleet, addr, opts, tool)
        mode, done, flagged = rounds.quick(m) if quick else rounds.full(m, opts.quick)
    return BandwidthResult(
        m, mode, done, seconds=opts.seconds, flagged=flagged, tool=tool, fallback=fallback
    )


def bandwidth(opts: BandwidthOptions, settings: Settings, events: Events) -> BandwidthResult:
    opts.validate()
    _inv, hosts = select_hosts(opts.inventory, opts.limit, settings, events=events)
    if len(hosts) < 2:
        raise InputError("bandwidth needs at least 2 nodes", hint="--limit at least two nodes")
    addr = {h.name: h.address for h in hosts}
    with Fleet(hosts, settings, "bandwidth", events) as fleet:
        has = {} if opts.tool == "builtin" else probe_iperf3(fleet)
        return _measure(fleet, addr, opts, tool_for(has, opts.tool), lacking(has))
